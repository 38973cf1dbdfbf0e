"""The fleet's kernel cache through the controller (real workers, embedded broker): a canary validation on two
modules compiles and publishes, the fleet's validation after it fetches on the third module; the report and
``fleetctl cache ls`` name who compiled and who fetched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controller.history import History
from simulator.cheap import cheap_module_env
from tests.support.lab import make_lab
from tests.support.procs import leftovers

pytestmark = pytest.mark.slow


def test_a_canary_compiles_and_the_fleet_fetches(tmp_path: Path):
    from simulator import build_release

    release = build_release(tmp_path / "release", time_scale=50.0, noise=0.0, seed=3)
    lab = make_lab(tmp_path / "lab", ("filesystem://", None), 3)
    env = {**cheap_module_env(time_scale=50.0, telemetry_period=1.0), "FLEET_PROBE": "false",
           "FLEET_KERNEL_CACHE": "true"}
    lab.start(sim_env=dict.fromkeys(lab.names, env))
    try:
        r = lab.fleetctl("validate", str(release.path), "--models", "qwen3", "--devices", "sim-01,sim-02")
        assert r.returncode == 0, r.stderr
        r = lab.fleetctl("validate", str(release.path), "--models", "qwen3", "--devices", "all")
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-1000:]  # the verdict is on stdout
        h = History(lab.settings.history_path)
        canary, full = h.runs()[1], h.runs()[0]
        used = {m: p.kernel_cache.action if p.kernel_cache else None for m, p in h.progress(canary.run_id).items()}
        assert used == {"sim-01": "compiled", "sim-02": "compiled"}
        prog = h.progress(full.run_id)
        assert {m: (p.kernel_cache.action if p.kernel_cache else None, p.precompile_cached)
                for m, p in prog.items()} == {"sim-01": (None, True), "sim-02": (None, True),
                                              "sim-03": ("fetched", False)}
        fetched_rows = h.rows(full.run_id, "sim-03")
        assert {(r.precompile_source, r.precompile_s) for r in fetched_rows} == {("fetched", None)}
        assert all(r.precompile_fetch_s is not None and r.precompile_fetch_s < 1.0 for r in fetched_rows)
        notes = json.loads(lab.fleetctl("report", full.run_id, "-o", "json").stdout)["notes"]
        assert notes[0] == "kernel cache: fetched on sim-03; cached by an earlier run on sim-01, sim-02"
        notes = json.loads(lab.fleetctl("report", canary.run_id, "-o", "json").stdout)["notes"]
        assert notes[0] == "kernel cache: compiled on sim-01, sim-02 (published by sim-01, sim-02)"
        (entry,) = json.loads(lab.fleetctl("cache", "ls", "-o", "json").stdout)
        assert (entry["compiled_by"], entry["fetched_by"], entry["trusted"]) == (["sim-01", "sim-02"], ["sim-03"],
                                                                                 True)
        fetched = prog["sim-03"].kernel_cache
        assert fetched is not None and entry["archive"] == fetched.archive
        assert leftovers(lab) == []
    finally:
        lab.stop()
