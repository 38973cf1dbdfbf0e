"""What ``fleetctl serve`` can reach now, and how it waits for what it cannot (issue 48, ADR 0050).

``serve`` needs two parts beside itself: the run history (a PostgreSQL server, or a SQLite file) and the broker.
Either may go away (restarted, killed, a network cut) and come back; ``serve`` stays up meanwhile. :class:`Health`
records, per part, whether the last pass reached it, since when it did not and why (one line); the sync loop
(:mod:`controller.serve.daemon`) retries its pass with exponential backoff and jitter (tenacity) until it
succeeds, and the first pass that succeeds is the catch-up: every run the history holds as running is synced,
judged once ended, and its webhook sent from the history's outbox, as after any pass.

Meanwhile: ``GET /health`` says which part is down (200 ``ok``, 503 ``degraded``; no token: it says no more than
a part's state and the history's URL without its credentials), ``m1000_fleet_serve_part_up{part}`` says it to
Prometheus, and every API route that needs the run history answers 503 with the part's one line at once, without
trying it (a server that does not answer would hold each request for its connect timeout).
"""

from __future__ import annotations

import html
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from tenacity import RetryCallState, Retrying, retry_if_exception_type, wait_exponential_jitter

from contract.oneline import error_line
from controller.fleet import BrokerUnavailable
from controller.history import HistoryFull, HistoryStopped, HistoryUnavailable
from controller.serve.links import LINK_PREFIX
from controller.serve.wire import PAGES

PARTS = ("history", "broker")
NAMES = {"history": "run history", "broker": "broker"}
HEALTH_PATH = "/health"
# the waits between tries of a part that is down: 0.5 s, 1 s, 2 s ... up to 30 s, each with up to 0.5 s of jitter
# added (several services on one PostgreSQL history do not come back in step)
BACKOFF_FIRST = 0.5
BACKOFF_MAX = 30.0
# what a pass raises when a part is away, or when the history's server refuses its statements (its statement_timeout,
# its disk full): the pass is tried again with backoff either way
OUTAGE = (HistoryUnavailable, HistoryStopped, BrokerUnavailable)
# what stops every run's sync alike (a part away, the history's disk full): one run's own failure (a statement of its
# own past the statement_timeout) is said and the others go on
PART_DOWN = (HistoryUnavailable, HistoryFull, BrokerUnavailable)


@dataclass(frozen=True)
class PartState:
    """One part as ``serve`` saw it last: ``since`` (Unix time) it is up or down; ``reason``: why it is down;
    ``retry_at``: when ``serve`` tries it next (Unix time; None while up); ``answers``: down, but its server
    answers (it refused a statement: its statement_timeout, its disk full), so reads may still succeed."""

    part: str
    up: bool
    since: float
    reason: str = ""
    retry_at: float | None = None
    answers: bool = False

    def line(self, now: float) -> str:
        """One line for a person (an API error, a log)."""
        name = NAMES.get(self.part, self.part)
        if self.up:
            return f"{name} reachable"
        when = time.strftime("%H:%M:%S", time.localtime(self.since))
        retry = f"; fleetctl serve tries again in {max(0, round(self.retry_at - now))} s" \
            if self.retry_at is not None else ""
        what = "failing" if self.answers else "unreachable"
        return f"{name} {what} since {when} ({round(now - self.since)} s): {self.reason}{retry}"

    def as_json(self, now: float) -> dict[str, Any]:
        retry = None if self.retry_at is None else max(0.0, round(self.retry_at - now, 1))
        return {"up": self.up, "answers": self.up or self.answers, "since": self.since,
                "for_s": round(now - self.since, 1), "reason": self.reason or None, "retry_in_s": retry}


class Health:
    """The parts' states, shared by the sync loop (which writes them) and the API and /metrics threads."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        now = clock()
        self._parts = {p: PartState(p, True, now) for p in PARTS}

    def state(self, part: str) -> PartState:
        with self._lock:
            return self._parts[part]

    def states(self) -> dict[str, PartState]:
        with self._lock:
            return dict(self._parts)

    def is_down(self, part: str) -> bool:
        return not self.state(part).up

    def down(self, part: str, reason: str, retry_at: float | None = None, *, answers: bool = False) -> bool:
        """Record ``part`` down (its reason and next try updated; ``answers``: its server answers but refused a
        statement); whether it was up until now."""
        with self._lock:
            cur = self._parts[part]
            self._parts[part] = PartState(part, False, cur.since if not cur.up else self.clock(), reason, retry_at,
                                          answers)
            return cur.up

    def unreachable(self, part: str) -> bool:
        """Down, and its server does not answer (what the API's history routes refuse at once)."""
        st = self.state(part)
        return not st.up and not st.answers

    def up(self, part: str) -> float | None:
        """Record ``part`` reachable; how long it was down (None: it was up)."""
        with self._lock:
            cur = self._parts[part]
            if cur.up:
                return None
            now = self.clock()
            self._parts[part] = replace(cur, up=True, since=now, reason="", retry_at=None)
            return now - cur.since

    def degraded(self) -> list[str]:
        return [p for p, st in self.states().items() if not st.up]

    def as_json(self) -> dict[str, Any]:
        now = self.clock()
        states = self.states()
        return {"status": "degraded" if any(not s.up for s in states.values()) else "ok",
                "parts": {p: s.as_json(now) for p, s in states.items()}}


def part_of(exc: BaseException) -> str:
    """Which part an outage is of."""
    return "broker" if isinstance(exc, BrokerUnavailable) else "history"


def note_outage(health: Health, exc: BaseException, retry_at: float | None = None) -> str:
    """Record what a failed pass says: the part it names is down; a broker outage also says the history answered
    (a pass reads the history first). The part."""
    part = part_of(exc)
    health.down(part, error_line(exc), retry_at, answers=isinstance(exc, HistoryStopped))
    if part == "broker":
        health.up("history")
    return part


def until_reached(attempt: Callable[[], Any], health: Health, stop: threading.Event,
                  said: Callable[[str], None]) -> bool:
    """Call ``attempt`` until it raises no outage (:data:`OUTAGE`), waiting with exponential backoff and jitter
    between tries (tenacity; ``stop`` ends the waits at once); each failure recorded in ``health``, each part
    that goes down said once through ``said``. Whether it succeeded (False: ``stop`` was set first)."""

    def before_sleep(rs: RetryCallState) -> None:
        exc = rs.outcome.exception() if rs.outcome is not None else None
        if exc is None:
            return
        was_up = not health.is_down(part_of(exc))
        part = note_outage(health, exc, time.time() + (rs.next_action.sleep if rs.next_action else 0.0))
        if was_up:
            said(f"{health.state(part).line(health.clock())}; serving degraded until it is back")

    def sleep(seconds: float) -> None:
        stop.wait(seconds)

    retrying = Retrying(wait=wait_exponential_jitter(multiplier=BACKOFF_FIRST, max=BACKOFF_MAX, jitter=0.5),
                        retry=retry_if_exception_type(OUTAGE), stop=lambda _: stop.is_set(),
                        sleep=sleep, before_sleep=before_sleep, reraise=True)
    try:
        for tried in retrying:
            with tried:
                attempt()
    except OUTAGE:
        return False  # stopped while a part was down
    for part in PARTS:
        was = health.up(part)
        if was is not None:
            said(f"{NAMES[part]} reachable again after {was:.0f} s: catching up")
    return True


def needs_history(path: str, prefix: str) -> bool:
    """Whether an API path reads or writes the run history (the reservations are the broker's alone; a signed
    link's report is the history's)."""
    if path.startswith(LINK_PREFIX + "/"):
        return True
    # the run browser's pages, but its login and the queue (the broker's)
    if path.startswith(PAGES + "/"):
        return path.split("/")[2] not in ("login", "logout", "queue")
    return path.startswith(prefix + "/") and path != f"{prefix}/openapi.json" \
        and not path.startswith(f"{prefix}/reservations")


class DegradedGate:
    """ASGI middleware: a request that needs the run history while ``serve`` holds it down is answered 503 with
    the part's one line and a ``Retry-After``, at once (inside the token check: an anonymous caller learns
    nothing more)."""

    def __init__(self, app: Any, health: Health, prefix: str) -> None:
        self.app = app
        self.health = health
        self.prefix = prefix

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and self.health.unreachable("history") and needs_history(scope["path"],
                                                                                           self.prefix):
            from fastapi.responses import HTMLResponse, JSONResponse

            st = self.health.state("history")
            now = self.health.clock()
            headers = {"Retry-After": str(max(1, round((st.retry_at or now) - now)))}
            if scope["path"].startswith(PAGES + "/"):  # a person's page: the line, readable, and a reload later
                page = (f"<!doctype html><html lang=en><meta charset=utf-8><title>m1000-fleet: degraded</title>"
                        f"<h1>The run history is unreachable</h1><p>{html.escape(st.line(now))}</p>"
                        f"<p>This page answers again once it is back: reload it then.</p></html>")
                await HTMLResponse(page, status_code=503, headers=headers)(scope, receive, send)
                return
            await JSONResponse({"detail": st.line(now)}, status_code=503, headers=headers)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def add_health(app: Any, health: Health, prefix: str) -> None:
    """``GET /health`` and the 503 gate of the routes that need the run history, on the API ``app``."""
    from fastapi.responses import JSONResponse

    app.add_middleware(DegradedGate, health=health, prefix=prefix)

    @app.get(HEALTH_PATH, include_in_schema=False)
    def _health() -> JSONResponse:
        body = health.as_json()
        return JSONResponse(body, status_code=200 if body["status"] == "ok" else 503)
