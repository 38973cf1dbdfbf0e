"""What waits on the modules' queues, by priority, and the raise of runs that waited too long.

The one place the controller looks inside the broker's queues (kombu has no API for it). On Redis a queue is one
list per priority step (kombu's ``module.M``, ``module.M\\x06\\x16<n>``); on the embedded broker one file a
message, named ``<priority>_<ns>_<uuid>.<queue>.msg`` (:func:`contract.safe_transport.message_name`). Each message
the controller sent carries headers of its own (:data:`contract.priority.HEADERS`): when it was sent and the
priority it was asked for, so the planner (:func:`plan_raises`, pure) knows how long it waited without the history
(and who started it: a module another user reserved holds it back, :mod:`agent.hold`). A raise moves the message to
the front of the level above, in one step the agent cannot split: a Lua script on Redis (LREM, then RPUSH only if
the LREM took it), a rename on the filesystem; a message the agent took meanwhile is not moved.

Lazy imports: :mod:`contract.safe_transport` loads kombu (its connection: 72 ms of CPU, ``bench/import_costs.py``,
bench/results/import_costs_20261207_0346_lazy-libraries.txt), imported where a queue is read:
:mod:`controller.fleet` imports this module for verbs that read no queue (tests/cli/test_lean_verbs.py).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from contract.priority import ASKED, LEVELS, SENT_AT, USER, level_of, raised

log = logging.getLogger("fleet.controller")

# LREM the exact item; RPUSH it (rewritten) onto the higher list only if the LREM found it (not popped meanwhile)
_MOVE = ("if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 1 then redis.call('RPUSH', KEYS[2], ARGV[2]) return 1 end "
         "return 0")


# every list named, in one round trip (a serve pass reads the queues of the whole fleet every few seconds)
_READ = "local out = {} for i, k in ipairs(KEYS) do out[i] = redis.call('LRANGE', k, 0, -1) end return out"


@dataclass(frozen=True)
class Waiting:
    """One message waiting on a module's queue: its level now, what it was asked for, since when."""

    queue: str
    level: str
    asked: str
    sent_at: float | None
    # the Redis item or the message file's name: what a move takes out
    handle: str
    # Celery's (``<module>:<run id>`` for a run: contract.celery_app.task_id)
    task_id: str = ""
    # who started the run (the message's header; "" when it has none)
    user: str = ""

    @property
    def run_id(self) -> str:
        return self.task_id.partition(":")[2]


@dataclass(frozen=True)
class Raise:
    message: Waiting
    to: str


def plan_raises(waiting: Iterable[Waiting], now: float, raise_after: float,
                holders: Mapping[str, str] | None = None) -> list[Raise]:
    """The messages to raise (pure): one that waited ``raise_after`` since it was sent is one level above what it
    was asked for, two such waits two levels, up to ``high`` (:func:`contract.priority.raised`); ``raise_after``
    <= 0: none is raised past what it asked for. Only upward; a message without the controller's headers (another
    sender's) stays. ``holders``: queue -> the user whose reservation holds its module: a message of another user
    there stays where it is (its module put it back at ``low``, :mod:`agent.hold`), and goes back up to what it
    asked for once the reservation has ended."""
    out: list[Raise] = []
    order = list(LEVELS)
    holders = holders or {}
    for w in waiting:
        if w.sent_at is None or w.asked not in LEVELS or holders.get(w.queue, w.user) != w.user:
            continue
        target = w.asked
        for _ in range(int(max(0.0, now - w.sent_at) // raise_after) if raise_after > 0 else 0):
            up = raised(target)
            if up is None:
                break
            target = up
        if order.index(target) < order.index(w.level):
            out.append(Raise(w, target))
    return out


def depths(waiting: Iterable[Waiting], queues: Sequence[str]) -> dict[str, dict[str, int]]:
    """queue -> level -> messages waiting (every level of every queue named, 0 where none)."""
    out = {q: dict.fromkeys(LEVELS, 0) for q in queues}
    for w in waiting:
        if w.queue in out:
            out[w.queue][w.level] += 1
    return out


# --------------------------------------------------------------------------- the broker seam
def read_waiting(channel: Any, queues: Sequence[str]) -> list[Waiting]:
    """Every message waiting on ``queues``, highest level first, oldest first within a level (the order the
    agent takes them). A transport other than Redis and the embedded one: none (nothing known)."""
    from contract.safe_transport import FilesystemChannel

    if isinstance(channel, FilesystemChannel):
        return _files_waiting(channel, queues)
    if hasattr(channel, "sep") and hasattr(channel, "client"):  # kombu's redis channel (and the Sentinel one)
        return _redis_waiting(channel, queues)
    return []


def move(channel: Any, r: Raise) -> bool:
    """Raise one message (:func:`plan_raises`); False when the agent took it first."""
    from contract.safe_transport import FilesystemChannel

    if isinstance(channel, FilesystemChannel):
        folder = str(channel.data_folder_in)
        new = f"{LEVELS[r.to]}{r.message.handle[1:]}"
        try:
            os.rename(os.path.join(folder, r.message.handle), os.path.join(folder, new))
        except FileNotFoundError:
            return False
        return True
    item = json.loads(r.message.handle)
    item.setdefault("properties", {})["priority"] = LEVELS[r.to]
    src, dst = (_redis_key(channel, r.message.queue, LEVELS[n]) for n in (r.message.level, r.to))
    return bool(channel.client.eval(_MOVE, 2, src, dst, r.message.handle, json.dumps(item)))


def _redis_key(channel: Any, queue: str, number: int) -> str:
    """kombu's list for ``queue`` at a priority step (``Channel._q_for_pri``: the bare name for step 0)."""
    return f"{queue}{channel.sep}{number}" if number else queue


def _headers(message: Any) -> tuple[str, float | None, str, str]:
    """(priority asked for, when sent, task id, user) from a message's headers; "", None, "", "" where absent."""
    h = message.get("headers") if isinstance(message, dict) else None
    h = h if isinstance(h, dict) else {}
    asked, sent, tid, user = h.get(ASKED), h.get(SENT_AT), h.get("id"), h.get(USER)
    return (asked if isinstance(asked, str) else "",
            float(sent) if isinstance(sent, int | float) and not isinstance(sent, bool) else None,
            tid if isinstance(tid, str) else "", user if isinstance(user, str) else "")


def _redis_waiting(channel: Any, queues: Sequence[str]) -> list[Waiting]:
    slots = [(q, n) for q in queues for n in sorted(LEVELS.values())]
    if not slots:
        return []
    lists = channel.client.eval(_READ, len(slots), *(_redis_key(channel, q, n) for q, n in slots))
    out: list[Waiting] = []
    for (q, n), items in zip(slots, lists, strict=True):
        for raw in reversed(items):  # LPUSH in, BRPOP from the right: the oldest is last
            text = raw.decode() if isinstance(raw, bytes) else str(raw)
            try:
                asked, sent, tid, user = _headers(json.loads(text))
            except ValueError:
                asked, sent, tid, user = "", None, "", ""
            out.append(Waiting(q, level_of(n), asked, sent, text, tid, user))
    return out


def _files_waiting(channel: Any, queues: Sequence[str]) -> list[Waiting]:
    from contract.safe_transport import name_priority

    folder = str(channel.data_folder_in)
    wanted = {f"{q}.msg": q for q in queues}
    out: list[Waiting] = []
    for name in sorted(os.listdir(folder)):
        q = wanted.get(name.partition(".")[2])
        if q is None:
            continue
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as fh:
                asked, sent, tid, user = _headers(json.load(fh))
        except (OSError, ValueError):  # taken meanwhile, or not a message
            continue
        out.append(Waiting(q, level_of(name_priority(name)), asked, sent, name, tid, user))
    return out
