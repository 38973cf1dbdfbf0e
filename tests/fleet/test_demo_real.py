"""`fleetctl demo --real 1`: a real-engine module (transformers serve on this CPU) beside a simulated one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.support.engine import engine_python
from tests.support.procs import env_has

pytestmark = pytest.mark.slow


def test_demo_with_a_real_engine_module(tmp_path: Path):
    py = engine_python()
    if py is None:
        pytest.skip("needs torch + transformers[serving]: .venv-engine (make engine; torch 2.13.0 CPU wheel on disk)")
    out = tmp_path / "demo"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env.update({"M1000_ENGINE_PYTHON": str(py), "OMP_NUM_THREADS": "1"})
    r = subprocess.run([sys.executable, "-m", "controller", "demo", "--devices", "1", "--real", "1", "--models",
                        "qwen3", "--time-scale", "1000", "--out", str(out)], capture_output=True, text=True, env=env,
                       timeout=480)
    assert r.stdout.count("verdict:") == 2, r.stderr[-3000:]
    assert "sim-01: done, ok" in r.stderr and r.stderr.count("real-01: done, ok, 3 rows") == 2, r.stderr[-3000:]
    report = subprocess.run([sys.executable, "-m", "controller", "--history", str(out / "history.sqlite"), "report",
                             "latest"], capture_output=True, text=True, env=env, timeout=120)
    assert "(1.4.1-engine vs baseline:1.4.1-engine:v1)" in report.stdout, report.stdout[:2000]
    assert "real-01" in report.stdout or "1 module(s)" in report.stdout
    survivors = [p for p in psutil.process_iter() if env_has(p, str(out))]
    assert survivors == []


@pytest.mark.llama
def test_demo_with_two_llama_cpp_modules_passes_an_unchanged_release_on_all_seven_keys(tmp_path: Path):
    from simulator.engine.llamacpp import wait_built

    if engine_python() is None or wait_built(2400) is None:
        pytest.skip("needs .venv-engine (the converter's torch + transformers) and llama-server: make engine")
    out = tmp_path / "demo"
    # no M1000_ENGINE_PYTHON: the demo finds .venv-engine beside the repository itself
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEET_", "M1000_ENGINE_"))}
    r = subprocess.run([sys.executable, "-m", "controller", "demo", "--devices", "1", "--real", "2", "--engine",
                        "llama.cpp", "--models", "all", "--time-scale", "1000", "--out", str(out)],
                       capture_output=True, text=True, env=env, timeout=900)
    assert r.stdout.count("verdict:") == 2, r.stderr[-3000:]
    # an unchanged release judged against its own reference run a minute before, on this loaded CPU: a pass (its
    # findings inside the two runs' own spread are not significant; issue 46: 24 "regressions" down to -95 %)
    (line,) = [x for x in r.stdout.splitlines() if "(1.4.1-llama vs baseline:1.4.1-llama:v1)" in x]
    assert line.startswith("verdict: pass - PASS"), line
    assert "real engine: llama-server" in r.stderr, r.stderr[-3000:]
    for name in ("real-01", "real-02"):
        assert r.stderr.count(f"{name}: done, ok, 21 rows") == 2, r.stderr[-3000:]  # 7 keys, both runs
        assert r.stderr.count(f"{name}: done; keys 7/7, 100%") == 2, r.stderr[-3000:]
    report = subprocess.run([sys.executable, "-m", "controller", "--history", str(out / "history.sqlite"), "report",
                             "latest"], capture_output=True, text=True, env=env, timeout=120)
    assert "(1.4.1-llama vs baseline:1.4.1-llama:v1)" in report.stdout, report.stdout[:2000]
    assert "42 result rows" in r.stdout  # 2 modules x 21 rows of the judged run
    survivors = [p for p in psutil.process_iter() if env_has(p, str(out))]
    assert survivors == []
