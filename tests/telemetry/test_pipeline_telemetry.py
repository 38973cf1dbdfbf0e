"""The sampler inside a whole run (hand-made release, real processes): samples tagged by step and
key, and a hanging or missing device tool neither slows nor fails the run (slow tier)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agent.pipeline import RunResult, run_pipeline
from agent.store import RunStore
from agent.telemetry import SAMPLES_FILE, TelemetryConfig, read_samples

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_leftovers")]
FIX = Path(__file__).resolve().parents[1] / "fixtures"
ROW = ",".join((FIX / "h200" / "query.csv").read_text().splitlines()[2].split(",")[:17])  # our 17 columns


def tool(path: Path, body: str) -> str:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def test_samples_follow_the_steps_and_keys(tmp_path, make_config, make_request):
    smi = tool(tmp_path / "nvidia-smi", f"echo '{ROW}'\n")
    cfg = make_config(telemetry=TelemetryConfig(period_s=0.05, tool=smi))
    result = run_pipeline(make_request(("qwen3", "qwen35")), cfg)
    assert result.ok
    samples = list(read_samples(cfg.workdir / "runs" / "r1" / SAMPLES_FILE))
    steps = {(s.step, s.model_key) for s in samples}
    assert {("benchmark", "qwen3"), ("benchmark", "qwen35")} <= steps
    assert any(s.model_key is None and s.step in ("precompile", "generate", "environment", "fetch", "unpack")
               for s in samples)
    assert all(s.run_id == "r1" and s.module == "m-test" and s.sm_clock_mhz == 795 for s in samples)
    assert not [e for e in RunStore(cfg.workdir).events("r1") if e["step"] == "telemetry"]


def _timed(cfg, request) -> tuple[float, RunResult]:
    t0 = time.monotonic()
    result = run_pipeline(request, cfg)
    return time.monotonic() - t0, result


def test_a_hanging_or_missing_tool_neither_slows_nor_fails_the_run(tmp_path, make_config, make_request):
    hang = tool(tmp_path / "mthreads-gmi", "exec sleep 60\n")
    keys = ("qwen3", "qwen35")
    base, ok = _timed(make_config(telemetry=TelemetryConfig(enabled=False)), make_request(keys, run_id="off"))
    hung, res_h = _timed(make_config(telemetry=TelemetryConfig(period_s=0.2, timeout_s=0.3, tool=hang)),
                         make_request(keys, run_id="hang"))
    gone, res_m = _timed(make_config(telemetry=TelemetryConfig(tool=str(tmp_path / "absent-gmi"))),
                         make_request(keys, run_id="missing"))
    assert ok.ok and res_h.ok and res_m.ok
    # the run never waits on the tool: a hung call is killed in the sampler's thread
    assert hung < base + 2.0 and gone < base + 2.0, (base, hung, gone)
    store = RunStore(make_config().workdir)
    ev = {r: [e for e in store.events(r) if e["step"] == "telemetry"] for r in ("hang", "missing")}
    assert [e["status"] for e in ev["hang"]] == ["timeout"]  # recorded once however often it hung
    assert "did not answer within 0.3 s" in ev["hang"][0]["message"]
    assert [e["status"] for e in ev["missing"]] == ["unavailable"]
    assert "absent-gmi not found" in ev["missing"][0]["message"]


def test_release_rows_carry_the_energy_of_their_benchmark_window(tmp_path, make_config, make_request):
    smi = tool(tmp_path / "nvidia-smi", f"echo '{ROW}'\n")  # a constant 84.27 W, 0 % busy
    # the window lasts ~0.3 s here: a few samples (the 20-sample rule has its own test in test_energy)
    cfg = make_config(telemetry=TelemetryConfig(period_s=0.05, tool=smi, min_samples=2))
    assert run_pipeline(make_request(("qwen3",)), cfg).ok
    rows = RunStore(cfg.workdir).rows("r1")
    assert rows and all(r.energy is not None for r in rows)
    w = rows[0].energy
    assert w is not None and w.source == "samples" and w.note == "" and w.coverage == 1.0
    tokens = sum(r.measured_output or r.output_tokens or 0 for r in rows)
    assert w.output_tokens == tokens
    # idle: measured with the server up, sampled fast over a settled window (the tool's power is constant)
    assert w.idle_settled is True and w.idle_spread_w == 0.0 and w.idle_samples >= 5
    assert w.idle_settle_s is not None and w.idle_settle_s < 5
    for r in rows:  # one window per key: every row carries its figures
        assert r.energy == w and r.avg_power_w == 84.27 and r.idle_power_w == 84.27
        assert r.energy_j == pytest.approx(84.27 * w.window_s, rel=1e-5)
        assert r.energy_above_idle_j == pytest.approx(0.0, abs=1e-3)
        assert r.j_per_token == pytest.approx(84.27 * w.window_s / tokens, rel=1e-5)
    log = next((cfg.workdir / "runs" / "r1").rglob("*benchmark*qwen3*.log")).read_text()
    assert "energy over the benchmark window: " in log
