"""Priorities: the names, the planner of raises, and the embedded broker's order (real files, kombu's reader)."""

from __future__ import annotations

import pytest

from contract.priority import LEVELS, check_priority, level_of, raised
from contract.safe_transport import message_name, name_priority
from controller.fleet.queues import Raise, Waiting, depths, plan_raises


def test_names_and_numbers():
    assert LEVELS == {"urgent": 0, "high": 3, "normal": 6, "low": 9}  # kombu's redis PRIORITY_STEPS
    assert check_priority("low") == "low"
    with pytest.raises(ValueError, match="priority 'soon': use one of urgent, high, normal, low"):
        check_priority("soon")
    assert [level_of(n) for n in (None, 0, 2, 3, 5, 6, 8, 9, 200, "x")] == [
        "urgent", "urgent", "urgent", "high", "high", "normal", "normal", "low", "low", "normal"]
    assert [raised(n) for n in LEVELS] == [None, None, "high", "normal"]


def _w(level: str, asked: str, sent_at: float | None, handle: str = "h") -> Waiting:
    return Waiting("module.a", level, asked, sent_at, handle)


def test_a_run_is_raised_a_level_per_wait_up_to_high():
    now, after = 10_000.0, 100.0
    waiting = [_w("low", "low", now - 99), _w("low", "low", now - 100, "a"), _w("low", "low", now - 250, "b"),
               _w("low", "low", now - 900, "c"), _w("normal", "low", now - 150, "d"),  # raised once already
               _w("normal", "normal", now - 100, "e"), _w("high", "high", now - 900), _w("urgent", "urgent", now),
               _w("low", "", now - 900), _w("low", "low", None)]  # another sender's message: never moved
    assert plan_raises(waiting, now, after) == [
        Raise(waiting[1], "normal"), Raise(waiting[2], "high"), Raise(waiting[3], "high"), Raise(waiting[5], "high")]
    assert plan_raises(waiting, now, 0) == []


def test_a_held_run_stays_while_the_reservation_lasts_and_goes_back_up_after():
    now = 10_000.0
    bobs = Waiting("module.a", "low", "urgent", now - 10, "h", "module.a:r1", user="bob")  # put at low by agent.hold
    anns = Waiting("module.a", "normal", "low", now - 900, "h2", "module.a:r2", user="ann")
    assert plan_raises([bobs, anns], now, 100, {"module.a": "ann"}) == [Raise(anns, "high")]  # the holder's: raised
    assert plan_raises([bobs, anns], now, 100, {"module.b": "ann"}) == [Raise(bobs, "urgent"), Raise(anns, "high")]
    assert plan_raises([bobs], now, 0) == [Raise(bobs, "urgent")]  # back to what it asked, raises off or not


def test_depths_count_every_level_of_every_queue():
    ws = [_w("low", "low", 1.0), _w("low", "low", 2.0), _w("urgent", "urgent", 3.0),
          Waiting("module.z", "low", "low", 1.0, "x")]
    assert depths(ws, ["module.a", "module.b"]) == {
        "module.a": {"urgent": 1, "high": 0, "normal": 0, "low": 2},
        "module.b": {"urgent": 0, "high": 0, "normal": 0, "low": 0}}


def test_message_names_sort_by_priority_then_time():
    names = [message_name(9, "module.a", 5), message_name(6, "module.a", 7), message_name(0, "module.a", 9),
             message_name(6, "module.a", 6), message_name(6, "module.a", 10**19)]
    assert [(name_priority(n), int(n.split("_")[1])) for n in sorted(names)] == [
        (0, 9), (6, 6), (6, 7), (6, 10**19), (9, 5)]
    assert all(n.partition(".")[2] == "module.a.msg" for n in names)  # kombu's reader finds the queue
    assert name_priority("1733_uuid.module.a.msg") is None  # kombu's own name: no priority digit
    assert message_name(42, "q", 1).startswith("9_") and message_name(-1, "q", 1).startswith("0_")


def test_the_embedded_broker_hands_out_the_highest_priority_first(tmp_path):
    """Three low messages, then an urgent one, a normal one and one without a priority, through kombu's own
    producer and reader on the fleet's filesystem transport: the reader takes them by priority, then in order."""
    from kombu import Connection, Exchange, Queue

    folder = tmp_path / "q"
    folder.mkdir()
    opts = {"data_folder_in": str(folder), "data_folder_out": str(folder), "control_folder": str(tmp_path / "c"),
            "store_processed": False}
    with Connection(transport="contract.safe_transport:FilesystemTransport", transport_options=opts) as conn:
        q = Queue("module.a", Exchange("module.a", type="direct"), routing_key="module.a")
        producer = conn.Producer()
        sent = [("low-1", 9), ("low-2", 9), ("low-3", 9), ("urgent", 0), ("normal", 6), ("none", None)]
        for body, pri in sent:
            producer.publish(body, exchange=q.exchange, routing_key="module.a", declare=[q],
                             **({"priority": pri} if pri is not None else {}))
        simple = conn.SimpleQueue(q)
        got = []
        for _ in sent:
            m = simple.get(timeout=1)
            got.append(m.payload)
            m.ack()
        simple.close()
    assert got == ["urgent", "none", "normal", "low-1", "low-2", "low-3"]


def test_wait_figures_and_durations():
    from controller.history.waits import shown_duration
    from controller.service.queue import WaitStats, wait_stats, waits_line

    stats = wait_stats([("low", 10.0), ("urgent", 1.0), ("low", 30.0), ("low", 20.0), ("mystery", 5.0)])
    assert stats == (WaitStats("urgent", 1, 1.0, 1.0, 1.0), WaitStats("low", 3, 20.0, 28.0, 30.0),
                     WaitStats("mystery", 1, 5.0, 5.0, 5.0))
    assert [shown_duration(x) for x in (None, 44.6, 60, 3599, 4320, 90000)] == [
        "", "45 s", "1 min", "59 min", "1 h 12 min", "1 d 1 h"]
    assert waits_line(()) == "waited: no run has started yet"
    assert waits_line(stats[:1]) == "waited (dispatch to start): urgent median 1 s, p90 1 s, longest 1 s (n=1)"
