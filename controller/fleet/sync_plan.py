"""What a sync pass does with each module's records, decided apart from reading and writing them (pure).

:func:`pending_modules` names the modules a pass reads; :func:`plan_take` decides what of a module's broker record
is taken (:class:`Take`), given the history's; the rest says what the rows read with it change. The pass itself,
its reads and its writes are :class:`controller.fleet.collect.Sync`'s.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeGuard

from contract.records import ResultRow, RunProgress, RunState, StepError

# A module whose final state reached the controller without all it names (rows, telemetry summary) is
# "collecting": recorded as still publishing, this step, until its history holds all of it or COLLECT_TIMEOUT
# passes (then its part ends failed: "N of M rows reached the controller"), never done with rows missing.
COLLECT_STEP = "collecting"


def is_collecting(p: RunProgress | None) -> TypeGuard[RunProgress]:
    return p is not None and p.state == RunState.PUBLISHING and p.step == COLLECT_STEP


def pending_modules(modules: Sequence[str], known: Mapping[str, RunProgress | None], *, late_ok: bool) -> list[str]:
    """The modules a pass reads from the broker: those whose part the history does not hold ended, and, while
    ``late_ok`` (the run is younger than the broker keeps results), those the controller gave up (LOST): a late
    state or late rows are accepted."""
    out = []
    for m in modules:
        k = known.get(m)
        if k is None or not k.state.terminal or (late_ok and k.state == RunState.LOST):
            out.append(m)
    return out


def beats_due(pending: Sequence[str], read_at: Mapping[str, float], now: float, interval: float,
              known: Mapping[str, RunProgress | None]) -> list[str]:
    """The pending modules whose heartbeat a pass reads again: never read by this follower, read an interval ago or
    more (or at a time ahead of ``now``: a clock set back), or given up (LOST: a late state's time is read through
    its skew)."""
    return [m for m in pending if (t := read_at.get(m)) is None or not 0 <= now - t < interval
            or ((k := known.get(m)) is not None and k.state == RunState.LOST)]


def beat_read_times(fresh: Sequence[str], read_at: Mapping[str, float], now: float,
                    interval: float) -> dict[str, float]:
    """When each module of ``fresh`` counts as read, for :func:`beats_due`'s next passes: a follower's first reads
    are spread over one interval by the module's name (so that ten thousand heartbeats are not all read again in
    one pass an interval later), and a module read on time keeps its place in the interval."""
    out = {}
    for m in fresh:
        t = read_at.get(m)
        if t is None:
            out[m] = now - interval * (zlib.crc32(m.encode()) / 2**32)
        elif 0 <= now - t < 2 * interval:
            out[m] = t + interval
        else:
            out[m] = now
    return out


@dataclass(frozen=True)
class Take:
    """What a pass takes of one module's broker record (:func:`plan_take`).

    ``progress``: the record to take (None: nothing newer than what the history holds); ``force``: over the
    controller's own LOST; ``late``: the event that says a late state was accepted; ``found``: a record of another
    release under this run id (nothing taken, the part fails)."""

    progress: RunProgress | None = None
    force: bool = False
    late: str | None = None
    found: RunProgress | None = None

    @property
    def foreign(self) -> bool:
        return self.found is not None


def plan_take(release: str, p: RunProgress | None, cur: RunProgress | None, *, skew: float) -> Take:
    """What of the broker's record ``p`` the pass takes over the history's ``cur`` (``release``: the run's;
    ``skew``: the module's clock minus the controller's, for the times the agent wrote)."""
    if p is not None and is_collecting(cur) and not p.state.terminal:
        # the broker lost the final state (the module sends it again): nothing newer than it
        p = None
    was_lost = cur is not None and cur.state == RunState.LOST
    if p is not None and p.release and release and p.release != release:
        # another controller used this run id: never this run's result
        return Take(found=p)
    late = None
    if p is not None and cur is not None and was_lost:
        # the late state's time is the agent's clock, when the module was given up the controller's
        if not p.state.terminal and p.updated_at - skew <= (cur.finished_at or 0.0):
            p = None  # nothing newer than when the module was given up
        else:
            late = (f"late {p.state.value} state accepted after the module was marked lost "
                    f"({cur.error.message if cur.error else ''})")
    return Take(p, force=was_lost, late=late)


def foreign_rows(rows: Sequence[ResultRow] | None, release: str) -> list[str]:
    """The releases other than ``release`` among the broker's rows of a module ("?": none named)."""
    return sorted({r.release or "?" for r in rows or () if r.release != release})


def rows_failed(run_id: str, module: str, release: str, p: RunProgress, foreign: Sequence[str],
                now: float) -> tuple[RunProgress, str]:
    """A final state ``p`` whose rows on the broker are another release's: the part failed, and why."""
    reason = (f"the broker's rows of run {run_id} on {module} are of release {', '.join(foreign)}, not "
              f"{release}: not taken as this run's result (another controller used this run id)")
    if p.state != RunState.FAILED:
        p = p.model_copy(update={"state": RunState.FAILED, "updated_at": now, "finished_at": p.finished_at or now,
                                 "error": StepError(step="sync", message=reason)})
    return p, reason


def kept_rows(rows: Sequence[ResultRow], run_id: str, module: str) -> list[ResultRow]:
    """The rows a history keeps of ``module``'s part of ``run_id`` once they replace its own: the part's, the last
    of each key (run, module, model key, profile, source)."""
    return list({(r.model_key, r.profile, r.source): r for r in rows
                 if r.run_id == run_id and r.module == module}.values())


def collecting_progress(p: RunProgress, gap: str, have: int) -> RunProgress:
    """The final state ``p`` recorded as collecting: ``gap`` is what the history lacks, ``have`` its release
    rows."""
    return p.model_copy(update={"state": RunState.PUBLISHING, "step": COLLECT_STEP, "finished_at": None,
                                "rows": have, "error": StepError(step="collect", message=gap)})
