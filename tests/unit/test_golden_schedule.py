"""The golden check schedule's planner (pure): which idle modules are due a check after N validations or T hours,
and that a check never goes ahead of a module's own work."""

from __future__ import annotations

from controller.history.records import RunInfo
from controller.service.golden_schedule import due

H = 3600.0


def run(at: float, modules: tuple[str, ...], *, golden: bool = False, state: str = "done") -> RunInfo:
    return RunInfo(run_id=f"r{at:g}", created_at=at, release="1.4.1", tarball="t", sha256="s", models=("qwen3",),
                   modules=modules, kind="run", state=state, verdict=None, finished_at=None,
                   note="golden check 1.4.1" if golden else "")


def names(got) -> list[tuple[str, str]]:
    return [(d.module, d.why) for d in got]


IDLE = {"m1": "idle", "m2": "idle"}


def test_nothing_is_due_without_a_schedule() -> None:
    assert due([run(1, ("m1",))] * 5, IDLE, 10 * H, every_runs=0, every_hours=0) == []


def test_after_n_validations_since_the_last_check() -> None:
    runs = [run(1, ("m1", "m2")), run(2, ("m1",), golden=True), run(3, ("m1", "m2")), run(4, ("m1",))]
    assert names(due(runs, IDLE, 5, every_runs=2, every_hours=0)) == [
        ("m1", "2 validation(s) since its last golden check"), ("m2", "2 validation(s) and no golden check yet")]
    assert names(due(runs, IDLE, 5, every_runs=3, every_hours=0)) == []  # the check at 2 restarted m1's count


def test_after_t_hours_and_at_once_without_a_golden_history() -> None:
    runs = [run(0, ("m1",), golden=True), run(1, ("m2",))]
    assert names(due(runs, IDLE, 2 * H, every_hours=3, every_runs=0)) == [("m2", "no golden check yet")]
    assert names(due(runs, IDLE, 3 * H, every_hours=3, every_runs=0)) == [
        ("m1", "its last golden check 3.0 h ago"), ("m2", "no golden check yet")]


def test_never_ahead_of_work_only_on_an_idle_module() -> None:
    runs = [run(1, ("m1", "m2")), run(2, ("m1", "m2")), run(3, ("m2",), state="running")]
    states = {"m1": "busy", "m2": "idle", "m3": "bad", "m4": "unreachable"}
    assert due(runs, states, 5, every_runs=1, every_hours=1) == []  # m2 has a run in flight (queued there)
    states["m1"] = "idle"
    assert names(due(runs, states, 5, every_runs=1, every_hours=0)) == [
        ("m1", "2 validation(s) and no golden check yet")]
    # a check in flight is work in flight: no second one
    runs.append(run(4, ("m1",), golden=True, state="running"))
    assert due(runs, states, 5, every_runs=1, every_hours=1) == []
