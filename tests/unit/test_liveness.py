"""``liveness``: when the controller gives a module's part of a run up (pure)."""

from __future__ import annotations

from contract.kv import Beat
from contract.records import Heartbeat, RunProgress, RunState
from contract.settings import BrokerSettings
from controller.fleet import liveness

S = BrokerSettings(offline_after=30, lost_after=600)
T0 = 1_000_000.0


def hb(ts: float, run_id: str | None = None) -> Beat:
    """A beat the broker took at ``ts``, from an agent whose clock is right."""
    return Beat(Heartbeat(module="m", agent_version="1", ts=ts, run_id=run_id), ts)


def prog(state: RunState, updated: float, started: float | None = T0 + 5) -> RunProgress:
    return RunProgress(run_id="r", module="m", state=state, step="benchmark", started_at=started, updated_at=updated)


def test_busy_module_running_long_is_kept() -> None:
    now = T0 + 3000
    assert liveness(prog(RunState.BENCHMARKING, T0 + 10), hb(now - 2, "r"), now, dispatched_at=T0, settings=S) is None


def test_idle_module_whose_run_end_never_arrived_is_given_up_after_start_timeout() -> None:
    p = prog(RunState.BENCHMARKING, T0 + 100)
    assert liveness(p, hb(T0 + 390), T0 + 392, dispatched_at=T0, settings=S) is None  # within START_TIMEOUT (300 s)
    why = liveness(p, hb(T0 + 410), T0 + 411, dispatched_at=T0, settings=S)
    assert why is not None and why.startswith("end lost: the module is idle") and "benchmarking" in why


def test_unreachable_module_is_not_judged_idle() -> None:
    p = prog(RunState.BENCHMARKING, T0 + 100)
    assert liveness(p, hb(T0 + 450), T0 + 500, dispatched_at=T0, settings=S) is None  # silent 50 s: unreachable


def test_queued_and_lost_rules_still_hold() -> None:
    never = liveness(None, hb(T0 + 301), T0 + 302, dispatched_at=T0, settings=S)
    assert never is not None and never.startswith("never started")
    lost = liveness(None, hb(T0 + 100), T0 + 701, dispatched_at=T0, settings=S)
    assert lost is not None and lost.startswith("agent lost")


def test_a_run_waiting_past_queue_deadline_is_given_up_and_only_then() -> None:
    busy = hb(T0 + 4000, "other-run")  # the module is alive and busy with another run: the run waits
    assert liveness(None, busy, T0 + 4001, dispatched_at=T0, settings=S) is None  # no queue_deadline: it waits
    s = S.model_copy(update={"queue_deadline": 3600.0})
    assert liveness(None, busy, T0 + 3599, dispatched_at=T0, settings=s) is None
    assert liveness(None, busy, T0 + 3601, dispatched_at=T0, settings=s) == (
        "waited 3601 s on the module's queue without starting (queue_deadline 3600 s)")
    started = prog(RunState.BENCHMARKING, T0 + 10)  # a run that started is not waiting any more
    assert liveness(started, hb(T0 + 3600, "r"), T0 + 3601, dispatched_at=T0, settings=s) is None
