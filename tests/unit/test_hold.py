"""A module holds back another user's run while it is reserved (agent.hold), read from a real embedded broker."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent import hold
from contract.celery_app import make_app
from contract.kv import KV, held_for_other
from contract.priority import USER
from contract.settings import BrokerSettings

NOW = 1_700_000_000.0


def test_who_a_reservation_record_holds_back() -> None:
    rec = {"user": "ann", "until": NOW + 60, "reason": "fw", "id": "r1", "since": NOW}
    assert held_for_other(rec, "bob", NOW) == ("ann", NOW + 60)
    assert held_for_other(rec, "", NOW) == ("ann", NOW + 60)  # a message without a user: not the holder's
    assert held_for_other(rec, "ann", NOW) is None  # the holder's own work
    assert held_for_other(rec, "bob", NOW + 60) is None  # over (the embedded broker keeps the file)
    assert held_for_other(None, "bob", NOW) is None
    assert held_for_other({"user": "ann", "until": "soon"}, "bob", NOW) is None  # unreadable: holds nothing


class _Clock:
    """A clock the waits advance (the broker is real; only time is not waited for)."""

    def __init__(self) -> None:
        self.t = NOW
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.t += s


@pytest.fixture
def kv(tmp_path: Path):
    app = make_app(BrokerSettings(broker_url="filesystem://", data_dir=tmp_path))
    yield KV(app)
    app.close()


def test_another_users_run_is_held_back_and_the_holders_is_not(kv: KV) -> None:
    kv.put_reservation("m1", {"user": "ann", "until": NOW + 3600, "reason": "", "id": "r", "since": NOW}, 3600)
    held = hold.held_back(kv, "run-1", "m1", {USER: "bob"}, NOW)
    assert held == hold.Held("ann", NOW + 3600)
    assert held.line().startswith("module reserved by ann until ")
    assert hold.held_back(kv, "run-1", "m1", {USER: "ann"}, NOW) is None
    assert hold.held_back(kv, "run-1", "m2", {USER: "bob"}, NOW) is None  # not reserved
    assert hold.held_back(kv, "run-1", "m1", {USER: "bob"}, NOW + 3600) is None  # over
    kv.cancel("run-1", "m1", reason="cancelled by bob")  # a cancelled run is not held: it ends at once
    assert hold.held_back(kv, "run-1", "m1", {USER: "bob"}, NOW) is None


def test_the_module_lingers_until_the_hold_ends_the_reservation_ends_or_it_stops(kv: KV) -> None:
    kv.put_reservation("m1", {"user": "ann", "until": NOW + 3600, "reason": "", "id": "r", "since": NOW}, 3600)
    clock = _Clock()
    waited = hold.linger(kv, "run-1", "m1", {USER: "bob"}, stop=lambda: False, hold_s=5, poll_s=1, clock=clock,
                         sleep=clock.sleep)
    assert (waited, clock.slept) == (5, [1, 1, 1, 1, 1])
    clock = _Clock()
    stops = iter([False, False, True])
    assert hold.linger(kv, "run-1", "m1", {USER: "bob"}, stop=lambda: next(stops), hold_s=5, poll_s=1, clock=clock,
                       sleep=clock.sleep) == 2  # the agent shutting down
    kv.put_reservation("m1", {"user": "ann", "until": NOW + 2.5, "reason": "", "id": "r", "since": NOW}, 3)
    clock = _Clock()
    assert hold.linger(kv, "run-1", "m1", {USER: "bob"}, stop=lambda: False, hold_s=5, poll_s=1, clock=clock,
                       sleep=clock.sleep) == 3  # free at NOW + 3: the worker takes its next message then


def test_a_record_is_moved_onto_the_readers_clock_by_the_time_its_key_has_left():
    """Issue 48: ``until`` as the writer's clock said it (an hour behind) is replaced by the reader's now plus what the
    broker has left of the key; unchanged where the broker keeps no expiry (the embedded broker: one clock)."""
    from contract.kv import on_broker_clock

    rec = {"user": "ann", "until": NOW - 1800, "reason": "fw"}  # the writer's clock an hour behind: looks over
    assert on_broker_clock(rec, 1800.0, NOW) == {"user": "ann", "until": NOW + 1800, "reason": "fw"}
    assert held_for_other(on_broker_clock(rec, 1800.0, NOW), "bob", NOW) == ("ann", NOW + 1800)
    assert on_broker_clock(rec, None, NOW) is rec
    assert on_broker_clock(None, 5.0, NOW) is None
