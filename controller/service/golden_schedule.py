"""Golden checks on a schedule: ``fleetctl serve`` runs one on a module after ``golden_every_runs`` validations
or ``golden_every_hours`` hours since its last one (settings; ``golden_release`` names the release).

At low priority: a check is only dispatched to a module that is ``idle`` (a heartbeat, no run), not reserved by any
user (``fleetctl reserve``) and has no run of its own in flight, so it never goes ahead of queued work; work
dispatched while it runs waits for one short validation (``golden_models``, default qwen3). A module that has no
golden check yet is due at once under the hours rule (its golden history starts), and after N validations under the
runs rule. ``serve`` judges the check when it ends, as ``fleetctl golden`` does
(:func:`controller.service.golden.judge_golden`).

:func:`due` is the planner (pure: runs, states and the clock in, modules out); :func:`run_due` the seam.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from controller.history.records import RunInfo
from controller.service.golden import GOLDEN_NOTE, note_of
from controller.service.lifecycle import validate
from controller.service.records import release_request
from controller.service.reservations import reservations
from controller.service.session import Session
from controller.service.views import devices

# runs of the history the planner looks at (the newest): more than N for any sensible N
RECENT_RUNS = 2000


@dataclass(frozen=True)
class Due:
    module: str
    why: str


def is_golden(r: RunInfo) -> bool:
    return r.note.startswith(GOLDEN_NOTE + " ")


def due(runs: Sequence[RunInfo], states: Mapping[str, str], now: float, *, every_runs: int,
        every_hours: float) -> list[Due]:
    """The idle modules due a golden check, by name (pure). ``runs``: the history's runs, any order;
    ``states``: module -> its state (idle, busy, unreachable, offline, bad)."""
    if every_runs <= 0 and every_hours <= 0:
        return []
    out: list[Due] = []
    by_module: dict[str, list[RunInfo]] = {m: [] for m in states}
    for r in sorted(runs, key=lambda r: r.created_at):
        for m in r.modules:
            if m in by_module:
                by_module[m].append(r)
    for module in sorted(states):
        if states[module] != "idle":
            continue
        mine = by_module[module]
        if any(r.state == "running" for r in mine):
            # its own work (or a check) in flight: a check never goes ahead of it
            continue
        checks = [r for r in mine if is_golden(r)]
        last = checks[-1] if checks else None
        since = [r for r in mine if not is_golden(r) and (last is None or r.created_at > last.created_at)]
        if every_runs > 0 and len(since) >= every_runs:
            out.append(Due(module, f"{len(since)} validation(s) since its last golden check"
                           if last else f"{len(since)} validation(s) and no golden check yet"))
        elif every_hours > 0 and last is None:
            out.append(Due(module, "no golden check yet"))
        elif every_hours > 0 and last is not None and now - last.created_at >= every_hours * 3600:
            out.append(Due(module, f"its last golden check {(now - last.created_at) / 3600:.1f} h ago"))
    return out


def run_due(s: Session, now: float) -> list[tuple[Due, str]]:
    """Dispatch a golden check to each module due one (``golden_release``): per module due, (due, what happened:
    ``dispatched RUN`` or why not). One that could not be dispatched is tried again on the next pass."""
    st = s.settings
    if not st.golden_release or (st.golden_every_runs <= 0 and st.golden_every_hours <= 0):
        return []
    # a module a user reserved is theirs: no check goes there
    held = {r.module for r in reservations(s)}
    states = {d.module.name: "reserved" if d.module.name in held else d.status.state for d in devices(s)}
    h = s.history()
    todo = due(h.runs(limit=RECENT_RUNS), states, now, every_runs=st.golden_every_runs,
               every_hours=st.golden_every_hours)
    out: list[tuple[Due, str]] = []
    for d in todo:
        try:
            launched = validate(s, release_request(st.golden_release, models=st.golden_models, devices=d.module,
                                                     priority="low"))
        # one module's trouble (or a bad golden_release) does not stop the others
        except Exception as exc:
            out.append((d, f"not dispatched: {exc}"))
            continue
        h.set_run_note(launched.run_id, note_of(launched.release))
        out.append((d, f"dispatched {launched.run_id}"))
    return out
