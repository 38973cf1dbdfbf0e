"""Reservations of modules: a user's exclusive use of some modules until a time (``fleetctl reserve``).

Pure: the record, duration parsing, which of a selection's modules another user holds and why, and what a reserve
asks of the broker. The records live on the broker (:meth:`contract.kv.KV.put_reservation`, one per module, kept as
long as the reservation lasts), so every controller sharing the broker sees them and one made by a controller that
is gone still ends. Reading them is :meth:`Reservations.held` here; the service writes them
(:mod:`controller.service.reservations`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from contract.kv import KV

#: what a validation does with a selected module another user reserved (``fleetctl validate --on-reserved``)
OnReserved = Literal["skip", "wait"]
ON_RESERVED: tuple[OnReserved, ...] = ("skip", "wait")

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# a reservation longer than a month is a mistake (a lab is shared)
MAX_DURATION = 30 * 86400
_DURATION = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([smhd])\s*")


@dataclass(frozen=True)
class Reservation:
    """One module reserved by ``user`` until ``until`` (Unix time), made at ``since``; ``id`` is shared by the
    modules one ``reserve`` took, and kept when its user extends it."""

    module: str
    user: str
    until: float
    reason: str = ""
    id: str = ""
    since: float = 0.0

    def record(self) -> dict[str, Any]:
        """What the broker keeps (the module is the key's)."""
        return {"user": self.user, "until": self.until, "reason": self.reason, "id": self.id, "since": self.since}

    @classmethod
    def of(cls, module: str, value: Mapping[str, Any]) -> Reservation | None:
        """The record read back; None when it is not one (an unreadable value reads as no reservation)."""
        try:
            return cls(module, str(value["user"]), float(value["until"]), str(value.get("reason", "")),
                       str(value.get("id", "")), float(value.get("since", 0.0)))
        except (KeyError, TypeError, ValueError):
            return None

    def line(self, now: float | None = None) -> str:
        """``reserved by V until HH:MM (reason)``: what a refused module's record and a refused reserve say."""
        return f"reserved by {self.user} until {shown_until(self.until, now)}" + (
            f" ({self.reason})" if self.reason else "")


def shown_until(until: float, now: float | None = None) -> str:
    """``HH:MM`` on the controller's clock when ``until`` is within a day of ``now``, else ``YYYY-MM-DD HH:MM``."""
    now = time.time() if now is None else now
    return time.strftime("%H:%M" if until - now < 86400 else "%Y-%m-%d %H:%M", time.localtime(until))


def parse_duration(text: str) -> float:
    """``30m``, ``2h``, ``1d``, ``45s``, ``1.5h`` -> seconds; ValueError naming the text otherwise (pure)."""
    m = _DURATION.fullmatch(text)
    seconds = float(m.group(1)) * UNITS[m.group(2)] if m else 0.0
    if not m or seconds <= 0:
        raise ValueError(f"duration {text[:40]!r}: give a number and a unit s, m, h or d (30m, 2h, 1d)")
    if seconds > MAX_DURATION:
        raise ValueError(f"duration {text[:40]!r}: at most {MAX_DURATION // 86400} days")
    return seconds


def held(records: Mapping[str, Mapping[str, Any]], now: float) -> dict[str, Reservation]:
    """The reservations in force at ``now`` among the broker's records (one past its ``until`` is over) (pure)."""
    out: dict[str, Reservation] = {}
    for module, value in records.items():
        r = Reservation.of(module, value)
        if r is not None and r.until > now:
            out[module] = r
    return out


def others(modules: Iterable[str], reservations: Mapping[str, Reservation], user: str,
           now: float | None = None) -> dict[str, str]:
    """module -> why ``user``'s work may not start there (``reserved by V until HH:MM (reason)``), for each of
    ``modules`` another user holds (pure): what dispatch records as the module's refusal."""
    return {m: r.line(now) for m in modules if (r := reservations.get(m)) is not None and r.user != user}


def split_reserved(held: Mapping[str, str], selected: int, mode: OnReserved) -> tuple[dict[str, str], dict[str, str]]:
    """(refused, waiting): of the ``selected`` modules, those another user holds (``held``: module -> why, from
    :func:`others`) left out of the run, and those the run is queued on to wait for the reservation's end (pure).

    ``skip`` leaves them out while any selected module is free of other users' reservations, and waits on them
    when none is (the work waits rather than fails: the queue deadline ends it); ``wait`` queues on them all.
    """
    if mode == "wait" or len(held) >= selected:
        return {}, dict(held)
    return dict(held), {}


def plan_reserve(modules: Sequence[str], current: Mapping[str, Reservation], user: str, now: float, seconds: float,
                 reason: str, new_id: str) -> tuple[list[Reservation], dict[str, Reservation]]:
    """(the reservations to write, the modules another user holds) for ``user`` reserving ``modules`` for
    ``seconds`` from ``now`` (pure). A module ``user`` holds already is extended (its id and start kept; the
    reason replaced when one is given); nothing is written when another user holds any."""
    taken = {m: r for m in modules if (r := current.get(m)) is not None and r.user != user}
    if taken:
        return [], taken
    out = []
    for m in modules:
        mine = current.get(m)
        out.append(Reservation(m, user, now + seconds, reason or (mine.reason if mine else ""),
                               mine.id if mine and mine.id else new_id, mine.since if mine else now))
    return out, {}


def taken_line(taken: Mapping[str, Reservation], now: float | None = None) -> str:
    """The one line of a reserve refused: the first module another user holds, who and until when (pure)."""
    first, r = next(iter(taken.items()))
    more = f" (and {len(taken) - 1} more module(s) held by others)" if len(taken) > 1 else ""
    return f"{first} is {r.line(now)}{more}: not reserved"


class Reservations:
    """Reading the reservations from the broker: the fleet seam's part (``kv`` is the fleet's)."""

    kv: KV

    def held(self, modules: Iterable[str], now: float | None = None) -> dict[str, Reservation]:
        """module -> its reservation in force, for those of ``modules`` reserved (one round trip)."""
        return held(self.kv.reservations(modules), time.time() if now is None else now)
