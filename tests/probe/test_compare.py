"""Probe rows and the cross-check with the release's rows, by hand."""

from __future__ import annotations

import pytest

from agent.probe.compare import FLAG, cross_check, probe_row
from agent.probe.records import LoadShape, ProfileResult, Stat
from contract.records import ResultRow


def release_row(profile: str = "128:128", **kw: float) -> ResultRow:
    values = {"ttft_ms": 2000.0, "tpot_ms": 40.0, "prefill_tps": 64.0, "decode_tps": 25.0, **kw}
    return ResultRow(run_id="r", module="m1", release="1.4.2", model_key="qwen3", table="sweep", profile=profile,
                     model="Qwen3", size="30b_a3b", prefill_len=128, ctx_k=16, batch=1, nchip=1, input_tokens=128,
                     output_tokens=100, **values)


def result(ttft: float = 2000.0, tpot: float = 40.0, **kw: object) -> ProfileResult:
    def s(v: float) -> Stat:
        return Stat(n=3, mean=v, p50=v, p90=v * 1.1, p99=v * 1.2)
    values: dict[str, object] = {
        "profile": "128:128", "prefill_len": 128, "input_len": 128, "output_len": 100, "api": "completions",
        "load": LoadShape(), "requests": 3, "ok": 3, "ttft_ms": s(ttft), "tpot_ms": s(tpot), "e2e_ms": s(6000),
        "output_tokens": 300, "cached_tokens": 0.0, "output_throughput_tps": 16.6, "time_scale": 50.0}
    values.update(kw)
    return ProfileResult(**values)  # type: ignore[arg-type]


def test_a_probe_row_has_the_release_rows_identity_and_the_seeds_definitions():
    p = probe_row(result(ttft=2000.0, tpot=40.0), release_row())
    assert p.source == "probe"
    assert p.identity == ("r", "m1", "qwen3", "128:128", "probe")
    assert p.identity[:4] == release_row().identity[:4] and release_row().identity[4] == "release"
    assert (p.model, p.size, p.ctx_k, p.nchip, p.batch) == ("Qwen3", "30b_a3b", 16, 1, 1)
    assert p.ttft_ms == 2000.0 and p.tpot_ms == 40.0
    assert p.prefill_tps == pytest.approx(128 / 2000 * 1000)  # 64 tok/s
    assert p.decode_tps == pytest.approx(25.0)  # 1000 / 40 ms
    assert p.measured_output == 100 and p.prefix_tokens == 0
    assert p.extra["ttft_p90_ms"] == "2200" and p.extra["probe_requests"] == "3"
    assert p.extra["probe_time_scale"] == "50" and p.flags == ()


def test_a_probe_row_with_errors_says_so():
    p = probe_row(result(ok=2, errors={"timeout": 1}), release_row())
    assert p.flags == ("probe_errors",) and p.extra["probe_errors"] == "timeout=1"


def test_figures_beyond_the_tolerance_flag_the_release_row():
    rel = [release_row("128:128", ttft_ms=1600.0, prefill_tps=80.0), release_row("250:250")]
    probe = [probe_row(result(), rel[0]), probe_row(result().model_copy(update={"profile": "250:250"}), rel[1])]
    rows, found = cross_check(rel, probe, tolerance=0.05)
    assert rows[0].flags == (FLAG,) and rows[1].flags == ()
    # TTFT 1600 vs 2000: -20 %; prefill 80 vs 64: +25 %; TPOT and decode agree
    assert [(d.metric, round(d.change, 4)) for d in found] == [("ttft_ms", -0.2), ("prefill_tps", 0.25)]
    assert found[0].one_line() == "qwen3 128:128 ttft_ms: release 1600, probe 2000 (-20.0%)"


def test_within_tolerance_or_without_a_probe_row_nothing_is_flagged():
    rel = [release_row(ttft_ms=2090.0, prefill_tps=61.2), release_row("250:250", ttft_ms=1.0)]
    rows, found = cross_check(rel, [probe_row(result(), rel[0])], tolerance=0.05)  # +4.5 %: within 5 %
    assert found == [] and all(r.flags == () for r in rows)
    rows, found = cross_check(rel, [probe_row(result(), rel[0])], tolerance=0.04)
    assert [d.metric for d in found] == ["ttft_ms", "prefill_tps"] and rows[0].flags == (FLAG,)
