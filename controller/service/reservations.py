"""Reservations through the service (``fleetctl reserve``, ``reservations``, ``unreserve``; the API's
``/api/v1/reservations``): who holds which module until when, on the broker, each reserve and release also an event
of the module in the run history (``fleetctl describe module`` shows who had it).

Enforced where work is sent: :func:`refused_for` is what :func:`controller.service.lifecycle.validate` (hence retry,
golden checks and bisection probes) leaves out or queues to wait (``--on-reserved``), and the golden schedule and
bisection do not pick a module another user holds; and on the module, which holds back another user's run queued
there until the reservation ends (:mod:`agent.hold`).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from typing import Any

from controller.fleet.reservations import Reservation, others, plan_reserve, shown_until, taken_line
from controller.fleet.states import CLOCK_SKEW_WARN
from controller.service.session import Conflict, NotFound, Session, broker_call

# the start of a module's event ``reserved by U until ... (reason) [id]``
RESERVED_EVENT = "reserved by"
RELEASED_EVENT = "released by"


def reservations(s: Session, selector: str = "all", *, now: float | None = None) -> list[Reservation]:
    """The reservations in force of the modules ``selector`` picks, in inventory order (never writes)."""
    mods = s.inventory().select(selector)
    fleet = s.broker(read=True)
    found = broker_call(s, lambda: fleet.held([m.name for m in mods], now))
    return [found[m.name] for m in mods if m.name in found]


def refused_for(s: Session, modules: Sequence[str], user: str, now: float | None = None) -> dict[str, str]:
    """module -> ``reserved by V until HH:MM (reason)`` for each of ``modules`` a user other than ``user`` holds
    (one MGET; the callers, about to send work, checked the broker already)."""
    fleet = s.fleet()
    return others(modules, broker_call(s, lambda: fleet.held(modules, now)), user, now)


def reserve(s: Session, selector: str, seconds: float, reason: str = "", *, user: str = "",
            now: float | None = None) -> list[Reservation]:
    """``user`` ('': the session's) reserves the modules ``selector`` picks for ``seconds`` from now: the ones it
    holds already are extended; refused (:class:`Conflict`, naming who holds it and until when) when another user
    holds any, and then nothing is written."""
    who = user or s.user
    mods = [m.name for m in s.inventory().select(selector)]
    fleet = s.broker()
    now = time.time() if now is None else now
    current = broker_call(s, lambda: fleet.held(mods, now))
    todo, taken = plan_reserve(mods, current, who, now, seconds, reason.strip(), "res-" + secrets.token_hex(4))
    if taken:
        raise Conflict(taken_line(taken, now))
    def write() -> None:
        for r in todo:
            fleet.kv.put_reservation(r.module, r.record(), r.until - now)

    broker_call(s, write)
    h = s.history()
    for r in todo:
        h.add_module_event(r.module, f"{RESERVED_EVENT} {who} until {shown_until(r.until, now)}"
                                     f"{f' ({r.reason})' if r.reason else ''} [{r.id}]")
    return todo


def clock_warning(s: Session) -> str:
    """A line when this controller's clock is off the broker's by more than ``CLOCK_SKEW_WARN`` ('' otherwise, and
    on the embedded broker): reservations are judged by the broker's clock, the times this controller shows by its
    own."""
    fleet = s.broker(read=True)
    off = broker_call(s, fleet.kv.broker_offset)
    if off is None or abs(off) <= CLOCK_SKEW_WARN:
        return ""
    return (f"this controller's clock is {abs(off):.0f} s {'behind' if off > 0 else 'ahead of'} the broker's: "
            "reservations end by the broker's clock; the times shown here are this machine's (fix its clock: NTP)")


def release(s: Session, selector: str = "all", *, user: str = "", force: bool = False) -> list[Reservation]:
    """End the reservations of the modules ``selector`` picks that ``user`` ('': the session's) holds; with
    ``force``, others' too (the API asks role admin for it). Without ``force``, a module named alone that another
    user holds is refused (:class:`Conflict`); with a selector of several, others' are left as they are."""
    who = user or s.user
    mods = [m.name for m in s.inventory().select(selector)]
    fleet = s.broker()
    current = broker_call(s, lambda: fleet.held(mods))
    mine = [r for r in current.values() if force or r.user == who]
    theirs = {m: r for m, r in current.items() if r.user != who}
    if not force and theirs and len(mods) == 1:
        (m, r), = theirs.items()
        raise Conflict(f"{m} is {r.line()}: not yours; unreserve it with --force")
    if not mine and len(mods) == 1 and not current:
        raise NotFound(f"{mods[0]} is not reserved")
    def drop() -> None:
        for r in mine:
            fleet.kv.drop_reservation(r.module)

    broker_call(s, drop)
    h = s.history()
    for r in mine:
        h.add_module_event(r.module, f"{RELEASED_EVENT} {who}" + (f" (reserved by {r.user})" if r.user != who else "")
                           + f" [{r.id}]")
    return mine


def reservation_events(s: Session, module: str) -> list[tuple[float, str]]:
    """The module's reserve and release events in the history, oldest first (never writes)."""
    if not s.has_history():
        return []
    return [(t, msg) for t, msg in s.history().module_events(module)
            if msg.startswith((RESERVED_EVENT, RELEASED_EVENT))]


def reservation_dict(r: Reservation, now: float | None = None) -> dict[str, Any]:
    """A reservation as the CLI's json/csv and the API show it."""
    now = time.time() if now is None else now
    return {"module": r.module, "user": r.user, "until": r.until, "until_local": shown_until(r.until, now),
            "left_s": round(max(0.0, r.until - now), 1), "reason": r.reason, "id": r.id, "since": r.since}
