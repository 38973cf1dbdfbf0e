"""Every method of the run history gives the same answers on SQLite and on PostgreSQL (one code path above the
database seam, controller.history.db): each test runs on both engines (the PostgreSQL one in the slow tier, on a
real server of the tests' own, a fresh database per test)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from contract.fingerprint import EnvFingerprint
from contract.records import ResultRow, RunProgress, RunState, TelemetrySummary
from controller.history import (
    GOLDEN_DRIFT_EVENT,
    RESET_EVENT,
    VERDICT_EVENT,
    History,
    HistoryError,
    row_to_db,
    url_digest,
)


def _row(run: str, module: str, key: str, profile: str, tps: float, **more: Any) -> ResultRow:
    return ResultRow(run_id=run, module=module, release="1.0", model_key=key, table="sweep", profile=profile,
                     model="m", decode_tps=tps, prefill_len=128, **more)


def test_runs_are_recorded_once_and_found_by_prefix(history: History) -> None:
    history.create_run("nightly-1", release="1.0", models=["a", "b"], modules=["m1", "m2"],
                       module_models={"m2": ["b"]})
    history.create_run("nightly-1", release="other")  # a second create is no change
    time.sleep(0.002)
    history.create_run("nightly-2", release="1.1")
    history.set_dispatched("nightly-1", "high", 123.5)
    history.set_started_by("nightly-1", "ana")
    history.set_started_by("nightly-1", "bob")  # who started it is kept
    history.set_run_note("nightly-1", "compare 1.0..1.1")
    run = history.run("nightly-1")
    assert run is not None
    assert (run.release, run.models, run.modules, run.module_models, run.priority, run.dispatched_at,
            run.started_by, run.note, run.state) == (
        "1.0", ("a", "b"), ("m1", "m2"), {"m2": ("b",)}, "high", 123.5, "ana", "compare 1.0..1.1", "running")
    assert history.run("nope") is None
    assert history.find_run("latest").run_id == "nightly-2"
    assert history.find_run("nightly-2").run_id == "nightly-2"
    with pytest.raises(HistoryError, match=r"run id 'nightly' is ambiguous \(2 runs\)"):
        history.find_run("nightly")
    with pytest.raises(HistoryError, match="no run 'x%'"):
        history.find_run("x%")
    assert [r.run_id for r in history.runs()] == ["nightly-2", "nightly-1"]
    assert sorted(history.running_runs()) == ["nightly-1", "nightly-2"]


def test_a_verdict_is_recorded_with_its_line_and_queued_once(history: History) -> None:
    history.create_run("r1", sha256="s1")
    history.create_run("r2", sha256="s2")
    targets = history.webhook_targets(["http://hook/a"])  # events queued from now on are sent to it
    assert list(targets) == [url_digest("http://hook/a")]
    history.set_run_state("r1", "done", "pass", findings='{"regressions": []}')
    history.set_run_state("r1", "done", "pass")  # again: the outbox keeps the first
    run = history.run("r1")
    assert run is not None and (run.state, run.verdict, run.verdict_line) == ("done", "pass", "PASS r1")
    assert run.finished_at is not None
    assert sorted(history.verdict_counts()) == [("none", 1), ("pass", 1)]
    assert history.releases_in_use(5) == {"s1", "s2"}
    history.set_run_state("r1", "running")  # resumed: its line goes, its verdict stays until judged again
    run = history.run("r1")
    assert run is not None and (run.state, run.verdict, run.verdict_line) == ("running", "pass", None)
    pending = history.pending_webhooks(targets, max_age=3600)
    assert [(e.run_id, e.event, e.verdict, e.line, e.payload) for e in pending] == [
        ("r1", VERDICT_EVENT, "pass", "PASS r1", '{"regressions": []}')]


def test_progress_keeps_the_newest_update_unless_forced(history: History) -> None:
    history.create_run("r1")
    fp = EnvFingerprint(driver="d1")
    new = RunProgress(run_id="r1", module="m1", state=RunState.BENCHMARKING, updated_at=20.0, started_at=10.0,
                      fingerprint=fp)
    old = RunProgress(run_id="r1", module="m1", state=RunState.PENDING, updated_at=5.0)
    history.upsert_progress_many([new, RunProgress(run_id="r1", module="m2", updated_at=1.0, attempt=0)])
    history.upsert_progress(old)
    assert history.progress("r1")["m1"] == new
    history.upsert_progress(old, force=True)
    assert history.progress("r1")["m1"] == old
    assert history.fingerprints("r1") == {"m1": fp}
    assert history.fingerprints_by_digest([fp.digest(), "nope"]) == {fp.digest(): fp}
    # module_parts leaves out parts never sent (attempt 0)
    assert [RunProgress.model_validate_json(p).module for p, _ in history.module_parts("m1", 5)] == ["m1"]
    assert history.module_parts("m2", 5) == []


def test_waits_from_dispatch_to_start_and_who_ran_before(history: History) -> None:
    history.create_run("r1")
    history.set_dispatched("r1", "normal", 100.0)
    history.create_run("r0")
    history.upsert_progress_many([
        RunProgress(run_id="r1", module="m1", updated_at=200.0, started_at=160.5),
        RunProgress(run_id="r0", module="m1", updated_at=150.0, started_at=90.0, finished_at=150.0)])
    assert history.waits("r1") == [("r1", "m1", "normal", 60.5)]
    assert history.ran_before("m1", 100.0, 160.5, "r1") == "r0"
    assert history.ran_before("m1", 151.0, 160.5, "r1") is None


def test_events_resets_and_golden_drift(history: History) -> None:
    history.add_event("r1", "m1", "sent")
    history.add_events("r1", ["m2", "m3"], "cancelled")
    assert [(m, msg) for m, _, msg in history.events("r1")] == [("m1", "sent"), ("m2", "cancelled"),
                                                                ("m3", "cancelled")]
    history.add_module_event("m1", f"{GOLDEN_DRIFT_EVENT}: decode 5 % worse")
    assert history.golden_drift("m1") == "decode 5 % worse"
    time.sleep(0.002)
    history.add_module_event("m1", f"{RESET_EVENT} by ana")
    assert history.golden_drift("m1") is None
    assert history.last_module_reset("m1") == history.module_events("m1")[-1][0]
    assert [msg for _, msg in history.module_events("m1")] == [f"{GOLDEN_DRIFT_EVENT}: decode 5 % worse",
                                                              f"{RESET_EVENT} by ana"]
    assert history.last_module_reset("m9") is None


def test_rows_upserted_replaced_and_counted(history: History) -> None:
    history.create_run("r1")
    rows = [_row("r1", "m1", "k", "p2", 2.0, correct=True, extra={"a": "b"}, flags=("x",)),
            _row("r1", "m1", "k", "p1", 1.0), _row("r1", "m2", "k", "p1", 3.0),
            _row("r1", "m2", "k", "p1", 3.0, source="probe")]
    assert history.upsert_rows(rows) == 4
    assert history.upsert_rows([rows[0]]) == 1  # the same row again: stored once
    assert history.rows("r1") == rows[:3]  # by module, model key, then as first stored
    assert history.rows("r1", "m2", source=None) == rows[2:]
    assert history.row_count("r1") == 3 and history.release_row_count("r1", "m2") == 1
    assert history.stored_row_count("r1", "m2") == 2
    assert sorted(history.modules_with_rows("r1")) == ["m1", "m2"]
    assert history.replace_rows("r1", "m1", [rows[1], _row("r1", "m9", "k", "p", 0.0)]) == 1
    assert history.rows("r1", "m1") == [rows[1]]
    late = rows[0].model_copy(update={"decode_tps": 5.0})  # a bulk load of stored values: the last of a key wins
    assert history.upsert_row_values([row_to_db(rows[0]), row_to_db(late)]) == 1
    assert history.rows("r1", "m1") == [rows[1], late]
    frame = history.row_frame(["r1"])
    assert sorted(zip(frame["module"], frame["profile"], frame["decode_tps"], strict=True)) == [
        ("m1", "p1", 1.0), ("m1", "p2", 5.0), ("m2", "p1", 3.0), ("m2", "p1", 3.0)]
    assert sorted(map(tuple, history.modules_of_rows(["r1", "r0"]).values.tolist())) == [("r1", "m1"), ("r1", "m2")]


def test_baselines_are_versioned_per_release(history: History) -> None:
    rows = [_row("x", "m1", "k", "p", 1.0)]
    assert history.add_baseline("1.0", rows, "seed") == (1, "baseline:1.0:v1")
    assert history.add_baseline("1.0", rows, "run r5") == (2, "baseline:1.0:v2")
    assert history.baseline_run_id() == "baseline:1.0:v2"
    assert history.baseline_run_id("1.0@v1") == "baseline:1.0:v1"
    assert history.baseline_run_id("baseline:1.0:v1") == "baseline:1.0:v1"
    assert history.baseline_run_id("2.0") is None
    assert [(b["release"], b["version"], b["source"]) for b in history.baselines()] == [
        ("1.0", 1, "seed"), ("1.0", 2, "run r5")]
    assert history.rows("baseline:1.0:v2") == [rows[0].model_copy(update={"run_id": "baseline:1.0:v2",
                                                                           "release": "1.0"})]
    assert history.runs(kind="baseline")[0].state == "done"


def test_telemetry_and_runs_before(history: History) -> None:
    t = TelemetrySummary(run_id="r1", module="m1", tool="mthreads-gmi", samples=3)
    history.upsert_telemetry(t)
    history.upsert_telemetry(t.model_copy(update={"samples": 4}))
    assert history.telemetry("r1") == {"m1": t.model_copy(update={"samples": 4})}
    for i in range(3):
        history.create_run(f"r{i}")
        time.sleep(0.002)
    newest = history.run("r2")
    assert newest is not None
    before = history.runs_before(newest.created_at + 1, "r2", 5)
    assert list(before["run_id"]) == ["r1", "r0"] and before["created_at"].dtype == "float64"


def test_golden_checks_are_no_other_runs_previous_run(history: History) -> None:
    """Issue 46 item 6: the runs a report takes each module's previous run from leave the golden checks out; a
    golden check's are the earlier checks of its release (the same note), on both engines alike."""
    notes = {"n1": "", "g1": "golden check 1.4.1", "c1": "compare 1.4.1..1.4.2: round 1, A", "g2": "golden check 1.4.0",
             "g3": "golden check 1.4.1", "n2": ""}
    for run_id, note in notes.items():
        history.create_run(run_id, release="1.4.2")
        history.set_run_note(run_id, note)
        time.sleep(0.002)
    last = history.run("n2")
    assert last is not None
    assert list(history.runs_before(last.created_at + 1, "n2", 10)["run_id"]) == ["c1", "n1"]
    assert list(history.runs_before(last.created_at + 1, "g3", 10, note="golden check 1.4.1")["run_id"]) == ["g1"]
    assert list(history.runs_before(last.created_at + 1, "n2", 1)["run_id"]) == ["c1"]  # the limit after the filter


def test_webhooks_are_claimed_by_one_sender_and_marked(history: History) -> None:
    history.create_run("r1")
    history.set_run_state("r1", "done", "fail")
    history.queue_webhook("r1", "trend.change_point", "fail", "line", "done", '{"x": 1}')
    d = url_digest("http://hook/a")
    assert history.claim_webhooks("r1", VERDICT_EVENT, [d], "serve-a", lease=60) == [d]
    assert history.claim_webhooks("r1", VERDICT_EVENT, [d], "serve-b", lease=60) == []  # held by the other
    assert history.claim_webhooks("r1", VERDICT_EVENT, [d], "serve-a", lease=60) == [d]  # its own again
    assert history.claim_webhooks("r1", "trend.change_point", [d], "serve-b", lease=-1) == [d]
    assert history.claim_webhooks("r1", "trend.change_point", [d], "serve-a", lease=60) == [d]  # lease ran out
    history.mark_webhook("r1", VERDICT_EVENT, d, "delivered")
    assert history.claim_webhooks("r1", VERDICT_EVENT, [d], "serve-a", lease=60) == []  # delivered: done
    assert history.webhook_outcomes("r1") == {d: "delivered"}


def test_a_report_frame_is_the_same_on_both_engines(location: str | Path, tmp_path: Path,
                                                    reference: pd.DataFrame) -> None:
    """The rows of a synthetic fleet run read into the report's frame: equal to the SQLite history's."""
    from controller.report.synth import fleet
    from tests.support.frames import frame_to_rows

    rows = frame_to_rows(fleet(reference, modules=["m0", "m1", "m2"], seed=3, run_id="run-x"))
    frames = []
    for where in (location, tmp_path / "other.sqlite"):
        h = History(where)
        h.create_run("run-x", modules=["m0", "m1", "m2"])
        h.upsert_rows(rows)
        h.set_run_state("run-x", "done", "pass")
        frames.append(h.row_frame(["run-x"]).sort_values(["module", "model_key", "profile"], ignore_index=True))
        h.close()
    pd.testing.assert_frame_equal(frames[0], frames[1], check_exact=True)


def test_a_read_of_some_fields_from_the_column_file_is_those_columns_of_the_whole(history: History) -> None:
    """The trend's read (6 fields of 48, decompressed alone) from the ended run's column file, on either store."""
    history.create_run("r1", modules=["m1", "m2"])
    history.upsert_rows([_row("r1", m, k, p, 10.0 + i) for i, (m, k, p) in enumerate(
        (m, k, p) for m in ("m2", "m1") for k in ("b", "a") for p in ("128:128", "64:64"))])
    history.set_run_state("r1", "done", "pass")
    whole = history.row_frame(["r1"])  # from the rows table: the column file written
    assert history.db.execute("SELECT run_id FROM row_files").fetchall() == [("r1",)]
    fields = ["decode_tps", "module", "run_id", "profile", "model_key"]
    part = history.row_frame(["r1"], ["a"], only=fields)
    assert list(part.columns) == fields and sorted(part["decode_tps"]) == [12.0, 13.0, 16.0, 17.0]
    pd.testing.assert_frame_equal(part, whole.loc[whole["model_key"] == "a", fields].reset_index(drop=True),
                                  check_exact=True, check_categorical=False)
