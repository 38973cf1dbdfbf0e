"""A module bad by failed runs recovers: refusals are not failed runs, the bad state ends after
``failures_cooldown`` (on trial), after a run that passes, or at ``fleetctl devices reset``.

On a real embedded broker and a real history file (fast: no worker)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from contract.kv import KV
from contract.records import Heartbeat, RunProgress, RunState, StepError
from controller.fleet import Fleet, failed_progress
from controller.history import RESET_EVENT, History
from controller.inventory import Module
from controller.settings import ControllerSettings

M = [Module(name="m1", transport="local")]


@pytest.fixture
def fleet(tmp_path: Path):
    settings = ControllerSettings(broker_url="filesystem://", data_dir=tmp_path / "fleet",
                                  history=tmp_path / "history.sqlite")
    f = Fleet(settings, History(settings.history_path), failures_cooldown=900.0)
    yield f
    f.close()


def beat(fleet: Fleet, *, healthy: bool = True, offset: float = 0.0) -> None:
    KV(fleet.app).put_heartbeat(Heartbeat(module="m1", agent_version="t", ts=time.time() + offset, healthy=healthy,
                                          detail="" if healthy else "free disk 0.10 GiB < 1.00 GiB"))


def run(fleet: Fleet, run_id: str, state: RunState, *, ended: float | None = None) -> None:
    """A run that reached the module and ended (its times on the agent's clock)."""
    ended = time.time() if ended is None else ended
    fleet.history.create_run(run_id, release="1.4.2", models=["qwen3"], modules=["m1"])
    fleet.history.upsert_progress(RunProgress(
        run_id=run_id, module="m1", release="1.4.2", state=state, step="benchmark", keys_total=1,
        started_at=ended - 60, updated_at=ended, finished_at=ended,
        error=StepError(step="benchmark", message="boom") if state == RunState.FAILED else None))
    time.sleep(0.002)


def state(fleet: Fleet, now: float | None = None) -> tuple[str, str]:
    st = fleet.statuses(M, now=now)["m1"]
    return st.state, st.reason


def test_dispatch_refusals_are_not_failed_runs_and_the_module_recovers_when_its_cause_is_gone(fleet: Fleet) -> None:
    beat(fleet, healthy=False)  # low disk: bad by its heartbeat
    for i in range(4):
        out = fleet.dispatch(run_id=f"r-{i}", modules=M, tarballs={}, sha256="0" * 64, release="1.4.2",
                             models=["qwen3"])
        assert out["m1"].startswith("module bad: free disk")
        assert fleet.history.progress(f"r-{i}")["m1"].state == RunState.FAILED  # the run still fails there
    assert fleet.consecutive_failures("m1") == 0
    beat(fleet)  # the disk freed
    assert state(fleet) == ("idle", "")


def test_refusals_neither_count_nor_end_a_streak(fleet: Fleet) -> None:
    beat(fleet)
    run(fleet, "a", RunState.FAILED)
    run(fleet, "b", RunState.FAILED)
    for i in range(12):  # more than the streak's window of 10 records
        fleet.history.create_run(f"x-{i}", release="1.4.2", models=["qwen3"], modules=["m1"])
        fleet.history.upsert_progress(failed_progress(f"x-{i}", "m1", "1.4.2", "dispatch", "module offline: x", 1,
                                                      time.time()))
    assert fleet.consecutive_failures("m1") == 2
    run(fleet, "c", RunState.FAILED)
    assert state(fleet)[0] == "bad"


def ended_at(fleet: Fleet, run_id: str, t: float) -> None:
    p = fleet.history.progress(run_id)["m1"]
    fleet.history.upsert_progress(p.model_copy(update={"updated_at": t, "finished_at": t}), force=True)


def test_bad_by_failed_runs_until_the_cooldown_then_on_trial(fleet: Fleet) -> None:
    beat(fleet)
    now = time.time()
    for r in "abc":
        run(fleet, r, RunState.FAILED, ended=now - 125 + ord(r) - ord("c"))
    got, reason = state(fleet)
    assert got == "bad"
    assert reason == ("3 failed runs in a row, the last 2 min ago: takes work again in 13 min (on trial), "
                      "or now after `fleetctl devices reset m1`")
    for r in "abc":  # the cooldown (900 s) has passed since the last one ended
        ended_at(fleet, r, now - 905 + ord(r) - ord("c"))
    got, reason = state(fleet)
    assert got == "idle" and reason == ("on trial: 3 failed runs in a row, the last 15 min ago "
                                        "(one more makes it bad again)"), reason
    run(fleet, "d", RunState.FAILED)  # the trial run fails: bad again, for as long
    assert state(fleet)[0] == "bad"
    run(fleet, "e", RunState.DONE)  # a run that passes (sent by hand with --devices once on trial) clears it
    assert state(fleet) == ("idle", "")


def test_the_cooldown_reads_the_agents_end_times_through_its_skew(fleet: Fleet) -> None:
    beat(fleet, offset=-3000.0)  # the module's clock 50 min behind
    now = time.time()
    for r in "abc":
        run(fleet, r, RunState.FAILED, ended=now - 3000.0 - 60)  # ended a minute ago, by its own clock
    got, reason = state(fleet, now)
    assert got == "bad" and "the last 60 s ago" in reason, reason


def test_reset_clears_the_streak_and_is_recorded(fleet: Fleet) -> None:
    beat(fleet)
    for r in "abcd":
        run(fleet, r, RunState.FAILED)
    assert state(fleet)[0] == "bad"
    assert fleet.reset_failures("m1") == 4
    assert state(fleet) == ("idle", "")
    assert [m for _, m in fleet.history.module_events("m1")] == [f"{RESET_EVENT}: 4 failed run(s) in a row cleared"]
    time.sleep(0.01)
    run(fleet, "e", RunState.FAILED)  # counting starts again after the reset
    assert fleet.consecutive_failures("m1") == 1
