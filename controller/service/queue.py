"""What waits in the lab (``fleetctl queue``): each module's waiting runs in the order it will take them, with
their priority, how long they have waited and what the module runs meanwhile; and how long runs waited, by
priority, over the history (the same waits as the ``m1000_fleet_run_wait_seconds`` histogram)."""

from __future__ import annotations

import statistics
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from contract.priority import LEVELS
from controller.fleet.queues import depths
from controller.history.waits import shown_duration
from controller.service.session import Session, broker_call

if TYPE_CHECKING:
    from controller.fleet import RunView
    from controller.history import RunInfo


@dataclass(frozen=True)
class QueuedRun:
    module: str
    position: int  # 1: the next the module takes
    run_id: str
    priority: str  # its level now (raised from ``asked`` after a long wait)
    asked: str
    waited_s: float | None
    # behind: another user's reservation holding it back, else the run the module runs now; None: idle
    behind: str | None


@dataclass(frozen=True)
class WaitStats:
    priority: str
    n: int
    p50_s: float
    p90_s: float
    max_s: float


@dataclass(frozen=True)
class QueueView:
    runs: tuple[QueuedRun, ...]
    depths: Mapping[str, Mapping[str, int]]  # module -> priority -> runs waiting
    waits: tuple[WaitStats, ...]  # by priority, over the history's recent parts


def wait_stats(waits: Iterable[tuple[str, float]]) -> tuple[WaitStats, ...]:
    """(priority, seconds) -> per priority, in LEVELS order: count, median, 90th percentile, longest (pure)."""
    by: dict[str, list[float]] = {}
    for p, w in waits:
        by.setdefault(p, []).append(w)
    out = []
    for p in sorted(by, key=lambda p: list(LEVELS).index(p) if p in LEVELS else len(LEVELS)):
        ws = sorted(by[p])
        p90 = statistics.quantiles(ws, n=10, method="inclusive")[-1] if len(ws) > 1 else ws[0]
        out.append(WaitStats(p, len(ws), statistics.median(ws), p90, ws[-1]))
    return tuple(out)


def queue(s: Session, selector: str = "all", *, recent: int = 1000, now: float | None = None,
          waits: bool = True) -> QueueView:
    """What waits on the selected modules (the broker), and the waits of started runs (the history, the runs not
    ended synced into it first: writes; ``waits`` False: neither, the broker read only)."""
    mods = s.inventory().select(selector)
    fleet = s.broker()
    now = time.time() if now is None else now
    waiting = broker_call(s, lambda: fleet.waiting(mods))
    statuses = broker_call(s, lambda: fleet.statuses(mods))
    running = {m: (st.heartbeat.run_id if st.heartbeat else None) for m, st in statuses.items()}
    reserved = broker_call(s, lambda: fleet.held([m.name for m in mods], now))
    by_queue = {m.queue: m.name for m in mods}
    # module -> its runs listed so far: the next one's position less one
    taken: Counter[str] = Counter()
    runs: list[QueuedRun] = []
    for w in waiting:  # each module's in the order it takes them (read_waiting)
        module = by_queue[w.queue]
        taken[module] += 1
        # another user's reservation holds the run back (agent.hold): that is the wait
        r = reserved.get(module)
        behind = r.line(now) if r is not None and r.user != w.user else running.get(module)
        runs.append(QueuedRun(module, taken[module], w.run_id, w.level, w.asked or w.level,
                              None if w.sent_at is None else max(0.0, now - w.sent_at), behind))
    names = {m.name for m in mods}
    by_module = {by_queue[q]: d for q, d in depths(waiting, list(by_queue)).items()}
    if not waits:
        return QueueView(tuple(runs), by_module, ())
    # the runs not ended pulled in first: their starts are the newest waits
    if s.has_history():
        for run_id in s.history().running_runs():
            broker_call(s, partial(fleet.sync, run_id))
    parts = s.history().waits()[-recent:] if s.has_history() else []
    return QueueView(tuple(runs), by_module, wait_stats((p, w) for _, m, p, w in parts if m in names))


def queue_records(v: QueueView) -> list[dict[str, object]]:
    return [{"module": r.module, "position": r.position, "run_id": r.run_id, "priority": r.priority,
             "asked": r.asked, "waited": shown_duration(r.waited_s), "waited_s": r.waited_s,
             "behind": r.behind or ""} for r in v.runs]


def queue_document(v: QueueView) -> dict[str, object]:
    return {"runs": queue_records(v), "depths": {m: dict(d) for m, d in v.depths.items()},
            "waits": [{"priority": w.priority, "n": w.n, "p50_s": w.p50_s, "p90_s": w.p90_s, "max_s": w.max_s}
                      for w in v.waits]}


def waits_line(stats: Sequence[WaitStats]) -> str:
    if not stats:
        return "waited: no run has started yet"
    return "waited (dispatch to start): " + "; ".join(
        f"{w.priority} median {shown_duration(w.p50_s)}, p90 {shown_duration(w.p90_s)}, longest "
        f"{shown_duration(w.max_s)} (n={w.n})" for w in stats)


def reservation_waits(s: Session, info: RunInfo, view: RunView, now: float | None = None) -> dict[str, str]:
    """module -> ``reserved by V until HH:MM (reason)`` for each module where ``info``'s part has not started and
    a user other than the run's holds the module: the run waits there until the reservation ends (agent.hold)."""
    waiting = [m for m, p in view.progress.items() if p is None or (p.step == "queued" and not p.state.terminal)]
    if not waiting:
        return {}
    fleet = s.fleet()
    held = broker_call(s, lambda: fleet.held(waiting, now))
    return {m: r.line(now) for m, r in held.items() if r.user != info.started_by}


def reservation_waits_line(waits: Mapping[str, str]) -> str:
    """``waits for a reservation: sim-01 reserved by ann until 15:00`` (pure); "" when none."""
    return ("waits for a reservation: " + "; ".join(f"{m} {why}" for m, why in waits.items())) if waits else ""
