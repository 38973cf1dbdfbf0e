"""Where the summary goes: the run's progress on the module, its own key on the broker (embedded),
the controller's sync into a history table of its own (fast tier)."""

from __future__ import annotations

import time
from pathlib import Path

from agent.telemetry import summarize
from contract.kv import KV
from contract.records import KeyOutcome, RunProgress, RunState
from controller.fleet import Fleet
from controller.history import History
from controller.settings import ControllerSettings
from tests.metrics.fleetfiles import device_sample


def summary(run_id: str, module: str):
    samples = [device_sample(run_id, module, key, sm_clock_mhz=clock)
               for key in ("qwen3", "qwen35") for clock in (1400.0, 1455.0, 1500.0)]
    return summarize(samples, run_id=run_id, module=module, tool="mthreads-gmi", notes=["a note"])


def test_summary_travels_under_its_own_key_into_the_history(tmp_path: Path) -> None:
    settings = ControllerSettings(broker_url="filesystem://", data_dir=tmp_path / "fleet",
                                  history=tmp_path / "history.sqlite")
    history = History(tmp_path / "history.sqlite")
    fleet = Fleet(settings, history)
    try:
        history.create_run("run-1", release="1.4.1", models=["qwen3", "qwen35"], modules=["m1", "m2"])
        kv = fleet.kv
        s = summary("run-1", "m1")
        running = RunProgress(run_id="run-1", module="m1", state=RunState.BENCHMARKING, updated_at=time.time(),
                              started_at=time.time())
        kv.put_progress(running)
        fleet.sync("run-1")
        assert history.telemetry("run-1") == {}  # nothing until the module's part ends
        done = running.model_copy(update={"state": RunState.DONE, "telemetry": s, "updated_at": time.time(),
                                          "finished_at": time.time(),  # a final state (the run started, and ended)
                                          "outcomes": (KeyOutcome(model_key="qwen3", status="passed"),)})
        kv.put_progress(done)
        raw = kv.get("m1000-fleet:progress:run-1:m1")
        assert "telemetry" not in raw  # progress stays small and readable by older controllers
        assert kv.telemetry("run-1", "m1") == s
        assert kv.telemetry("run-1", "m2") is None
        fleet.sync("run-1")
        got = history.telemetry("run-1")
        assert list(got) == ["m1"] and got["m1"] == s
        assert got["m1"].for_key("qwen3")[0].fields["sm_clock_mhz"].p95 == 1500
        history.upsert_telemetry(s)  # idempotent
        assert len(history.telemetry("run-1")) == 1
    finally:
        fleet.close()
        history.close()


def test_kv_reads_an_unreadable_summary_as_absent(tmp_path: Path) -> None:
    from contract.celery_app import make_app

    app = make_app(ControllerSettings(broker_url="filesystem://", data_dir=tmp_path))
    kv = KV(app)
    kv.put("m1000-fleet:telemetry:r:m", {"schema_version": 1, "run_id": "r"})
    assert kv.telemetry("r", "m") is None
