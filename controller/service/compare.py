"""``fleetctl ab A B``: two releases validated alternately on the same modules, then the paired verdict.

:func:`plan_rounds` (pure) orders the runs: A B B A per round. :func:`compare_releases` checks both requests first
(nothing is dispatched when either is refused), then dispatches each run through :func:`.lifecycle.validate`, as
``fleetctl validate`` does, waits for it (the caller's ``wait``: the CLI follows it live), and marks it in the run
history (its note: ``A/B test A vs B: round r, release A``; its kind stays ``run``, so that sync, status
and the reports treat it as any run). :func:`paired_verdict` reads the runs' rows and judges them
(:mod:`controller.report.analysis.paired`).

Lazy imports: :mod:`controller.report` (the paired comparison, the rows) is imported when runs are judged:
it loads pandas (462 ms CPU a fresh process, ``bench/import_costs.py``:
bench/results/import_costs_20261207_0346_lazy-libraries.txt), which planning and dispatching do not need.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from controller.service.lifecycle import prepare, validate
from controller.service.records import Launched, ValidateRequest
from controller.service.session import BadRequest, Session, report_call

if TYPE_CHECKING:
    from controller.report.model import PairedReport, PairedRun

MAX_ROUNDS = 20


@dataclass(frozen=True)
class Slot:
    """One run of the plan: which release (arm ``A`` or ``B``), which round, its place in the whole order."""

    arm: str
    round: int
    position: int


def plan_rounds(rounds: int) -> tuple[Slot, ...]:
    """The run order of a paired comparison: ``rounds`` rounds of A B B A (a drift linear in time within a round
    cancels in the difference of the arms' means)."""
    from controller.report.analysis.paired import ABBA

    if not 1 <= rounds <= MAX_ROUNDS:
        raise BadRequest(f"--rounds {rounds}: give 1 to {MAX_ROUNDS}")
    return tuple(Slot(arm, r, r * len(ABBA) + i) for r in range(rounds) for i, arm in enumerate(ABBA))


def run_note(release_a: str, release_b: str, slot: Slot, rounds: int) -> str:
    """What the run history says of a run of the comparison (its ``note``)."""
    version = release_a if slot.arm == "A" else release_b
    return (f"A/B test {release_a} vs {release_b}: round {slot.round + 1} of {rounds}, "
            f"release {slot.arm} ({version})")


def compare_releases(s: Session, a: ValidateRequest, b: ValidateRequest, rounds: int,
                     wait: Callable[[Launched, Slot], None], tolerance: float | None = None) -> PairedReport:
    """Validate A and B alternately (:func:`plan_rounds`) on the same modules, each run to its end, then judge."""
    from controller.report.model import PairedRun

    plan = plan_rounds(rounds)
    if tolerance is not None and not 0 < tolerance < 1:
        raise BadRequest(f"--tolerance {tolerance}: give a fraction between 0 and 1 (0.01 = 1 %)")
    if a.run_id or b.run_id or a.resume or b.resume:
        raise BadRequest("an A/B test names its own runs: no run id, no resume")
    version_a, mods_a, _ = prepare(s, a)
    version_b, mods_b, _ = prepare(s, b)
    if [m.name for m in mods_a] != [m.name for m in mods_b]:
        raise BadRequest("the two releases must run on the same modules")
    # the same modules for every run, even if labels change meanwhile
    devices = ",".join(m.name for m in mods_a)
    runs: list[PairedRun] = []
    for slot in plan:
        req = replace(a if slot.arm == "A" else b, devices=devices, baseline=None)
        launched = validate(s, req)
        s.history().set_run_note(launched.run_id, run_note(version_a, version_b, slot, rounds))
        wait(launched, slot)
        runs.append(PairedRun(run_id=launched.run_id, arm="A" if slot.arm == "A" else "B", round=slot.round))
    return paired_verdict(s, runs, version_a, version_b, tolerance)


def paired_verdict(s: Session, runs: Sequence[PairedRun], release_a: str, release_b: str,
                   tolerance: float | None = None) -> PairedReport:
    """The paired verdict of runs in the history."""
    from controller.report.analysis.paired import PAIRED_TOLERANCE, paired_compare, paired_thresholds
    from controller.report.load import read_rows

    rows = read_rows(s.read_history(), [r.run_id for r in runs])
    th = paired_thresholds(PAIRED_TOLERANCE if tolerance is None else tolerance)
    return report_call(lambda: paired_compare(rows, runs, release_a=release_a, release_b=release_b, th=th))
