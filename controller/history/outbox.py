"""The run history's webhook outbox: targets seen, events pending for them, what was delivered.

A verdict recorded queues its event in the same transaction (:meth:`History.set_run_state`);
``fleetctl serve`` sends what is pending. Webhook URLs may carry secrets: only their sha256 is stored.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from controller.history.records import VERDICT_EVENT, OutboxEvent, url_digest


class WebhookOutbox:
    """The outbox's reads and writes, a base of :class:`controller.history.History`."""

    conn: sqlite3.Connection

    if TYPE_CHECKING:
        def tx(self) -> AbstractContextManager[sqlite3.Connection]: ...

    def webhook_targets(self, urls: Iterable[str]) -> dict[str, float]:
        """sha256 of each URL -> when this history first saw it as a target (recorded now if new)."""
        now = time.time()
        digests = [url_digest(u) for u in urls]
        with self.tx() as c:
            c.executemany("INSERT OR IGNORE INTO webhook_targets (url_sha256, first_seen) VALUES (?, ?)",
                          [(d, now) for d in digests])
            got = dict(c.execute("SELECT url_sha256, first_seen FROM webhook_targets"))
        return {d: float(got[d]) for d in digests}

    def pending_webhooks(self, targets: dict[str, float], *, max_age: float, limit: int = 100) -> list[OutboxEvent]:
        """Events not yet delivered to (nor given up for) some target, queued after that target was first
        seen and at most ``max_age`` s ago; oldest first."""
        if not targets:
            return []
        floor = max(time.time() - max_age, min(targets.values()))
        cur = self.conn.execute("SELECT run_id, event, verdict, line, state, created_at, payload FROM webhook_outbox"
                                " WHERE created_at >= ? ORDER BY created_at LIMIT ?", (floor, limit * 4))
        out: list[OutboxEvent] = []
        for run_id, event, verdict, line, state, created, payload in cur.fetchall():
            done = {r[0] for r in self.conn.execute(
                "SELECT url_sha256 FROM webhook_sent WHERE run_id=? AND event=?", (run_id, event))}
            urls = tuple(d for d, first in targets.items() if d not in done and created >= first)
            if urls:
                out.append(OutboxEvent(run_id=run_id, event=event, verdict=verdict, line=line, state=state,
                                       created_at=created, urls=urls, payload=payload))
            if len(out) >= limit:
                break
        return out

    def queue_webhook(self, run_id: str, event: str, verdict: str, line: str, state: str, payload: str) -> None:
        """Queue an event other than a verdict (``payload``: its JSON beyond the run's summary), once per run."""
        with self.tx() as c:
            c.execute("INSERT OR IGNORE INTO webhook_outbox (run_id, event, verdict, line, state, created_at, payload)"
                      " VALUES (?, ?, ?, ?, ?, ?, ?)", (run_id, event, verdict, line, state, time.time(), payload))

    def mark_webhook(self, run_id: str, event: str, url_sha256: str, outcome: str) -> None:
        """``outcome``: delivered or given_up (either way not sent again)."""
        with self.tx() as c:
            c.execute("INSERT OR REPLACE INTO webhook_sent (run_id, event, url_sha256, outcome, at)"
                      " VALUES (?, ?, ?, ?, ?)", (run_id, event, url_sha256, outcome, time.time()))

    def webhook_outcomes(self, run_id: str) -> dict[str, str]:
        """url sha256 -> delivered / given_up, for the run's verdict event."""
        return dict(self.conn.execute("SELECT url_sha256, outcome FROM webhook_sent WHERE run_id=? AND event=?",
                                      (run_id, VERDICT_EVENT)))
