"""``fleetctl retry RUN --failed-only`` on real workers (embedded broker): each module re-runs only what did not
pass there (issue 27: it re-ran the union of the failed keys on every failed module, a passed key too)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from controller.history import History
from tests.support.lab import make_lab
from tests.support.procs import leftovers

pytestmark = pytest.mark.slow


def test_retry_failed_only_runs_on_each_module_the_keys_that_did_not_pass_there(tmp_path: Path):
    from simulator import build_release

    release = build_release(tmp_path / "release", time_scale=1000.0, noise=0.0, seed=3)
    lab = make_lab(tmp_path / "lab", ("filesystem://", None), 2)
    # sim-01's server for qwen35 does not start, sim-02's for qwen3: each module fails the key the other passes
    lab.start(sim_env={"sim-01": {"M1000_SIM_FAULT": "start-fail:qwen35"},
                       "sim-02": {"M1000_SIM_FAULT": "start-fail:qwen3"}})
    try:
        r = lab.fleetctl("validate", str(release.path), "--models", "qwen3,qwen35")
        assert r.returncode == 1, r.stderr
        h = History(lab.settings.history_path)
        first = h.runs()[0]
        outcomes = {m: {o.model_key: o.status for o in p.outcomes} for m, p in h.progress(first.run_id).items()}
        assert outcomes == {"sim-01": {"qwen3": "passed", "qwen35": "failed"},
                            "sim-02": {"qwen3": "failed", "qwen35": "passed"}}
        lab.stop()
        lab.start()  # the faults are gone: what is retried passes
        r = lab.fleetctl("retry", first.run_id, "--failed-only")
        assert r.returncode in (0, 1), r.stderr
        second = h.runs()[0]
        assert second.run_id != first.run_id and second.models == ("qwen3", "qwen35")
        prog = h.progress(second.run_id)
        assert {m: [o.model_key for o in p.outcomes] for m, p in prog.items()} == {"sim-01": ["qwen35"],
                                                                                    "sim-02": ["qwen3"]}
        assert second.module_models == {"sim-01": ("qwen35",), "sim-02": ("qwen3",)}
        assert {m: (p.state.value, p.keys_total) for m, p in prog.items()} == {"sim-01": ("done", 1),
                                                                                "sim-02": ("done", 1)}
        assert {(x.module, x.model_key) for x in h.rows(second.run_id)} == {("sim-01", "qwen35"), ("sim-02", "qwen3")}
        rep = lab.fleetctl("report", second.run_id, "-o", "json")
        assert not any(n.startswith("no results for") for n in json.loads(rep.stdout)["notes"]), rep.stdout
        assert leftovers(lab) == []
    finally:
        lab.stop()
