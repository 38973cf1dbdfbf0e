"""``fleetctl devices reset MODULE``: a module bad by failed runs takes work again; one line, an event in
the history."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from contract.celery_app import make_app
from contract.kv import KV
from contract.records import Heartbeat, RunProgress, RunState, StepError
from contract.settings import BrokerSettings
from controller.history import RESET_EVENT, History
from tests.support.cli import one_line, run_main


def failed_runs(env: Path, n: int) -> None:
    h = History(env / "history.sqlite")
    for i in range(n):
        h.create_run(f"r-{i}", release="1.4.2", models=["qwen3"], modules=["m1"])
        now = time.time()
        h.upsert_progress(RunProgress(run_id=f"r-{i}", module="m1", release="1.4.2", state=RunState.FAILED,
                                      step="benchmark", keys_total=1, started_at=now - 5, updated_at=now,
                                      finished_at=now, error=StepError(step="benchmark", message="boom")))
    h.close()


def beat(env: Path) -> None:
    app = make_app(BrokerSettings(broker_url="filesystem://", data_dir=env / "fleet"))
    KV(app).put_heartbeat(Heartbeat(module="m1", agent_version="t", ts=time.time()))
    app.close()


def devices(capsys: pytest.CaptureFixture[str]) -> dict[str, dict]:
    code, out, err = run_main(capsys, "devices", "-o", "json")
    assert code == 0, err
    return {d["module"]: d for d in json.loads(out)}


def test_reset_makes_a_bad_module_take_work_again(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    failed_runs(env, 3)
    beat(env)
    d = devices(capsys)["m1"]
    assert d["state"] == "bad" and "`fleetctl devices reset m1`" in d["reason"], d
    code, out, err = run_main(capsys, "devices", "reset", "m1")
    assert code == 0, err
    assert out.strip() == f"m1: 3 failed run(s) in a row cleared (recorded in {env / 'history.sqlite'})"
    assert err == ""
    assert devices(capsys)["m1"]["state"] == "idle"
    h = History(env / "history.sqlite")
    assert [m for _, m in h.module_events("m1")] == [f"{RESET_EVENT}: 3 failed run(s) in a row cleared"]


def test_reset_of_an_unknown_module_is_one_line(env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run_main(capsys, "devices", "reset", "m9")
    assert code == 2
    assert one_line(err) == f"fleetctl: error: no module 'm9' in {env / 'inv.toml'}"


def test_a_failed_golden_check_makes_a_module_bad_until_reset_with_no_cooldown(env: Path,
                                                                               capsys: pytest.CaptureFixture[str]):
    from controller.history import GOLDEN_DRIFT_EVENT

    failed_runs(env, 0)  # the history, no runs
    h = History(env / "history.sqlite")
    h.add_module_event("m1", f"{RESET_EVENT}: 0 failed run(s) in a row cleared")
    time.sleep(0.01)
    h.add_module_event("m1", f"{GOLDEN_DRIFT_EVENT}: m1 drifted: qwen3 decode_tps -9.8% against its own golden "
                             "history (2 earlier checks), beyond 3% (run g-3)")
    h.close()
    beat(env)
    d = devices(capsys)["m1"]
    assert d["state"] == "bad"
    assert d["reason"] == ("golden check: m1 drifted: qwen3 decode_tps -9.8% against its own golden history (2 "
                           "earlier checks), beyond 3% (run g-3); takes work again after `fleetctl devices reset m1`")
    code, out, _ = run_main(capsys, "devices", "reset", "m1")
    assert code == 0 and out.strip() == (f"m1: 0 failed run(s) in a row cleared, its failed golden check too "
                                         f"(recorded in {env / 'history.sqlite'})")
    assert devices(capsys)["m1"]["state"] == "idle"
    assert History(env / "history.sqlite").golden_drift("m1") is None


def test_the_runs_a_module_drifted_in_leave_its_golden_history() -> None:
    from controller.history import GOLDEN_DRIFT_EVENT
    from controller.service.golden import drifted_runs

    events = [(1.0, f"{RESET_EVENT}: 0 failed run(s) in a row cleared"),
              (2.0, f"{GOLDEN_DRIFT_EVENT}: m1 drifted: qwen3 decode_tps -9.8% against its own golden history "
                    "(2 earlier checks), beyond 3% (run 20261202-130000-ab12)")]
    assert drifted_runs(events) == {"20261202-130000-ab12"}
