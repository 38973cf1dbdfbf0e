"""Fast tier: knob specs, the fitted performance model, formatting, estimators (pure code)."""

from __future__ import annotations

import array
import hashlib
import math
import statistics

import pytest

from agent.tables import parse_seed
from contract.records import MODEL_KEYS
from simulator import SpecError, parse_faults, parse_speed, regress_spec
from simulator.fit import fit
from simulator.runtime import bench, core
from simulator.runtime.server import PrefixCache


def test_runtime_knows_the_same_model_keys_as_the_agent() -> None:
    assert tuple(MODEL_KEYS) == core.MODEL_KEYS


# ---------------------------------------------------------------- speed / fault specs

def test_speed_plain_factor_applies_to_every_throughput_metric_not_accept() -> None:
    s = parse_speed("0.9")
    assert s.factor("qwen3", "prefill") == pytest.approx(0.9)
    assert s.factor("qwen3vl", "vision") == pytest.approx(0.9)
    assert s.factor("qwen35_mtp", "accept") == 1.0


def test_speed_per_key_and_metric_and_composition() -> None:
    s = parse_speed("qwen3:decode=0.92,prefill=0.5").compose(parse_speed("0.5"))
    assert s.factor("qwen3", "decode") == pytest.approx(0.92 * 0.5)
    assert s.factor("qwen35", "decode") == pytest.approx(0.5)
    assert s.factor("qwen35", "prefill") == pytest.approx(0.25)
    assert parse_speed("qwen35_mtp=0.8").factor("qwen35_mtp", "prefill") == pytest.approx(0.8)
    assert parse_speed("qwen35_mtp:accept=0.9").factor("qwen35_mtp", "accept") == pytest.approx(0.9)
    assert parse_speed(str(s)) == s  # canonical text round-trips


@pytest.mark.parametrize(("spec", "needle"), [
    ("fast", "not a number"),
    ("0", "positive"),
    ("qwen9:decode=0.9", "unknown model key 'qwen9'"),
    ("qwen3:speed=0.9", "unknown metric 'speed'"),
    ("decode=-1", "positive"),
    ("decode=nan", "positive"),
])
def test_speed_errors_name_the_item(spec: str, needle: str) -> None:
    with pytest.raises(SpecError, match=needle) as exc:
        parse_speed(spec, "M1000_SIM_SPEED")
    assert "M1000_SIM_SPEED" in str(exc.value) and "\n" not in str(exc.value)


def test_faults_parse_and_select_per_key() -> None:
    fs = parse_faults("crash:qwen3, no-table ,crash:qwen3")
    assert [str(f) for f in fs] == ["crash:qwen3", "no-table"]
    assert core.faults_for(fs, "qwen3") == {"crash", "no-table"}
    assert core.faults_for(fs, "qwen35") == {"no-table"}
    with pytest.raises(SpecError, match="unknown fault 'explode'"):
        parse_faults("explode")
    with pytest.raises(SpecError, match="unknown model key"):
        parse_faults("hang:qwen4")


def test_lazy_jit_is_a_fault_of_one_key_and_buckets_are_powers_of_two() -> None:
    from simulator.runtime.server import jit_bucket

    fs = parse_faults("lazy-jit:qwen35")
    assert core.faults_for(fs, "qwen35") == {"lazy-jit"} and core.faults_for(fs, "qwen3") == frozenset()
    assert [jit_bucket(n) for n in (0, 1, 32, 33, 100, 128, 129, 8000)] == [32, 32, 32, 64, 128, 128, 256, 8192]


def test_env_knobs_compose_with_baked_ones() -> None:
    baked = core.Knobs(speed=parse_speed("decode=0.5"), noise=0.0, seed=1, time_scale=50,
                       faults=parse_faults("crash:qwen3"))
    k = baked.with_env({"M1000_SIM_SPEED": "0.5", "M1000_SIM_NOISE": "0.02", "M1000_SIM_SEED": "7",
                        "M1000_SIM_TIME_SCALE": "100", "M1000_SIM_FAULT": "hang:qwen35"})
    assert k.speed.factor("qwen3", "decode") == pytest.approx(0.25)
    assert (k.noise, k.seed, k.time_scale) == (0.02, 7, 100)
    assert {str(f) for f in k.faults} == {"crash:qwen3", "hang:qwen35"}
    assert core.Knobs.from_json(k.to_json()) == k
    with pytest.raises(SpecError, match="M1000_SIM_TIME_SCALE"):
        baked.with_env({"M1000_SIM_TIME_SCALE": "fast"})
    with pytest.raises(SpecError, match="M1000_SIM_NOISE"):
        baked.with_env({"M1000_SIM_NOISE": "2"})


def test_a_module_seed_mixes_with_the_release_seed() -> None:
    """``M1000_SIM_MODULE_SEED``: each release draws new noise on a module kept running, the modules still differ;
    an empty ``M1000_SIM_SEED`` overrides nothing."""
    seeds = {(r, m): core.Knobs(seed=r).with_env({"M1000_SIM_SEED": "", "M1000_SIM_MODULE_SEED": str(m)}).seed
             for r in (0, 1, 2) for m in (1, 2)}
    assert seeds[(1, 2)] == 1 * core.MODULE_SEED_MIX + 2
    assert len(set(seeds.values())) == len(seeds)
    assert core.Knobs(seed=5).with_env({"M1000_SIM_SEED": "3"}).seed == 3  # the module seed alone still overrides
    with pytest.raises(SpecError, match="M1000_SIM_MODULE_SEED"):
        core.Knobs().with_env({"M1000_SIM_MODULE_SEED": "one"})


def test_regress_spec() -> None:
    assert regress_spec("qwen3:decode:0.08") == "qwen3:decode=0.92"
    assert regress_spec("qwen35_mtp:accept:0.1") == "qwen35_mtp:accept=0.9"
    assert regress_spec("all:prefill:0.25") == "prefill=0.75"
    assert regress_spec("qwen3:decode_tps:0.08") == "qwen3:decode=0.92"  # the reports' names are aliases
    assert regress_spec("qwen3:ttft_ms:0.25") == "qwen3:prefill=0.8"  # a time 25 % longer: 1/1.25 the throughput
    for bad in ("qwen3:decode", "qwen3:decode:1.5", "qwenX:decode:0.1", "qwen3:latency:0.1", "qwen3:decode:x"):
        with pytest.raises(SpecError):
            regress_spec(bad)


# ---------------------------------------------------------------- the fitted model

@pytest.fixture(scope="module")
def fitted(seed_text: str) -> tuple[core.Model, dict]:
    model, bench_cfg = fit(seed_text)
    return core.Model(model), bench_cfg


def _plan(setup: core.Setup, **kw: object) -> core.Plan:
    args: dict = {"prompt_len": 128, "cached": 0, "max_tokens": 100, "frames": 0, "prompt_hash": "",
                  "factors": core.Factors(), "draft_tokens": None}
    args.update(kw)
    return setup.plan(**args)


def _tpot(plan: core.Plan) -> float:
    return plan.emits[-1][0] / (plan.n - 1)


def test_model_passes_through_every_sweep_row_of_the_seed(fitted, seed_text: str) -> None:
    model, _ = fitted
    for key, rows in parse_seed(seed_text).items():
        setup = model.setup(key)
        for r in rows:
            if r.table != "sweep":
                continue
            prefix = r.prefix_tokens or 0
            plan = _plan(setup, prompt_len=r.input_tokens, cached=prefix, max_tokens=r.output_tokens)
            assert plan.ttft_ms == pytest.approx(r.ttft_ms, rel=1e-9), (key, r.profile)
            assert _tpot(plan) == pytest.approx(r.tpot_ms, rel=1e-9), (key, r.profile)


def test_model_reproduces_mtp_rows_exactly(fitted, seed_text: str) -> None:
    model, _ = fitted
    for key in ("qwen35_mtp", "qwen35_fq_mtp"):
        setup = model.setup(key)
        for r in parse_seed(seed_text)[key]:
            assert r.prompt_index is not None and r.input_tokens is not None, (key, r.profile)
            ids = core.gsm8k_prompt_ids(r.prompt_index, r.input_tokens)
            plan = _plan(setup, prompt_len=r.input_tokens, max_tokens=1024, prompt_hash=core.prompt_hash(ids),
                         draft_tokens=4)
            steps = len(plan.emits)
            n = plan.n
            assert n == r.output_tokens and plan.finish == "stop"
            assert round((n - 1 - steps) / (3 * steps), 4) == r.accept_rate
            assert round(n / (4 * steps), 4) == r.accept_rate_len
            assert all(1 <= c <= 4 for _, c in plan.emits) and sum(c for _, c in plan.emits) == n - 1
            assert plan.ttft_ms == pytest.approx(r.ttft_ms, rel=0.002)
            assert _tpot(plan) == pytest.approx(r.tpot_ms, rel=1e-9)
            assert "".join(core.completion_pieces(n, plan.answer)).endswith(f"#### {r.prediction}")


SWEEP_KEYS = ("qwen3", "qwen35", "qwen35_fq", "qwen36_fq", "qwen3vl")


@pytest.mark.parametrize("key", SWEEP_KEYS)
@pytest.mark.parametrize("n", [128, 500, 2000])
def test_a_one_token_prefix_hit_moves_ttft_and_tpot_by_at_most_1_percent(fitted, key: str, n: int) -> None:
    """Prompts that share only their first token (a client's synthetic prompts, a chat template) are cold."""
    s = fitted[0].setup(key)
    cold, hit = _plan(s, prompt_len=n), _plan(s, prompt_len=n, cached=1)
    assert abs(hit.ttft_ms / cold.ttft_ms - 1) <= 0.01
    assert abs(_tpot(hit) / _tpot(cold) - 1) <= 0.01


@pytest.mark.parametrize("key", SWEEP_KEYS)
def test_a_prefix_hit_is_never_slower_than_no_cache_and_grows_smoothly(fitted, key: str) -> None:
    s = fitted[0].setup(key)
    for total in [*range(100, 3000, 37), *range(3000, 16001, 500)]:
        cold = s.prefill_ms(total, total, 0)
        step = max(1, total // 50)
        costs = [s.prefill_ms(total - k, total, k) for k in range(0, total, step)]
        assert all(c <= cold * (1 + 1e-12) for c in costs), (key, total)
        pairs = list(zip(costs, costs[1:], strict=False))
        assert all(b <= a * (1 + 1e-12) for a, b in pairs), (key, total)  # more cached: not slower
        jumps = [abs(b - a) / cold for a, b in pairs]
        assert max(jumps, default=0) <= 0.06, (key, total)  # 2 % more of the prompt cached: no jump


def test_mtp_answer_of_exactly_max_tokens_finishes_with_length(fitted, seed_text: str) -> None:
    setup = fitted[0].setup("qwen35_mtp")
    r = parse_seed(seed_text)["qwen35_mtp"][0]
    assert r.prompt_index is not None and r.input_tokens is not None and r.output_tokens is not None
    ids = core.gsm8k_prompt_ids(r.prompt_index, r.input_tokens)
    args = {"prompt_len": r.input_tokens, "prompt_hash": core.prompt_hash(ids), "draft_tokens": 4}
    exact = _plan(setup, max_tokens=r.output_tokens, **args)
    assert (exact.n, exact.finish) == (r.output_tokens, "length")
    assert "".join(core.completion_pieces(exact.n, exact.answer)).endswith(f"#### {r.prediction}")
    longer = _plan(setup, max_tokens=r.output_tokens + 1, **args)
    assert (longer.n, longer.finish) == (r.output_tokens, "stop")
    shorter = _plan(setup, max_tokens=r.output_tokens - 1, **args)
    assert (shorter.n, shorter.finish, shorter.answer) == (r.output_tokens - 1, "length", None)


def test_vision_model_reproduces_fps_prefill_and_decode(fitted, seed_text: str) -> None:
    model, cfg = fitted
    setup = model.setup("qwen3vl")
    lo, hi = cfg["vision"]["frames_lo"], cfg["vision"]["frames_hi"]
    for r in parse_seed(seed_text)["qwen3vl"]:
        if r.table != "vision":
            continue
        assert r.input_tokens is not None and r.prefill_len is not None, r.profile
        cached = r.input_tokens - r.prefill_len
        a = _plan(setup, prompt_len=r.input_tokens, cached=cached, frames=lo, max_tokens=1)
        b = _plan(setup, prompt_len=r.input_tokens, cached=cached, frames=hi, max_tokens=50)
        frame_ms = (b.ttft_ms - a.ttft_ms) / (hi - lo)
        assert 1000 / frame_ms == pytest.approx(r.vision_fps, rel=1e-9)
        assert r.prefill_len / (a.ttft_ms - lo * frame_ms) * 1000 == pytest.approx(r.prefill_tps, rel=1e-9)
        assert 1000 / _tpot(b) == pytest.approx(r.decode_tps, rel=1e-9)


def test_speed_factors_scale_the_plan(fitted) -> None:
    model, _ = fitted
    s = model.setup("qwen3")
    base = _plan(s)
    slow = _plan(s, factors=core.Factors(prefill=0.5, decode=0.8))
    assert slow.ttft_ms == pytest.approx(base.ttft_ms / 0.5)
    assert _tpot(slow) == pytest.approx(_tpot(base) / 0.8)
    mtp = model.setup("qwen35_mtp")
    a = _plan(mtp, prompt_len=900, max_tokens=200, draft_tokens=4)
    b = _plan(mtp, prompt_len=900, max_tokens=200, draft_tokens=4, factors=core.Factors(accept=0.8))
    assert len(b.emits) > len(a.emits)  # lower acceptance: more verify steps for the same tokens


def test_vision_refused_by_text_only_models(fitted) -> None:
    model, _ = fitted
    with pytest.raises(core.PlanError, match="does not take images"):
        _plan(model.setup("qwen3"), frames=2)


def test_noise_is_seeded_lognormal_and_off_at_zero() -> None:
    assert core.noise_factors(0.0, 1, 5) == (1.0, 1.0, 1.0)
    assert core.noise_factors(0.05, 1, 5) == core.noise_factors(0.05, 1, 5)
    assert core.noise_factors(0.05, 1, 5) != core.noise_factors(0.05, 2, 5)
    draws = [math.log(core.noise_factors(0.05, 3, i)[0]) for i in range(2000)]
    assert statistics.pstdev(draws) == pytest.approx(0.05, rel=0.1)
    assert abs(statistics.fmean(draws)) < 0.005


def test_spec_steps_bounds() -> None:
    assert core.spec_steps(156, 0.8125, 4) == 48
    assert core.spec_steps(10, 1.0, 4) == 3  # never more than 4 tokens per step
    assert core.spec_steps(10, 0.01, 4) == 9  # never fewer than 1 token per step
    assert core.spread(155, 48) == sorted(core.spread(155, 48), key=lambda _: 0)
    assert sum(core.spread(155, 48)) == 155


def test_interp_log_and_extrapolation() -> None:
    pts = [[100.0, 1.0], [1000.0, 2.0]]
    assert core.interp(pts, math.sqrt(100 * 1000), log=True) == pytest.approx(1.5)
    assert core.interp(pts, 10_000) == 2.0
    assert core.interp(pts, 1900, extrapolate=True) == pytest.approx(3.0)


@pytest.mark.parametrize(("value", "decimals", "text"), [
    (77.03, 3, "77.03"), (9442.0, 2, "9442"), (0.875, 4, "0.875"), (16.0, 3, "16"), (0.05, 3, "0.05"),
    (24.0, 2, "24"), (1981.2284, 3, "1981.228"), (0.0, 3, "0"),
])
def test_number_format_matches_the_seed(value: float, decimals: int, text: str) -> None:
    assert core.fmt_num(value, decimals) == text


# ---------------------------------------------------------------- server and benchmark pieces

def test_prefix_cache_longest_match_and_lru_capacity() -> None:
    c = PrefixCache(10)
    c.insert((1, 2, 3, 4))
    assert c.match((1, 2, 3, 9)) == 3
    assert c.match((1, 2, 3, 4)) == 3  # at least one token is always computed
    c.insert((5, 6, 7, 8, 9, 10, 11))
    assert c.size <= 10 and c.match((1, 2, 3, 4, 5)) == 0  # evicted, least recently used
    assert c.match((5, 6, 7)) == 2


def test_theil_sen_ignores_a_late_point_and_pairs_must_agree() -> None:
    pts = [(k, 40.0 * k) for k in range(1, 60)]
    pts[30] = (31, 40.0 * 31 + 500)  # one late wake-up
    pts[-1] = (59, 40.0 * 59 + 300)  # and a late last token
    assert bench.theil_sen(pts) == pytest.approx(40.0)
    assert bench.agreeing_pair([100.0, 130.0, 100.5]) == (100.0, 100.5)
    assert bench.agreeing_pair([100.0, 130.0]) is None


def test_benchmark_ttft_stops_when_two_agree() -> None:
    b = bench.Bench(key="qwen3", cfg={}, ctx_k=16, draft=4, output_len=100, repeats=4)
    m = bench.Measurement(ttft_ms=110.0, tokens=2, arrivals=((2, 40.0),), cached=0, text="")
    seq = iter([100.0, 100.4, 999.0])
    calls: list[int] = []

    def again(r: int) -> bench.Measurement:
        calls.append(r)
        return bench.Measurement(ttft_ms=next(seq), tokens=1, arrivals=(), cached=0, text="")

    assert b.ttft(m, again) == pytest.approx(100.2)
    assert calls == [1, 2]


def test_render_matches_seed_shapes_and_parses_back(fitted, seed_text: str) -> None:
    """Tables rendered from the seed's own cells parse to the same keys, rows and values."""
    _, cfg = fitted
    seed = parse_seed(seed_text)
    text = ""
    for key, tables in cfg["keys"].items():
        b = bench.Bench(key=key, cfg=cfg, ctx_k=16, draft=4, output_len=100)
        rows = []
        for t in tables["tables"]:
            for line in _seed_rows(seed_text, t["columns"], t["title"]):
                rows.append(bench.Row(t["kind"], dict(zip(t["columns"], line, strict=True))))
        text += b.render(rows, frozenset())
    got = parse_seed(text)
    assert {k: len(v) for k, v in got.items()} == {k: len(v) for k, v in seed.items()}
    assert got == seed


def _seed_rows(seed_text: str, columns: list[str], title: str) -> list[list[str]]:
    lines = seed_text.splitlines()
    header = "\t".join(columns)
    start = max(i for i, line in enumerate(lines) if line == title) if title else None  # the table's own title
    for i, line in enumerate(lines):
        if line == header and (start is None or i > start):
            out = []
            for row in lines[i + 1:]:
                if not row.strip():
                    break
                out.append(row.split("\t"))
            return out
    raise AssertionError(f"no table {title!r}")


def test_bad_table_fault_breaks_one_row() -> None:
    from agent.tables import TableError, parse_tables

    cfg = {"keys": {"qwen3": {"tables": [{"kind": "sweep", "title": "T", "columns": ["Model", "Size", "Input(tokens)",
                                                                                    "Batch"]}]}}}
    b = bench.Bench(key="qwen3", cfg=cfg, ctx_k=16, draft=4, output_len=100)
    rows = [bench.Row("sweep", {"Model": "Q", "Size": "s", "Input(tokens)": str(i), "Batch": "1"}) for i in range(4)]
    assert len(parse_tables(b.render(rows, frozenset()))[0].rows) == 4
    with pytest.raises(TableError, match="row has 2 cells"):
        parse_tables(b.render(rows, frozenset({"bad-table"})))


def test_no_decode_fault_leaves_the_decode_column_out() -> None:
    from agent.tables import parse_tables

    cols = ["Model", "Size", "Input(tokens)", "Decode(tps)", "TPOT(ms)"]
    cfg = {"keys": {"qwen3": {"tables": [{"kind": "sweep", "title": "T", "columns": cols}]}}}
    b = bench.Bench(key="qwen3", cfg=cfg, ctx_k=16, draft=4, output_len=100)
    rows = [bench.Row("sweep", {"Model": "Q", "Size": "s", "Input(tokens)": str(i), "Decode(tps)": "25.0",
                                "TPOT(ms)": "40.0"}) for i in range(1, 3)]
    (whole,) = parse_tables(b.render(rows, frozenset()))
    (dropped,) = parse_tables(b.render(rows, frozenset({"no-decode"})))
    assert "Decode(tps)" in whole.columns and "Decode(tps)" not in dropped.columns
    assert [r.decode_tps for r in dropped.rows] == [None, None] and [r.tpot_ms for r in dropped.rows] == [40.0, 40.0]


# ---------------------------------------------------------------- properties

from hypothesis import example, given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_entries = st.lists(st.tuples(st.sampled_from(("",) + core.MODEL_KEYS), st.sampled_from(core.SPEED_METRICS),
                              st.floats(min_value=0.01, max_value=100, allow_nan=False)), max_size=6)


@given(_entries)
@example([("", "decode", 1.2345678)] * 6)  # six factors of 7 digits: printed with :g they drifted by 1.5e-5
def test_speed_text_round_trips(entries: list[tuple[str, str, float]]) -> None:
    s = core.Speed(tuple(entries))
    back = parse_speed(str(s))
    for key in core.MODEL_KEYS:
        for metric in ("prefill", "decode", "accept", "vision"):
            assert back.factor(key, metric) == s.factor(key, metric)  # exact: the text carries every digit


@given(st.integers(min_value=2, max_value=2000), st.floats(min_value=0.01, max_value=1.0))
def test_spec_steps_always_feasible(n: int, accept: float) -> None:
    steps = core.spec_steps(n, accept, 4)
    counts = core.spread(n - 1, steps)
    assert sum(counts) == n - 1 and all(1 <= c <= 4 for c in counts)


@given(st.integers(min_value=0, max_value=20000))
def test_random_ids_are_in_vocab_and_deterministic(n: int) -> None:
    ids = core.random_ids("t", n)
    assert len(ids) == n and ids == core.random_ids("t", n)
    raw = array.array("I", hashlib.shake_128(b"t").digest(4 * n))  # the ids as first made (fit.py's prompt hashes)
    assert ids == [1000 + v % (core.VOCAB_SIZE - 1000) for v in raw]
    assert all(1000 <= i < core.VOCAB_SIZE for i in ids)
