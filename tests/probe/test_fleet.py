"""A simulated fleet (real Celery workers, embedded broker) validates a release whose benchmark
lies on one module's qwen3 (fault ``bench-skew``): ``fleetctl report`` names that module and
key, and nothing else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.lab import make_lab

pytestmark = pytest.mark.slow


def test_bench_skew_on_one_module_is_named_by_fleetctl_report(tmp_path: Path) -> None:
    from simulator import build_release

    release = build_release(tmp_path / "release", time_scale=50.0, noise=0.0)
    lab = make_lab(tmp_path / "lab", ("filesystem://", None), 2)
    inventory = (tmp_path / "lab" / "inventory.toml").read_text()
    # every module runs only the 128:128 profile of each key: short, and the probe's default profile
    (tmp_path / "lab" / "inventory.toml").write_text(
        inventory.replace('labels = {', 'env = { BENCH_PROFILES = "128:128" }\nlabels = {'))
    try:
        lab.start(sim_env={"sim-01": {"M1000_SIM_FAULT": "bench-skew:qwen3"}})
        run = lab.fleetctl("validate", str(release.path), "--models", "qwen3,qwen35", "--devices", "all",
                           "--run-id", "skew-run")
        assert run.returncode in (0, 1), run.stdout[-2000:] + run.stderr[-2000:]
        rep = lab.fleetctl("report", "skew-run", "--format", "json")
        assert rep.returncode == 0, rep.stderr
        doc = json.loads(rep.stdout)
        assert {(d["module"], d["model_key"]) for d in doc["disagreements"]} == {("sim-01", "qwen3")}
        assert doc["probe_checked"] == 4  # two modules x two keys, 128:128 each
        assert "release benchmark disagrees with the probe" in doc["verdict_line"]
        md = lab.fleetctl("report", "skew-run")
        assert "| sim-01 | qwen3 | 128:128 | ttft_ms |" in md.stdout
        rows = lab.fleetctl("results", "skew-run", "--format", "json")
        flagged = {(r["module"], r["model_key"]) for r in json.loads(rows.stdout)
                   if "release_benchmark_disagrees" in r["flags"]}
        assert flagged == {("sim-01", "qwen3")}
    finally:
        lab.stop()
