"""The probe in the pipeline, against the simulator's release (real server processes, real HTTP).

The simulated server paces tokens in wall time, ``time_scale`` times faster than a module;
the probe multiplies its wall times back, so its figures are the seed's (within 3 %).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import simulator
from agent.pipeline import AgentConfig, run_pipeline
from agent.probe import FLAG
from agent.store import RunStore
from agent.tables import parse_seed
from contract.records import RunRequest
from controller.history import History
from simulator.ports import free_port

pytestmark = pytest.mark.slow
TOLERANCE = 0.03
ROOT = Path(__file__).resolve().parents[2]


def base_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("M1000_SIM_", "FLEET_"))}
    real_bin = str(Path(os.path.realpath(sys.executable)).parent)  # the release's scripts run python3 from PATH
    env["PATH"] = os.pathsep.join([real_bin, env.get("PATH", "")])
    env.update(extra or {})
    return env


def validate(base: Path, built: simulator.BuiltRelease, keys: tuple[str, ...], run_id: str, *,
             env: dict[str, str] | None = None, key_env: dict[str, dict[str, str]] | None = None, **cfg: Any):
    models = base / "models"
    if not models.exists():
        simulator.make_models(models)
    config = AgentConfig(module="sim-1", workdir=base / "work", server_port=free_port(), base_env=base_env(env),
                         key_env=key_env or {}, ready_timeout=60, benchmark_timeout=300, **cfg)
    req = RunRequest(run_id=run_id, module="sim-1", tarball=str(built.path), sha256=built.sha256,
                     release=built.version, models=keys, model_root=str(models))
    return run_pipeline(req, config), config


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("probe-sim")
    return base, simulator.build_release(base / "dist", noise=0.0, time_scale=50.0)


def test_probe_rows_match_the_seed_and_add_little_to_a_key(sim, seed_text):
    base, built = sim
    result, cfg = validate(base, built, ("qwen3",), "full")
    assert result.ok, result.progress.error
    release = [r for r in result.rows if r.source == "release"]
    probes = [r for r in result.rows if r.source == "probe"]
    assert len(release) == 11 and result.progress.outcomes[0].rows == 11
    (p,) = probes
    assert p.profile == "128:128" and p.extra["probe_ok"] == "5" and p.extra["probe_time_scale"] == "50"
    assert p.extra["probe_prompt"] == "words"  # text: the simulator has no /detokenize, w<id> words
    assert not p.flags and not any(r.flags for r in release)
    seed = {r.profile: r for r in parse_seed(seed_text)["qwen3"]}["128:128"]
    for m in ("ttft_ms", "tpot_ms", "prefill_tps", "decode_tps"):
        assert getattr(p, m) == pytest.approx(getattr(seed, m), rel=TOLERANCE), m
    # the probe's share of the key's wall time (server start to stop)
    events = RunStore(cfg.workdir).events("full")
    probe_s = next(e["duration_s"] for e in events if e["step"] == "probe" and e["status"] == "ok")
    key_s = result.progress.outcomes[0].duration_s
    print(f"\nprobe {probe_s:.2f} s of the key's {key_s:.2f} s ({probe_s / key_s:.1%})")
    assert probe_s <= 0.10 * key_s
    log = next(RunStore(cfg.workdir).logs_dir("full").glob("*-benchmark-qwen3.log")).read_text()
    assert "[agent] probe http://127.0.0.1:" in log and "128:128: TTFT" in log


def test_a_module_can_turn_the_probe_off_or_choose_profiles(sim, seed_text):
    base, built = sim
    off, _ = validate(base, built, ("qwen3",), "off", key_env={"qwen3": {"BENCH_PROFILES": "128:128,250:500"}},
                      probe=False)
    assert off.ok and [r.source for r in off.rows] == ["release", "release"]
    more, _ = validate(base, built, ("qwen3",), "more", key_env={"qwen3": {"BENCH_PROFILES": "128:128,250:500"}},
                       probe_profiles=("250:500", "500:500"), probe_requests=4)
    probes = {r.profile: r for r in more.rows if r.source == "probe"}
    assert list(probes) == ["250:500"]  # only profiles the release measured too
    seed = {r.profile: r for r in parse_seed(seed_text)["qwen3"]}["250:500"]
    assert probes["250:500"].prefix_tokens == 250 and probes["250:500"].extra["probe_ok"] == "4"
    assert probes["250:500"].ttft_ms == pytest.approx(seed.ttft_ms, rel=TOLERANCE)


def test_the_pipeline_sweeps_for_the_capacity_at_slo_within_its_budget(sim):
    base, built = sim
    res, cfg = validate(base, built, ("qwen3",), "sweep", key_env={"qwen3": {"BENCH_PROFILES": "128:128"}},
                        probe_sweep_slo="ttft_p90_ms=8000,tpot_p90_ms=60", probe_sweep_budget=20)
    assert res.ok, res.progress.error
    (cap,) = [r for r in res.rows if r.profile == "capacity:128:128"]
    assert cap.source == "probe" and cap.batch is not None and cap.batch >= 1
    assert cap.extra["sweep_stop"] in ("slo", "saturated") and "broken" in cap.extra["sweep_levels"]
    assert float(cap.extra["ttft_p90_ms"]) <= 8000 and float(cap.extra["tpot_p90_ms"]) <= 60
    events = RunStore(cfg.workdir).events("sweep")
    sweep_s = next(e["duration_s"] for e in events if e["step"] == "sweep" and e["status"] == "ok")
    assert sweep_s < 20
    log = next(RunStore(cfg.workdir).logs_dir("sweep").glob("*-benchmark-qwen3.log")).read_text()
    assert "SLO sweep 128:128: 1:met" in log and f"capacity at SLO ttft_p90_ms=8000,tpot_p90_ms=60: concurrency " \
        f"{cap.batch}" in log


def _flagged(rows) -> set[tuple[str, str]]:
    return {(r.model_key, r.profile) for r in rows if r.source == "release" and FLAG in r.flags}


def test_bench_skew_is_flagged_in_fleetctl_report_and_nothing_is_without_it(tmp_path, seed_text):
    """A release whose benchmark reports times 20 % short on qwen3 (server unchanged): its qwen3 row
    is flagged and named by ``fleetctl report``; the same release without the fault, 1 % noise,
    five seeds: no flag at all."""
    built = simulator.build_release(tmp_path / "dist", noise=0.01, time_scale=50.0)
    keys = ("qwen3", "qwen35")
    profiles = {k: {"BENCH_PROFILES": "128:128"} for k in keys}
    history = History(tmp_path / "history.sqlite")
    try:
        for seed in range(1, 6):
            clean, _ = validate(tmp_path / "clean", built, keys, f"clean-{seed}", key_env=profiles,
                                env={"M1000_SIM_SEED": str(seed)})
            assert clean.ok and len([r for r in clean.rows if r.source == "probe"]) == 2
            assert _flagged(clean.rows) == set(), [(r.model_key, r.profile, r.ttft_ms, r.tpot_ms, r.source)
                                                    for r in clean.rows]
        skewed, _ = validate(tmp_path / "skew", built, keys, "skew", key_env=profiles,
                             env={"M1000_SIM_FAULT": "bench-skew:qwen3", "M1000_SIM_SEED": "1"})
        assert skewed.ok and _flagged(skewed.rows) == {("qwen3", "128:128")}
        release = {r.model_key: r for r in skewed.rows if r.source == "release" and r.profile == "128:128"}
        seed_row = {r.profile: r for r in parse_seed(seed_text)["qwen3"]}["128:128"]
        assert seed_row.ttft_ms is not None
        assert release["qwen3"].ttft_ms == pytest.approx(0.8 * seed_row.ttft_ms, rel=TOLERANCE)  # the lie
        for run_id, rows in (("skew", skewed.rows), ("clean-5", clean.rows)):
            history.create_run(run_id, release=built.version, models=keys, modules=("sim-1",), state="done")
            history.upsert_rows(rows)
    finally:
        history.close()

    def report(run_id: str, fmt: str = "md") -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "controller", "--history", str(tmp_path / "history.sqlite"),
                               "report", run_id, "--format", fmt], capture_output=True, text=True, timeout=120,
                              cwd=ROOT, env={k: v for k, v in os.environ.items() if not k.startswith("FLEET_")})

    out = report("skew")
    assert out.returncode == 0, out.stderr
    section = out.stdout.split("## Release benchmark vs probe")[1].split("\n## ")[0]
    assert "| sim-1 | qwen3 | 128:128 | ttft_ms |" in section and "qwen35" not in section
    assert "release benchmark disagrees with the probe" in out.stdout.splitlines()[2]
    doc = json.loads(report("skew", "json").stdout)
    assert {(d["module"], d["model_key"]) for d in doc["disagreements"]} == {("sim-1", "qwen3")}
    assert all(d["change"] == pytest.approx(-0.2, abs=0.03) for d in doc["disagreements"] if d["metric"] in (
        "ttft_ms", "tpot_ms"))
    clean_doc = json.loads(report("clean-5", "json").stdout)
    assert clean_doc["disagreements"] == [] and clean_doc["probe_checked"] == 2


def test_probe_repeat_puts_intervals_in_the_rows_and_fleetctl_report_shows_them(tmp_path):
    """``probe_repeat`` (setting) and a key's ``PROBE_REPEAT`` (which wins): the per-key probe in rounds, each
    figure's 95 % interval in the probe row, and the report's **Probe intervals** section lists them."""
    built = simulator.build_release(tmp_path / "dist", noise=0.01, time_scale=50.0)
    keys = ("qwen3", "qwen35")
    key_env = {"qwen3": {"BENCH_PROFILES": "128:128", "PROBE_REPEAT": "3"},
               "qwen35": {"BENCH_PROFILES": "128:128", "PROBE_REPEAT": "many"}}
    res, cfg = validate(tmp_path, built, keys, "rounds", key_env=key_env, probe_repeat=2)
    assert res.ok, res.progress.error
    probes = {r.model_key: r for r in res.rows if r.source == "probe"}
    assert probes["qwen3"].extra["probe_repeats"] == "3" and probes["qwen35"].extra["probe_repeats"] == "2"
    low, high = (float(x) for x in probes["qwen3"].extra["ttft_p50_ms_ci95"].split(","))
    assert low < probes["qwen3"].ttft_ms < high
    assert probes["qwen3"].extra["probe_prompt"] == "words"  # the simulator has no /detokenize: w<id> text
    assert len(probes["qwen3"].extra["probe_ttft_each_ms"].split(",")) == 3 * cfg.probe_requests
    log = next(RunStore(cfg.workdir).logs_dir("rounds").glob("*-benchmark-qwen35.log")).read_text()
    assert "probe: PROBE_REPEAT='many': a whole number from 1 to 20 (the setting's 2 used)" in log
    history = History(tmp_path / "history.sqlite")
    try:
        history.create_run("rounds", release=built.version, models=keys, modules=("sim-1",), state="done")
        history.upsert_rows(res.rows)
    finally:
        history.close()
    def report(fmt: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "controller", "--history", str(tmp_path / "history.sqlite"),
                               "report", "rounds", "--format", fmt], capture_output=True, text=True, timeout=120,
                              cwd=ROOT, env={k: v for k, v in os.environ.items() if not k.startswith("FLEET_")})

    doc = json.loads(report("json").stdout)
    assert {(x["model_key"], x["figure"], x["repeats"]) for x in doc["probe_intervals"]} >= {
        ("qwen3", "ttft_p50_ms", 3), ("qwen35", "tpot_p50_ms", 2)}
    out = report("md")
    assert out.returncode == 0, out.stderr
    section = out.stdout.split("## Probe intervals")[1].split("\n## ")[0]
    assert "| sim-1 | qwen3 | 128:128 | ttft_p50_ms |" in section and "| 3 |" in section
    assert "| sim-1 | qwen35 | 128:128 | tpot_p50_ms |" in section and "| 2 |" in section
