"""A preemption on the broker, as the agent's cancel token reads it: once per urgent run, a cancel first."""

from __future__ import annotations

from pathlib import Path

from contract.cancel_token import KVCancelToken
from contract.celery_app import make_app
from contract.kv import KV, preempt_key
from contract.settings import BrokerSettings


def test_a_preemption_stops_a_run_once_per_urgent_run_and_a_cancel_wins(tmp_path: Path) -> None:
    app = make_app(BrokerSettings(broker_url="filesystem://", data_dir=tmp_path))
    kv = KV(app)
    try:
        assert preempt_key("r1", "m1") == "m1000-fleet:preempt:m1:r1"
        assert kv.stop_flags("r1", "m1") == (None, None)
        kv.preempt("r1", "m1", by="u1")
        assert kv.preempted_by("r1", "m1") == "u1" and kv.preempted_by("r1", "m2") is None
        t = KVCancelToken(kv, "r1", "m1", interval=0)
        assert t.is_cancelled() and t.preempted_by == "u1" and t.reason == "preempted by urgent run u1"
        again = KVCancelToken(kv, "r1", "m1", interval=0, honoured=frozenset({"u1"}))  # the resumed delivery
        assert not again.is_cancelled() and again.preempted_by is None
        kv.preempt("r1", "m1", by="u2")  # a later urgent run stops it again
        assert again.is_cancelled() and again.preempted_by == "u2"
        kv.cancel("r1", "m1", reason="cancelled by rita")
        c = KVCancelToken(kv, "r1", "m1", interval=0)
        assert c.is_cancelled() and c.preempted_by is None and c.reason == "cancelled by rita"
    finally:
        app.close()


def test_preempting_another_users_run_needs_admin_or_a_reservation_of_its_module() -> None:
    """Issue 48: a trigger token could not cancel bob's run (403) but could stop it with --priority urgent
    --preempt. Without the right to preempt others (the API gives it to admin), another user's run is refused,
    named; one's own, one of a module one has reserved, or a run whose user is not recorded, are not."""
    import pytest

    from controller.history import RunInfo
    from controller.service import Forbidden
    from controller.service.lifecycle import check_preempt

    def run(rid: str, user: str) -> RunInfo:
        return RunInfo(run_id=rid, created_at=0.0, release="1.4.1", tarball="t", sha256="s", models=("qwen3",),
                       modules=("m1", "m2"), kind="run", state="running", verdict=None, finished_at=None, note="",
                       started_by=user)

    check_preempt({"m1": run("r-ann", "ann"), "m2": run("r-old", "")}, "ann", set())
    check_preempt({"m1": run("r-bob", "bob")}, "ann", {"m1"})  # ann holds m1: she may
    with pytest.raises(Forbidden) as exc:
        check_preempt({"m1": run("r-ann", "ann"), "m2": run("r-bob", "bob")}, "ann", {"m1"})
    assert str(exc.value) == ("--preempt would stop run r-bob of user bob on m2: preempting another user's run needs "
                              "role admin, or your reservation of m2")
    assert exc.value.http_status == 403


def test_a_preempted_run_goes_back_at_the_level_it_was_asked_for() -> None:
    """Issue 48: a preempted low run went back at the front (priority 0) and started again before the high and
    normal runs that had waited longer."""
    from agent.task import resume_priority
    from contract.priority import ASKED, LEVELS

    assert resume_priority({ASKED: "low"}) == LEVELS["low"] and resume_priority({ASKED: "high"}) == LEVELS["high"]
    assert resume_priority({}) == LEVELS["normal"] and resume_priority({ASKED: "bogus"}) == LEVELS["normal"]
