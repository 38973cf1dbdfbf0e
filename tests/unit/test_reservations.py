"""Reservations' pure parts (issue 32 item 2): durations, the records read back, which modules another user
holds and why (what dispatch records as their refusal), a reserve's plan, and that a module's ACL reaches only its own
reservation, read-only."""

from __future__ import annotations

import fnmatch
import time
from collections.abc import Iterator
from typing import Any

import pytest

from contract.kv import reservation_key
from controller.fleet.reservations import (
    Reservation,
    held,
    others,
    parse_duration,
    plan_reserve,
    shown_until,
    split_reserved,
    taken_line,
)

NOW = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC


@pytest.fixture(autouse=True)
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """HH:MM on the controller's clock: UTC here, so the lines are exact."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize(("text", "seconds"), [("30m", 1800.0), ("2h", 7200.0), ("1d", 86400.0), ("45s", 45.0),
                                               ("1.5h", 5400.0), (" 3s ", 3.0), ("30d", 30 * 86400.0)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["2", "h", "0m", "-1h", "2 hours", "2H", "", "1h30m"])
def test_a_duration_without_a_number_and_a_unit_is_refused(text: str) -> None:
    with pytest.raises(ValueError) as e:
        parse_duration(text)
    assert str(e.value) == f"duration {text!r}: give a number and a unit s, m, h or d (30m, 2h, 1d)"


def test_a_reservation_longer_than_a_month_is_refused() -> None:
    with pytest.raises(ValueError, match=r"^duration '31d': at most 30 days$"):
        parse_duration("31d")


def test_records_past_their_end_or_unreadable_are_no_reservation() -> None:
    records: dict[str, dict[str, Any]] = {
        "a": {"user": "ann", "until": NOW + 60, "reason": "flash", "id": "res-1", "since": NOW - 5},
        "b": {"user": "bob", "until": NOW - 1},  # over: the embedded broker still has the file
        "c": {"until": NOW + 60},  # no user
        "d": {"user": "dan", "until": "soon"}}
    assert held(records, NOW) == {"a": Reservation("a", "ann", NOW + 60, "flash", "res-1", NOW - 5)}
    a = Reservation.of("a", records["a"])
    assert a is not None and a.record() == records["a"]


def test_only_modules_another_user_holds_are_refused_with_who_and_until_when() -> None:
    res = {"sim-01": Reservation("sim-01", "ann", NOW + 3600, "flash fw"),
           "sim-03": Reservation("sim-03", "bob", NOW + 600)}
    assert others(["sim-01", "sim-02", "sim-03"], res, "bob", NOW) == {
        "sim-01": "reserved by ann until 23:13 (flash fw)"}
    assert others(["sim-01", "sim-02", "sim-03"], res, "carl", NOW) == {
        "sim-01": "reserved by ann until 23:13 (flash fw)", "sim-03": "reserved by bob until 22:23"}
    assert others(["sim-02"], res, "carl", NOW) == {}
    held = {"sim-01": "reserved by ann until 23:13"}
    # skip: left out while another selected module is free; waited on when none is; wait: always waited on
    assert split_reserved(held, 3, "skip") == (held, {})
    assert split_reserved(held, 1, "skip") == ({}, held)
    assert split_reserved(held, 3, "wait") == ({}, held)
    assert split_reserved({}, 3, "skip") == ({}, {})


def test_an_end_more_than_a_day_away_shows_its_date() -> None:
    assert shown_until(NOW + 2 * 86400, NOW) == "2023-11-16 22:13"
    assert shown_until(NOW + 60, NOW) == "22:14"


def test_a_reserve_is_written_whole_or_not_at_all() -> None:
    current = {"sim-01": Reservation("sim-01", "ann", NOW + 60, "flash", "res-old", NOW - 100)}
    todo, taken = plan_reserve(["sim-01", "sim-02"], current, "bob", NOW, 7200, "", "res-new")
    assert (todo, taken) == ([], current)
    assert taken_line(taken, NOW) == "sim-01 is reserved by ann until 22:14 (flash): not reserved"
    # the same user extends: its id, start and reason kept; a module not held yet is new
    todo, taken = plan_reserve(["sim-01", "sim-02"], current, "ann", NOW, 7200, "", "res-new")
    assert taken == {}
    assert todo == [Reservation("sim-01", "ann", NOW + 7200, "flash", "res-old", NOW - 100),
                    Reservation("sim-02", "ann", NOW + 7200, "", "res-new", NOW)]
    todo, _ = plan_reserve(["sim-01"], current, "ann", NOW, 60, "demo", "res-new")
    assert todo == [Reservation("sim-01", "ann", NOW + 60, "demo", "res-old", NOW - 100)]


def _redis_glob(pattern: str) -> str:
    return pattern.replace("[^", "[!")  # Redis negates a class with ^, fnmatch with !


def test_a_module_reads_only_its_own_reservation() -> None:
    """A module reads its own reservation (it holds another user's work while it lasts), read-only; it reaches no
    other module's."""
    from controller.remote.acl import module_key_patterns, module_read_only_patterns

    for module in ("sim-01", "reserve", "m"):
        for pats, key, reached in ((module_key_patterns(module), reservation_key(module), False),
                                   (module_read_only_patterns(module), reservation_key(module), True),
                                   (module_key_patterns(module) + module_read_only_patterns(module),
                                    reservation_key("sim-02"), False)):
            hits = [p for p in pats if fnmatch.fnmatchcase(key, _redis_glob(p))]
            assert bool(hits) is reached, (module, key, hits)
    assert reservation_key("sim-01") == "m1000-fleet:reserve:sim-01"
