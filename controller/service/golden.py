"""Health checks with a golden release: ``fleetctl golden REL``.

A golden release is one known to be good. Its short validation (``--models``, default the first model key) runs on
the chosen modules; each module's figures are compared with **its own** earlier golden checks of the same release
(the paired machinery of :mod:`controller.report.analysis.paired`: per profile this run against the mean of the
earlier ones on the same module, the Hodges-Lehmann centre over profiles with its 95 % interval and a signed-rank
test). A module worse than ``golden_tolerance`` on a primary metric at p < :data:`GOLDEN_ALPHA` **drifted**: an
event in the history (:data:`controller.history.GOLDEN_DRIFT_EVENT`) makes it ``bad`` with the reason, and it takes
no work until ``fleetctl devices reset MODULE`` (the reset event after it). A module's first golden check starts
its golden history. The runs are ordinary runs in the history, their note ``golden check REL``
(:data:`controller.history.GOLDEN_NOTE`): never the previous run of another run, and a golden check's previous runs
are the earlier checks of its release (:func:`controller.report.load.previous_pick`).

Why against the module's own history: the module is what is checked, not the release; a module that is always 4 %
slower than the fleet is not drifting, one that became 6 % slower than itself is.

Lazy imports: :mod:`controller.report` (the paired comparison, the rows) is imported when a check is
judged: it loads pandas (462 ms CPU a fresh process, ``bench/import_costs.py``:
bench/results/import_costs_20261207_0346_lazy-libraries.txt), which ``fleetctl serve``'s scheduler
(:mod:`.golden_schedule`) does not need until a check ends.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from controller.fleet import module_failed
from controller.history import GOLDEN_DRIFT_EVENT, GOLDEN_NOTE
from controller.service.lifecycle import validate
from controller.service.records import Launched, ValidateRequest
from controller.service.session import BadRequest, Session

GOLDEN_ALPHA = 0.05
# the module's earlier golden checks its figures are compared with (the newest)
HISTORY_RUNS = 5
PRIMARY = ("prefill_tps", "decode_tps", "accept_rate", "vision_fps")  # TTFT and TPOT follow their primaries


@dataclass(frozen=True)
class ModuleCheck:
    """One module's golden check: ``drifted``, ``ok``, ``first`` (its golden history starts) or ``failed`` (its run
    failed: said, not judged); ``line`` says what was found."""

    module: str
    status: str
    line: str
    history: int  # earlier golden checks compared with


@dataclass(frozen=True)
class GoldenResult:
    run_id: str
    release: str
    checks: tuple[ModuleCheck, ...]

    @property
    def drifted(self) -> tuple[str, ...]:
        return tuple(c.module for c in self.checks if c.status == "drifted")


def note_of(version: str) -> str:
    return f"{GOLDEN_NOTE} {version}"


def golden_check(s: Session, req: ValidateRequest, wait: Callable[[Launched], None],
                 tolerance: float | None = None) -> GoldenResult:
    """Validate the golden release on the chosen modules, wait, and judge each module against its own history."""
    tol = s.settings.golden_tolerance if tolerance is None else tolerance
    if not 0 < tol < 1:
        raise BadRequest(f"--tolerance {tol}: give a fraction between 0 and 1 (0.03 = 3 %)")
    launched = validate(s, req)
    s.history().set_run_note(launched.run_id, note_of(launched.release))
    wait(launched)
    return judge_golden(s, launched.run_id, tol)


def judge_golden(s: Session, run_id: str, tolerance: float) -> GoldenResult:
    """Each module of a golden run against its earlier golden checks of the same release; drift recorded."""
    from controller.report.load import read_rows

    h = s.history()
    info = h.find_run(run_id)
    view = s.fleet().view(run_id)
    earlier = [r for r in h.runs(limit=10_000)
               if r.note == note_of(info.release) and r.created_at < info.created_at and r.state != "running"]
    earlier.sort(key=lambda r: r.created_at, reverse=True)
    rows = read_rows(h, [run_id, *(r.run_id for r in earlier)])
    checks = []
    for m in info.modules:
        p = view.progress.get(m)
        if p is None or module_failed(p):
            checks.append(ModuleCheck(m, "failed", f"{m}: the golden run failed there: not judged", 0))
            continue
        mine = rows[rows["module"].astype(str) == m] if len(rows) else rows
        have = set(mine["run_id"].astype(str)) if len(mine) else set()
        # a check the module failed is not its golden figure
        drifted = drifted_runs(h.module_events(m))
        prev = [r.run_id for r in earlier if r.run_id in have and r.run_id not in drifted][:HISTORY_RUNS]
        checks.append(_judge_module(mine, m, run_id, prev, tolerance))
    # once: fleetctl serve judges a check that fleetctl golden judges too
    for c in checks:
        if c.status == "drifted" and run_id not in drifted_runs(h.module_events(c.module)):
            h.add_module_event(c.module, f"{GOLDEN_DRIFT_EVENT}: {c.line} (run {run_id})")
    return GoldenResult(run_id, info.release, tuple(checks))


def drifted_runs(events: Sequence[tuple[float, str]]) -> set[str]:
    """The golden runs a module drifted in, from its events (``golden drift: ... (run ID)``) (pure)."""
    out = set()
    for _, message in events:
        if message.startswith(GOLDEN_DRIFT_EVENT) and message.endswith(")") and "(run " in message:
            out.add(message[message.rindex("(run ") + 5:-1])
    return out


def _judge_module(rows: object, module: str, run_id: str, prev: Sequence[str], tolerance: float) -> ModuleCheck:
    from controller.report.analysis.paired import paired_compare, paired_thresholds
    from controller.report.model import PairedRun, ReportError

    if not prev:
        return ModuleCheck(module, "first", f"{module}: golden history starts with this check", 0)
    plan = [PairedRun(run_id=r, arm="A", round=0) for r in prev] + [PairedRun(run_id=run_id, arm="B", round=0)]
    import numpy as np
    import pandas as pd

    from controller.report.model import ALL_METRICS

    assert isinstance(rows, pd.DataFrame)
    # the primary metrics only: a derived one's signed-rank test is a permutation test where figures tie (slow)
    rows = rows.assign(**{m: np.nan for m in ALL_METRICS if m in rows.columns and m not in PRIMARY})
    try:
        rep = paired_compare(rows, plan, release_a="golden history", release_b="this check",
                             th=paired_thresholds(tolerance, alpha=GOLDEN_ALPHA))
    except ReportError as exc:
        return ModuleCheck(module, "failed", f"{module}: not judged ({exc})", len(prev))
    worse = [c for c in rep.changes if c.metric in PRIMARY and c.status == "regressed"]
    n = f"{len(prev)} earlier check{'s' if len(prev) > 1 else ''}"
    if worse:
        lead = min(worse, key=lambda c: c.change)
        ci = f" [{lead.ci_low:+.1%}, {lead.ci_high:+.1%}]" if lead.ci_low is not None and lead.ci_high is not None \
            else ""
        return ModuleCheck(module, "drifted", f"{module} drifted: {lead.model_key} {lead.metric} {lead.change:+.1%}"
                           f"{ci} against its own golden history ({n}), beyond {tolerance:.0%}", len(prev))
    moved = max((abs(c.change) for c in rep.changes if c.metric in PRIMARY), default=0.0)
    return ModuleCheck(module, "ok", f"{module}: within {tolerance:.0%} of its golden history ({n}; largest "
                       f"change {moved:.1%})", len(prev))
