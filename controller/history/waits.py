"""How long a run's module parts waited on their queues, from dispatch to start, and behind which run (the run
history's figures; ``fleetctl status``, the report's notes and ``fleetctl queue`` print them)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from controller.history.store import History


def shown_duration(seconds: float | None) -> str:
    """``45 s``, ``12 min``, ``1 h 12 min``, ``2 d 3 h`` (pure)."""
    if seconds is None:
        return ""
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} d {s % 86400 // 3600} h"


@dataclass(frozen=True)
class RunWait:
    module: str
    priority: str
    waited_s: float
    # the run that module ended last before this one started (None: it was idle)
    behind: str | None


def run_waits(h: History, run_id: str) -> tuple[RunWait, ...]:
    """How long each module's part of ``run_id`` waited from dispatch to start, and behind which run."""
    info = h.find_run(run_id)
    since = info.dispatched_at or info.created_at
    return tuple(RunWait(m, p, w, h.ran_before(m, since, since + w, run_id)) for _, m, p, w in h.waits(run_id))


def run_waits_line(waits: Sequence[RunWait], label: str = "waited") -> str:
    """``waited: sim-01 1 h 12 min behind 'nightly-1203'; sim-02 0 s`` (pure); "" when no module started."""
    if not waits:
        return ""
    return f"{label}: " + "; ".join(f"{w.module} {shown_duration(w.waited_s)}"
                                  + (f" behind {w.behind!r}" if w.behind else "") for w in waits)
