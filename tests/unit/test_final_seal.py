"""A run's final state carries the count and digest of the module's rows; the controller records a module's
part complete only when its history holds exactly those, and the module sends its final state again until the
controller acknowledges it (fast tier: the embedded broker's real files, no worker)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agent.outbox import Publisher, outbox_path, resend_due, resend_unacked, unacked_path
from agent.settings import AgentSettings
from agent.store import RunStore
from contract.celery_app import make_app
from contract.digest import canonical_json, is_sealed, record_digest, rows_digest, seal
from contract.kv import KV, ack_key
from contract.records import KeyOutcome, ResultRow, RunProgress, RunState, TelemetrySummary
from controller.fleet import COLLECT_STEP, Fleet, is_collecting, record_gap
from controller.history import History
from controller.settings import ControllerSettings


def row(i: int, **kw: object) -> ResultRow:
    base: dict[str, object] = dict(run_id="r1", module="m1", release="1.4.1", model_key="qwen3", table="sweep",
                                   profile=f"128:{i}", model="Qwen3-30B", prefill_len=128, ctx_k=0.25, batch=1,
                                   ttft_ms=10.5 + i, decode_tps=30.0, extra={"z": "1", "a": "ü"}, flags=("f",))
    base.update(kw)
    return ResultRow.model_validate(base)


ROWS = [row(i) for i in range(3)] + [row(0, source="probe")]


# --------------------------------------------------------------------------- the digest (pure)
def test_rows_digest_is_canonical_and_order_free():
    d = rows_digest(ROWS)
    assert d.startswith("sha256:") and len(d) == 7 + 64
    assert rows_digest(reversed(ROWS)) == d == rows_digest(ROWS[2:] + ROWS[:2])
    assert rows_digest(ROWS[:-1]) != d  # a row less
    assert rows_digest([*ROWS[:-1], ROWS[-1].model_copy(update={"ttft_ms": 10.50001})]) != d  # a value changed
    assert rows_digest([]) == "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    # the spelling is fixed: agents and controllers of different versions must agree on it
    assert canonical_json({"b": 1, "a": [1.5, "ü"]}) == '{"a":[1.5,"ü"],"b":1}'
    assert rows_digest([row(7)]) == rows_digest([ResultRow.model_validate_json(row(7).model_dump_json())])


def test_seal_counts_every_row_and_refers_to_the_telemetry_summary():
    summary = TelemetrySummary(run_id="r1", module="m1", tool="mthreads-gmi", samples=3)
    p = RunProgress(run_id="r1", module="m1", state=RunState.DONE, rows=3, telemetry=summary, finished_at=1.0)
    s = seal(p, ROWS)
    assert (s.stored_rows, s.rows_digest, s.telemetry_digest) == (4, rows_digest(ROWS), record_digest(summary))
    assert is_sealed(s) and not is_sealed(p)
    assert seal(p.model_copy(update={"telemetry": None}), []).telemetry_digest is None


def test_record_gap_names_what_the_history_lacks():
    summary = TelemetrySummary(run_id="r1", module="m1", tool="t", samples=1)
    p = seal(RunProgress(run_id="r1", module="m1", state=RunState.DONE, finished_at=1.0, telemetry=summary), ROWS)
    assert record_gap(p, ROWS, summary) is None
    assert record_gap(p, ROWS[:1], summary) == "1 of 4 rows reached the controller"
    changed = [*ROWS[:-1], ROWS[-1].model_copy(update={"ttft_ms": 1.0})]
    assert record_gap(p, changed, summary) == "4 of 4 rows reached the controller (they differ from the module's)"
    assert record_gap(p, ROWS, None) == "its device telemetry summary has not"
    assert record_gap(p, [], None) == "0 of 4 rows reached the controller; its device telemetry summary has not"
    # an agent from before the seal: complete once its state carries finished_at (its early "done" did not)
    legacy = RunProgress(run_id="r1", module="m1", state=RunState.DONE)
    assert "finished_at" in (record_gap(legacy, [], None) or "")
    assert record_gap(legacy.model_copy(update={"finished_at": 2.0}), [], None) is None


def test_resend_due_backs_off_with_age():
    assert not resend_due(now=110.0, last_sent=100.0, first_sent=100.0, interval=30.0)
    assert resend_due(now=130.0, last_sent=100.0, first_sent=100.0, interval=30.0)
    # a day old: every tenth of its age, at most hourly
    assert not resend_due(now=86400.0, last_sent=86400.0 - 1800, first_sent=0.0, interval=30.0)
    assert resend_due(now=86400.0, last_sent=86400.0 - 3600, first_sent=0.0, interval=30.0)


# --------------------------------------------------------------------------- the module keeps it until acked
@pytest.fixture
def agent(tmp_path: Path):
    settings = AgentSettings(module="m1", workdir=tmp_path / "work", data_dir=tmp_path / "fleet",
                             broker_url="filesystem://", metrics_port=0)
    app = make_app(settings)
    yield settings, KV(app)
    app.close()


def _store_rows(work: Path, rows: list[ResultRow]) -> None:
    RunStore(work).put_rows("r1", "qwen3", rows)


def test_final_waits_for_the_ack_and_is_sent_again_until_then(agent):
    settings, kv = agent
    work = settings.workdir
    _store_rows(work, ROWS)
    now = time.time()
    done = RunProgress(run_id="r1", module="m1", state=RunState.DONE, updated_at=now, finished_at=now, rows=3)
    pub = Publisher(kv, work, "r1", "m1")
    with pytest.raises(ValueError, match="published once, through Publisher.final"):
        pub.progress(done)  # a terminal state never goes out as progress
    pub.final(done)
    sealed = kv.progress("r1", ["m1"])["m1"]
    assert sealed is not None and sealed.stored_rows == 4 and sealed.rows_digest == rows_digest(ROWS)
    assert not outbox_path(work, "r1").exists() and unacked_path(work, "r1").exists()
    # the broker drops the rows and the state (an evicting Redis): not due yet, then sent again, rows first
    kv.delete("m1000-fleet:rows:r1:m1")
    kv.delete("m1000-fleet:progress:r1:m1")
    assert resend_unacked(kv, work, interval=30.0, keep_for=86400.0, now=now + 5) == 0
    assert kv.rows("r1", "m1") is None
    assert resend_unacked(kv, work, interval=30.0, keep_for=86400.0, now=now + 31) == 1
    assert sorted(r.identity for r in kv.rows("r1", "m1") or []) == sorted(r.identity for r in ROWS)
    assert kv.progress("r1", ["m1"])["m1"] == sealed
    # an acknowledgement of another state (an earlier final of this run) does not count
    kv.put_ack(sealed.model_copy(update={"updated_at": now - 100}))
    assert resend_unacked(kv, work, interval=30.0, keep_for=86400.0, now=now + 200) == 1
    kv.put_ack(sealed)
    assert resend_unacked(kv, work, interval=30.0, keep_for=86400.0, now=now + 400) == 0
    assert not unacked_path(work, "r1").exists()


def test_an_unacknowledged_final_is_dropped_after_result_expires(agent):
    settings, kv = agent
    work = settings.workdir
    done = RunProgress(run_id="r2", module="m1", state=RunState.FAILED, updated_at=1000.0, finished_at=1000.0)
    Publisher(kv, work, "r2", "m1").final(done)
    assert unacked_path(work, "r2").exists()
    assert resend_unacked(kv, work, interval=30.0, keep_for=3600.0, now=1000.0 + 3601) == 0
    assert not unacked_path(work, "r2").exists()


def test_an_interrupted_state_leaves_the_outbox_once_taken(agent):
    settings, kv = agent
    p = RunProgress(run_id="r3", module="m1", state=RunState.INTERRUPTED, updated_at=1.0)
    Publisher(kv, settings.workdir, "r3", "m1").final(p)
    assert not outbox_path(settings.workdir, "r3").exists() and not unacked_path(settings.workdir, "r3").exists()
    assert kv.progress("r3", ["m1"])["m1"] == p  # not sealed: it is not the run's end


# --------------------------------------------------------------------------- the controller's completeness rule
@pytest.fixture
def ctl(tmp_path: Path):
    settings = ControllerSettings(broker_url="filesystem://", data_dir=tmp_path / "fleet",
                                  history=tmp_path / "history.sqlite")
    history = History(tmp_path / "history.sqlite")
    fleet = Fleet(settings, history, collect_timeout=60.0)
    history.create_run("r1", release="1.4.1", models=["qwen3"], modules=["m1"])
    yield fleet, history
    fleet.close()
    history.close()


def _final(n: int = 4, **kw: object) -> RunProgress:
    now = time.time()
    p = RunProgress(run_id="r1", module="m1", release="1.4.1", state=RunState.DONE, step="done", keys_total=1,
                    keys_done=1, rows=3, started_at=now - 5, updated_at=now, finished_at=now,
                    outcomes=(KeyOutcome(model_key="qwen3", status="passed", rows=3),))
    return seal(p.model_copy(update=kw), ROWS[:n])


def test_a_final_state_without_its_rows_keeps_the_module_collecting(ctl):
    fleet, history = ctl
    final = _final()
    fleet.kv.put_rows("r1", "m1", ROWS[:2])  # the broker kept an earlier, shorter list; the last one was evicted
    fleet.kv.put_progress(final)
    view = fleet.sync("r1")
    p = view.progress["m1"]
    assert p is not None and is_collecting(p) and p.state == RunState.PUBLISHING and p.step == COLLECT_STEP
    assert p.error is not None and p.error.message == "2 of 4 rows reached the controller"
    assert not view.finished and history.run("r1").state == "running"
    assert fleet.kv.get(ack_key("r1", "m1")) is None
    assert any(m == "m1" and "collecting: the module reported done, but 2 of 4 rows" in msg
               for m, _, msg in history.events("r1"))
    # the broker loses the state too: the module stays collecting (its agent sends it again)
    fleet.kv.delete("m1000-fleet:progress:r1:m1")
    assert is_collecting(fleet.sync("r1").progress["m1"])
    # the module sends its final state again: complete, recorded as the module reported it, acknowledged
    fleet.kv.put_final(final, ROWS)
    view = fleet.sync("r1")
    assert view.finished and view.progress["m1"] == final and history.run("r1").state == "done"
    assert rows_digest(history.rows("r1", "m1", source=None)) == final.rows_digest  # exact, through SQLite
    assert fleet.kv.acked(final)


def test_a_final_state_refers_to_its_telemetry_summary(ctl):
    fleet, history = ctl
    summary = TelemetrySummary(run_id="r1", module="m1", tool="mthreads-gmi", samples=5)
    final = _final(telemetry=summary)
    assert final.telemetry_digest == record_digest(summary)
    fleet.kv.put_rows("r1", "m1", ROWS)
    fleet.kv.put("m1000-fleet:progress:r1:m1", final.model_dump(mode="json", exclude={"telemetry"}))
    p = fleet.sync("r1").progress["m1"]
    assert is_collecting(p) and p.error is not None and p.error.message == "its device telemetry summary has not"
    fleet.kv.put_telemetry(summary)
    view = fleet.sync("r1")
    assert view.finished and history.telemetry("r1") == {"m1": summary}


def test_collecting_is_bounded_and_ends_failed_never_done(ctl):
    fleet, history = ctl
    final = _final()
    fleet.kv.put_progress(final)  # its rows never reach the broker
    t0 = time.time()
    assert is_collecting(fleet.sync("r1", now=t0).progress["m1"])
    assert is_collecting(fleet.sync("r1", now=t0 + 30).progress["m1"])
    view = fleet.sync("r1", now=t0 + 61)
    p = view.progress["m1"]
    assert view.finished and p.state == RunState.FAILED and history.run("r1").state == "failed"
    assert p.error.step == "collect" and p.error.message.startswith("0 of 4 rows reached the controller")
    assert fleet.kv.acked(final)  # given up: the module stops sending it
    # and it stays failed: a later sync does not read it again
    fleet.kv.put_final(final, ROWS)
    assert fleet.sync("r1", now=t0 + 70).progress["m1"].state == RunState.FAILED


def test_an_early_done_of_an_older_agent_is_not_its_final_record(ctl):
    fleet, history = ctl
    early = RunProgress(run_id="r1", module="m1", release="1.4.1", state=RunState.DONE, step="done", keys_total=1,
                        keys_done=1, updated_at=time.time())
    fleet.kv.put_progress(early)
    assert is_collecting(fleet.sync("r1").progress["m1"])
    late = early.model_copy(update={"finished_at": early.updated_at + 1, "updated_at": early.updated_at + 1})
    fleet.kv.put_progress(late)
    view = fleet.sync("r1")
    assert view.finished and view.progress["m1"] == late
    assert fleet.kv.get(ack_key("r1", "m1")) is None  # nothing to acknowledge: it carries no seal
