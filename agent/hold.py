"""Another user's work waits while a module is reserved (``fleetctl reserve``): the module enforces it.

The controller leaves a module another user reserved out of the runs it dispatches, or queues a run there to wait
for the reservation's end (``validate --on-reserved wait``); work queued before the reservation is on the queue
already. So when a run's message arrives, the agent reads its own reservation record and the run's cancel flags
(one MGET: the record is read-only for the module in its ACL) before it touches anything of the run. While a user
other than the run's (the message's ``fleet-user`` header) holds it, the agent puts the message back on its queue at
the lowest priority at once, its headers kept (who started it, when it was sent, what priority it asked for), and
waits up to :data:`HOLD_S` before it takes the next one (less when the reservation ends), so that a module with
nothing else queued does not spin and ``fleetctl queue`` sees the run waiting; the holder's work, queued behind it,
starts first (a run the holder sends meanwhile waits those seconds at most). Nothing of the run is touched while it
waits: no state, no attempt counted, no outbox entry dropped. A cancelled run is not held (it ends at once, as
cancelled).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from contract.kv import KV, held_for_other
from contract.priority import USER

log = logging.getLogger("fleet.agent")

# how long one delivery waits for a reservation to end before the message goes back on the queue
HOLD_S = 5.0
POLL_S = 1.0  # how often it reads the record meanwhile


@dataclass(frozen=True)
class Held:
    """The reservation a run's delivery waited for: who holds the module, until when (Unix time)."""

    user: str
    until: float

    def line(self) -> str:
        return f"module reserved by {self.user} until {time.strftime('%Y-%m-%d %H:%M', time.localtime(self.until))}"


def check(kv: KV, run_id: str, module: str, user: str, now: float) -> Held | None:
    """The reservation holding ``user``'s run back now, or None (free, ``user``'s own, or the run is cancelled)."""
    record, cancel = kv.reservation_and_cancel(run_id, module)
    held = held_for_other(record, user, now)
    return Held(*held) if held is not None and cancel is None else None


def held_back(kv: KV, run_id: str, module: str, headers: Mapping[str, Any], now: float) -> Held | None:
    """The reservation holding the run of this delivery back (``headers``: the message's), or None. A broker that
    cannot be read holds nothing back (the run's own checks then meet the same broker)."""
    try:
        return check(kv, run_id, module, str(headers.get(USER) or ""), now)
    except Exception as exc:  # broker briefly away: not a reason to keep work back
        log.warning("cannot read the reservation of %s: %s", module, exc)
        return None


def linger(kv: KV, run_id: str, module: str, headers: Mapping[str, Any], *, stop: Callable[[], bool],
           hold_s: float = HOLD_S, poll_s: float = POLL_S, clock: Callable[[], float] = time.time,
           sleep: Callable[[float], None] = time.sleep) -> float:
    """After a held run went back on the queue: wait up to ``hold_s`` before the worker takes its next message,
    so that a module with nothing else queued does not spin on the held one (which ``fleetctl queue`` shows
    meanwhile). Ends early when the reservation ends or ``stop()`` (the agent shutting down). The seconds waited."""
    start = clock()
    while clock() - start < hold_s and not stop():
        sleep(min(poll_s, hold_s - (clock() - start)))
        if held_back(kv, run_id, module, headers, clock()) is None:
            break
    return clock() - start
