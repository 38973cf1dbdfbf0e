"""The sync pass's pure decisions (controller.fleet.sync_plan, states.streak_of, live.changed_modules): what is
read, what is taken, what counts as a failed run in a row, which modules the live view lists first."""

from __future__ import annotations

from contract.records import KeyOutcome, ResultRow, RunProgress, RunState, StepError
from controller.cli.live import changed_modules, shown_modules, states_summary
from controller.fleet import COLLECT_STEP, RunView
from controller.fleet.collect import Parsed
from controller.fleet.states import streak_of
from controller.fleet.sync_plan import kept_rows, pending_modules, plan_take


def _p(module: str = "m1", state: RunState = RunState.BENCHMARKING, **kw: object) -> RunProgress:
    return RunProgress.model_validate({"run_id": "r", "module": module, "release": "1.5.0", "state": state, **kw})


def test_pending_leaves_out_ended_parts_and_reads_lost_ones_while_late_states_count() -> None:
    known = {"a": _p("a", RunState.DONE), "b": _p("b", RunState.LOST), "c": _p("c")}
    assert pending_modules(["a", "b", "c", "d"], known, late_ok=True) == ["b", "c", "d"]
    assert pending_modules(["a", "b", "c", "d"], known, late_ok=False) == ["c", "d"]


def test_a_record_of_another_release_is_never_taken() -> None:
    found = _p(release="1.4.0", state=RunState.DONE)
    t = plan_take("1.5.0", found, None, skew=0.0)
    assert t.foreign and t.found is found and t.progress is None
    assert plan_take("1.5.0", _p(release=""), None, skew=0.0).progress is not None  # an older agent names none


def test_a_late_state_after_lost_is_taken_only_when_newer_by_the_agents_clock() -> None:
    lost = _p(state=RunState.LOST, finished_at=100.0, error=StepError(step="benchmark", message="agent lost"))
    # written at 104 on a clock 10 s ahead: 94 on the controller's, before it was given up
    assert plan_take("1.5.0", _p(updated_at=104.0), lost, skew=10.0).progress is None
    t = plan_take("1.5.0", _p(updated_at=104.0), lost, skew=0.0)
    assert t.progress is not None and t.force and t.late is not None and "agent lost" in t.late
    done = plan_take("1.5.0", _p(state=RunState.DONE, updated_at=50.0), lost, skew=0.0)  # a final state: always
    assert done.progress is not None and done.force


def test_a_collecting_module_takes_only_a_final_state() -> None:
    collecting = _p(state=RunState.PUBLISHING, step=COLLECT_STEP)
    assert plan_take("1.5.0", _p(updated_at=9.0), collecting, skew=0.0).progress is None
    assert plan_take("1.5.0", _p(state=RunState.DONE), collecting, skew=0.0).progress is not None
    assert not plan_take("1.5.0", _p(updated_at=9.0), _p(), skew=0.0).force


def test_kept_rows_are_the_parts_own_the_last_of_each_key() -> None:
    def row(module: str, profile: str, ttft: float, run_id: str = "r") -> ResultRow:
        return ResultRow(run_id=run_id, module=module, release="1.5.0", model_key="qwen3", table="sweep",
                         profile=profile, model="Qwen3", ttft_ms=ttft)

    rows = [row("m1", "128:128", 1.0), row("m1", "128:128", 2.0), row("m1", "256:128", 3.0), row("m2", "1:1", 4.0),
            row("m1", "1:1", 5.0, run_id="other")]
    assert [r.ttft_ms for r in kept_rows(rows, "r", "m1")] == [2.0, 3.0]


def _part(state: RunState, at: float, *, failed_key: bool = False, error: str = "") -> tuple[str, str, float]:
    p = _p(state=state, updated_at=at, finished_at=at,
           outcomes=(KeyOutcome(model_key="qwen3", status="failed" if failed_key else "passed"),),
           error=StepError(step="x", message=error) if error else None)
    return p.state.value, p.model_dump_json(), at


def test_streak_counts_failed_parts_newest_first_until_a_pass_or_a_reset() -> None:
    parts = [_part(RunState.BENCHMARKING, 9.0), _part(RunState.DONE, 8.0, failed_key=True),
             _part(RunState.LOST, 7.0), _part(RunState.DONE, 6.0), _part(RunState.FAILED, 5.0)]
    s = streak_of(parts, None, skew=2.0)
    assert (s.count, s.last_at) == (2, 6.0)  # not the running one; the newest ended at 8 on a clock 2 s ahead
    assert streak_of(parts, 7.5, skew=0.0).count == 1  # runs created before the reset are not read
    assert streak_of([_part(RunState.LOST, 7.0)], None, skew=5.0).last_at == 7.0  # a LOST end is the controller's


def test_the_word_failed_in_a_passed_parts_text_does_not_count_it() -> None:
    parts = [_part(RunState.DONE, 8.0, error="a retry failed once"), _part(RunState.FAILED, 7.0)]
    assert streak_of(parts, None, skew=0.0).count == 0


def test_a_record_read_again_unchanged_is_not_parsed_again() -> None:
    calls: list[str] = []

    def parse(raw: str) -> dict[str, str]:
        calls.append(raw)
        return {"v": raw}

    first, changed = Parsed[dict[str, str]]().update({"a": "1", "b": "2"}, parse)
    second, changed2 = first.update({"a": "1", "b": "3"}, parse)
    assert changed == ["a", "b"] and changed2 == ["b"] and calls == ["1", "2", "3"]
    assert second.get("a") is first.get("a") and second.get("b") == {"v": "3"} and second.get("c") is None


def test_the_live_view_lists_the_failed_then_the_changed_modules_first() -> None:
    names = tuple(f"m{i:05d}" for i in range(10_000))
    before = RunView("r", names, {m: _p(m) for m in names})
    progress = dict(before.progress)
    progress["m09000"] = _p("m09000", RunState.FAILED)
    progress["m09999"] = _p("m09999", RunState.DONE)
    progress["m05000"] = _p("m05000", step="probe")
    after = RunView("r", names, progress)
    changed = changed_modules(before, after)
    assert changed == {"m09000", "m09999", "m05000"} and changed_modules(None, after) == frozenset()
    shown = shown_modules(after, 5, changed)
    assert shown == ["m00000", "m00001", "m05000", "m09000", "m09999"]  # failed, changed, then unfinished
    assert states_summary(after, 5, len(changed)).startswith("10000 modules: 9998 benchmarking, 1 done, 1 failed;")


def test_a_followers_heartbeat_reads_are_spread_over_the_interval_and_each_module_read_once_an_interval() -> None:
    from controller.fleet.sync_plan import beat_read_times, beats_due

    mods = [f"sim-{i:05d}" for i in range(1000)]
    read: dict[str, float] = {}
    counts = {m: 0 for m in mods}
    per_pass = []
    for step in range(41):  # 20 s of passes every 0.5 s, heartbeat interval 5 s
        now = 1000.0 + step * 0.5
        fresh = beats_due(mods, read, now, 5.0, {})
        read.update(beat_read_times(fresh, read, now, 5.0))
        per_pass.append(len(fresh))
        for m in fresh:
            counts[m] += 1
    assert per_pass[0] == 1000  # the first pass reads every one (a one-shot `fleetctl status` needs them all)
    assert max(per_pass[1:]) <= 160  # later passes about a tenth each, not all of them once an interval
    assert sum(per_pass[1:11]) == 1000  # the next interval reads each module once
    assert set(counts.values()) == {5}  # 20 s: the first read and one an interval after


def test_a_module_given_up_or_read_ahead_of_now_is_read_again() -> None:
    from controller.fleet.sync_plan import beats_due

    lost = RunProgress(run_id="r", module="b", release="1", state=RunState.LOST)
    assert beats_due(["a", "b", "c"], {"a": 99.0, "b": 99.0, "c": 120.0}, 100.0, 5.0, {"b": lost}) == ["b", "c"]
