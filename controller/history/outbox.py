"""The run history's webhook outbox: targets seen, events pending for them, what was delivered.

A verdict recorded queues its event in the same transaction (:meth:`History.set_run_state`);
``fleetctl serve`` sends what is pending. Webhook URLs may carry secrets: only their sha256 is stored.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

from controller.history.records import VERDICT_EVENT, OutboxEvent, url_digest

if TYPE_CHECKING:
    from controller.history.db import Database


class WebhookOutbox:
    """The outbox's reads and writes, a base of :class:`controller.history.History`."""

    db: Database

    if TYPE_CHECKING:
        def tx(self) -> AbstractContextManager[Database]: ...

    def webhook_targets(self, urls: Iterable[str]) -> dict[str, float]:
        """sha256 of each URL -> when this history first saw it as a target (recorded now if new)."""
        now = time.time()
        digests = [url_digest(u) for u in urls]
        with self.tx() as c:
            c.executemany("INSERT INTO webhook_targets (url_sha256, first_seen) VALUES (?, ?) ON CONFLICT DO NOTHING",
                          [(d, now) for d in digests])
            got = dict(c.execute("SELECT url_sha256, first_seen FROM webhook_targets"))
        return {d: float(got[d]) for d in digests}

    def pending_webhooks(self, targets: dict[str, float], *, max_age: float, limit: int = 100) -> list[OutboxEvent]:
        """Events not yet delivered to (nor given up for) some target, queued after that target was first
        seen and at most ``max_age`` s ago; oldest first."""
        if not targets:
            return []
        floor = max(time.time() - max_age, min(targets.values()))
        cur = self.db.execute("SELECT run_id, event, verdict, line, state, created_at, payload FROM webhook_outbox"
                              " WHERE created_at >= ? ORDER BY created_at LIMIT ?", (floor, limit * 4))
        out: list[OutboxEvent] = []
        for run_id, event, verdict, line, state, created, payload in cur.fetchall():
            done = {r[0] for r in self.db.execute(
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
            c.execute("INSERT INTO webhook_outbox (run_id, event, verdict, line, state, created_at, payload)"
                      " VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                      (run_id, event, verdict, line, state, time.time(), payload))

    def mark_webhook(self, run_id: str, event: str, url_sha256: str, outcome: str) -> None:
        """``outcome``: delivered or given_up (either way not sent again)."""
        with self.tx() as c:
            c.execute("INSERT INTO webhook_sent (run_id, event, url_sha256, outcome, at) VALUES (?, ?, ?, ?, ?)"
                      " ON CONFLICT (run_id, event, url_sha256) DO UPDATE SET outcome=excluded.outcome, at=excluded.at",
                      (run_id, event, url_sha256, outcome, time.time()))

    def claim_webhooks(self, run_id: str, event: str, url_sha256s: Sequence[str], holder: str,
                       lease: float) -> list[str]:
        """Of the event's targets, those this sender (``holder``) may deliver to now: not delivered nor given up,
        and claimed by no other sender in the last ``lease`` s (a sender that died mid-delivery loses its claim
        when the lease ends). Several ``fleetctl serve`` on one history thus send each event to a URL once."""
        now = time.time()
        got: list[str] = []
        # writers take turns: the look and the claim are one step
        with self.tx() as c:
            for d in url_sha256s:
                if c.execute("SELECT 1 FROM webhook_sent WHERE run_id=? AND event=? AND url_sha256=?",
                             (run_id, event, d)).fetchone():
                    continue
                cur = c.execute(
                    "INSERT INTO webhook_claims (run_id, event, url_sha256, holder, until) VALUES (?, ?, ?, ?, ?)"
                    " ON CONFLICT (run_id, event, url_sha256) DO UPDATE SET holder=excluded.holder,"
                    " until=excluded.until WHERE webhook_claims.until < ? OR webhook_claims.holder=excluded.holder",
                    (run_id, event, d, holder, now + lease, now))
                if cur.rowcount == 1:
                    got.append(d)
        return got

    def webhook_outcomes(self, run_id: str) -> dict[str, str]:
        """url sha256 -> delivered / given_up, for the run's verdict event."""
        return dict(self.db.execute("SELECT url_sha256, outcome FROM webhook_sent WHERE run_id=? AND event=?",
                                    (run_id, VERDICT_EVENT)))
