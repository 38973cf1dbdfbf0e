"""End to end on real simulated output: ``fleetctl demo`` (real agent workers, simulated
release and servers, embedded broker) with six modules, 2 % noise, one module 1.12x slower
and an 8 % decode regression on qwen3; the report names exactly that regression and that
module, and nothing on the unchanged key (qwen35)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from controller.history import History
from controller.report import build_report
from controller.report.render import to_json, verdict_line

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_demo_acceptance_scenario(tmp_path):
    out = tmp_path / "demo"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "controller", "demo", "--devices", "6", "--noise", "0.02", "--slow", "1.12",
           "--regress", "qwen3:decode:0.08", "--models", "qwen3,qwen35", "--seed", "3", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]  # regressed -> exit 1
    history = History(out / "history.sqlite")
    try:
        rep = build_report(history, "latest")
        assert len(rep.rows) == 6 * 22
        assert [(r.module, r.model_key, r.profile, r.metric) for r in rep.regressions] == [
            ("*", "qwen3", "*", "decode_tps")], verdict_line(rep)
        assert -0.11 < (rep.regressions[0].change or 0) < -0.05
        assert [(o.module, o.model_key) for o in rep.outliers] == [("sim-06", "*")], verdict_line(rep)
        assert 0.85 < rep.outliers[0].factor < 0.93
        assert rep.verdict == "regressed"
        assert {c.status for c in rep.changes if c.model_key == "qwen35"} == {"within tolerance"}
        doc = json.loads(to_json(rep))
        assert doc["regressions"][0]["metric"] == "decode_tps" and doc["outliers"][0]["module"] == "sim-06"
    finally:
        history.close()
