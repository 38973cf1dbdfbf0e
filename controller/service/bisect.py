"""``fleetctl bisect``: the first bad release between a known-good and a known-bad one, k candidates at a time.

1. **References**: the good release, then the bad one, each validated on every chosen module; their paired
   comparison (:mod:`controller.report.analysis.paired`) gives the **targets**, the regressions the bad release
   shows on these modules (or, with ``--metric``, that metric's). None: nothing to bisect, said.
2. **Rounds**: with ``k`` usable modules a round dispatches ``k`` candidates at once, one run each on its own
   module (:func:`.bisect_plan.next_probes`); each is called against the good release's run *on the same module*
   (:func:`.bisect_plan.target_call`). A call within noise is measured again (on another module where one is
   free), a run lost with its module moves to another module (the module is left out from then on) unless the
   round's other calls put its candidate outside the answer's interval (:func:`.bisect_plan.still_open`); a
   candidate that cannot run (its server fails, its rows never come) is skipped and said, like ``git bisect skip``.
3. The answer: the first bad release, or the suspects when skipped candidates stand between the last good and
   the first bad.

Everything a restart needs is in the record (:mod:`.bisect_state`): ``--resume`` follows the runs still running
and goes on from the calls made; ``--cancel`` cancels its runs. The runs are ordinary runs in the history, their
note naming the bisection, round and candidate.

Lazy imports: :mod:`controller.report` (the paired comparison, the rows) is imported by the functions that
judge runs: it loads pandas (462 ms CPU a fresh process, ``bench/import_costs.py``:
bench/results/import_costs_20261207_0346_lazy-libraries.txt), which ``fleetctl bisect --cancel`` and a
round's dispatch do not need.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from contract.records import METRICS, RunProgress, RunState, release_version_of
from controller.fleet import BrokerUnavailable, FleetError, RunView, module_failed, new_run_id
from controller.service.bisect_plan import (
    MAX_MEASURES,
    Bounds,
    Call,
    Measured,
    Target,
    bounds,
    call_of,
    next_probes,
    still_open,
    target_call,
)
from controller.service.bisect_state import (
    BisectRecord,
    BisectRun,
    BisectStore,
    Candidate,
    TargetRecord,
    new_bisect_id,
)
from controller.service.lifecycle import cancel as cancel_run
from controller.service.lifecycle import validate
from controller.service.records import ValidateRequest, release_request
from controller.service.release_url import is_url
from controller.service.reservations import refused_for
from controller.service.session import BadRequest, ServiceError, Session, broker_call, report_call

# the references' test level: the question is whether a release the user calls bad is worse on these modules, at the
# level of the 95 % intervals the calls use (the verdict's 0.01 missed a plain 9 % on one module of 11 profiles)
REFERENCE_ALPHA = 0.05
Wait = Callable[[BisectRecord, Sequence[BisectRun]], None]  # follows the given runs to their end


@dataclass(frozen=True)
class Evidence:
    """One run of a candidate and what it showed: the change on each target, or why it counts for nothing."""

    run: BisectRun
    version: str
    changes: tuple[Measured | None, ...]  # per target (None: no figure)
    # outcome: "measured", "lost" (its module), "failed" (the release) or "running"
    outcome: str


@dataclass(frozen=True)
class Outcome:
    """Where a bisection stands: its record, the calls, the evidence, the bounds, and (when done) the answer."""

    record: BisectRecord
    calls: tuple[Call | None, ...]
    # candidates measured, called within noise, to be measured again
    unsure: tuple[int, ...]
    # candidates whose runs were lost with their modules, to be run elsewhere
    homeless: tuple[int, ...]
    evidence: tuple[Evidence, ...]
    bounds: Bounds | None

    @property
    def first_bad(self) -> str | None:
        if self.bounds is None or not self.bounds.done or self.bounds.skipped:
            return None
        return self.record.candidates[self.bounds.bad].version

    @property
    def suspects(self) -> tuple[str, ...]:
        if self.bounds is None or not self.bounds.done:
            return ()
        return tuple(self.record.candidates[i].version for i in self.bounds.suspects)

    @property
    def rounds(self) -> int:
        return max((r.round for r in self.record.runs), default=0)

    @property
    def again(self) -> int:
        return sum(1 for r in self.record.runs if r.again)


# ----------------------------------------------------------------------------------------------- candidates


def release_candidates(releases: str, good: str, bad: str) -> tuple[Candidate, ...]:
    """The releases from ``good`` to ``bad`` in release order. ``releases``: a folder of release tarballs, a file
    listing one path or URL a line, or a comma-separated list; ``good`` and ``bad``: versions or sources."""
    sources = _sources(releases)
    for end in (good, bad):
        if (is_url(end) or "/" in end) and end not in sources:
            sources.append(end)
    found: dict[str, Candidate] = {}
    for src in sources:
        version = release_version_of(Path(src.rstrip("/").split("?")[0]).name)
        if version is None:
            raise BadRequest(f"--releases: {src}: not a release tarball name "
                             "(SGLang-MUSA-M1000-M1000_<version>_sglang.tar.gz)")
        if version in found and found[version].source != src:
            raise BadRequest(f"--releases: release {version} given twice ({found[version].source}, {src})")
        found[version] = Candidate(version=version, source=src)
    try:
        ordered = sorted(found.values(), key=lambda c: Version(c.version))
    except InvalidVersion:
        ordered = list(found.values())  # as listed (a folder: by name)

    def at(end: str, flag: str) -> int:
        v = release_version_of(Path(end.rstrip("/")).name) if (is_url(end) or "/" in end) else end
        for i, c in enumerate(ordered):
            if c.version == v:
                return i
        raise BadRequest(f"{flag} {end}: not among the {len(ordered)} releases of --releases")

    lo, hi = at(good, "--good"), at(bad, "--bad")
    if hi <= lo:
        raise BadRequest(f"--bad {ordered[hi].version} does not come after --good {ordered[lo].version} in release "
                         "order")
    return tuple(ordered[lo:hi + 1])


def _sources(releases: str) -> list[str]:
    if not is_url(releases):
        p = Path(releases).expanduser()
        if p.is_dir():
            return [str(f) for f in sorted(p.iterdir()) if release_version_of(f.name) is not None]
        if p.is_file() and release_version_of(p.name) is None:
            lines = (x.strip() for x in p.read_text().splitlines())
            return [x for x in lines if x and not x.startswith("#")]
    items = [x.strip() for x in releases.split(",") if x.strip()]
    if not items:
        raise BadRequest(f"--releases {releases!r}: give a folder of releases, a file listing them, or a list")
    return items


# ----------------------------------------------------------------------------------------------- the loop


def start(s: Session, *, good: str, bad: str, releases: str, models: tuple[str, ...], devices: str,
          metric: str | None = None, tolerance: float | None = None) -> BisectRecord:
    """Check the request and write the bisection's record (nothing dispatched yet)."""
    if metric is not None and metric not in METRICS:
        raise BadRequest(f"--metric {metric!r}: not a metric (known: {', '.join(METRICS)})")
    if tolerance is not None and not 0 < tolerance < 1:
        raise BadRequest(f"--tolerance {tolerance}: give a fraction between 0 and 1 (0.01 = 1 %)")
    cands = release_candidates(releases, good, bad)
    mods = s.inventory().select(devices)
    # every release readable before anything runs (URLs are fetched when first run)
    for c in cands:
        if "://" not in c.source and not Path(c.source).is_file():
            raise BadRequest(f"--releases: {c.source}: no such release tarball")
    rec = BisectRecord(bisect_id=new_bisect_id(), created_at=time.time(), candidates=cands, models=models,
                       metric=metric, devices=devices, modules=tuple(m.name for m in mods), tolerance=tolerance)
    store(s).create(rec)
    return rec


def store(s: Session) -> BisectStore:
    return BisectStore(s.settings.data_dir.expanduser())


def run(s: Session, bisect_id: str, wait: Wait, on_round: Callable[[Outcome], None] | None = None) -> Outcome:
    """Run the bisection to its end (or until cancelled): dispatch, wait, call, again. Resumable at any point."""
    st = store(s)
    with st.owned(bisect_id):
        while True:
            rec = st.load(bisect_id)
            if rec.status != "running":
                return assess(s, rec)
            missing = [r for r in rec.runs if s.history().run(r.run_id) is None]
            # recorded, never dispatched (killed in between): dispatched now, under the same id
            if missing:
                for r in missing:
                    _launch(s, rec, r)
                continue
            pending = [r for r in rec.runs if not _finished(s, r)]
            if pending:
                wait(rec, pending)
                continue
            if not _has(rec, "good"):
                _dispatch(s, rec, [(0, "", 0, False)], role="good")
                continue
            if not _has(rec, "bad"):
                _dispatch(s, rec, [(len(rec.candidates) - 1, "", 0, False)], role="bad")
                continue
            if rec.targets is None:
                rec = _set_targets(s, rec)
                if rec.status != "running":
                    continue
            out = assess(s, rec)
            calls = {i: c for i, c in enumerate(out.calls) if c is not None}
            lost = _lost(s, out, rec)
            st.patch(bisect_id, calls=calls, lost=lost)
            rec = st.load(bisect_id)
            free = _usable(s, rec)
            if not free:
                _end(s, rec, "failed", "no module of the bisection is usable (lost, offline, unreachable or bad)")
                continue
            if on_round is not None:
                on_round(out)
            redo = still_open([*out.homeless, *out.unsure], out.bounds)  # not what this round made irrelevant
            if redo:
                _dispatch(s, rec, _place(rec, redo, free, out.rounds), role="probe")
                continue
            assert out.bounds is not None
            if out.bounds.done:
                _end(s, rec, "done", "")
                continue
            probes = next_probes(out.calls, len(free))
            _dispatch(s, rec, [(i, m, out.rounds + 1, False) for i, m in zip(probes, free, strict=False)],
                      role="probe")


def _usable(s: Session, rec: BisectRecord) -> list[str]:
    """The bisection's modules the good release ran on, not lost, neither offline, unreachable nor bad now, and not
    reserved by another user (a busy one takes its candidate when it frees up)."""
    good = next(r for r in rec.runs if r.role == "good")
    measured = {m for m, p in _view(s, good).progress.items() if p is not None and not module_failed(p)}
    mods = [m for m in s.inventory().modules if m.name in measured and m.name not in rec.lost]
    statuses = broker_call(s, lambda: s.broker().statuses(mods))
    refused = refused_for(s, [m.name for m in mods], s.user)
    return [m.name for m in mods if statuses[m.name].state not in ("offline", "unreachable", "bad")
            and m.name not in refused]


def follow_runs(s: Session, rec: BisectRecord, runs: Sequence[BisectRun], *, interval: float = 1.0,
                on_done: Callable[[BisectRun, RunView], None] | None = None) -> None:
    """Sync the runs until each has ended (``on_done`` for each as it does), or the bisection is cancelled."""
    left = list(runs)
    while left:
        if store(s).load(rec.bisect_id).status != "running":
            return
        for r in list(left):
            try:
                v = s.fleet().sync(r.run_id)
            except BrokerUnavailable:
                break  # tried again after the pause
            if v.finished:
                left.remove(r)
                if on_done is not None:
                    on_done(r, v)
        if left:
            time.sleep(interval)


def _has(rec: BisectRecord, role: str) -> bool:
    return any(r.role == role for r in rec.runs)


def _place(rec: BisectRecord, redo: Sequence[int], free: Sequence[str], rnd: int) -> list[tuple[int, str, int, bool]]:
    """Candidates to run again, each on a module it has not run on yet where one is free, at most one a module."""
    out: list[tuple[int, str, int, bool]] = []
    taken: set[str] = set()
    for i in redo:
        used = {r.module for r in rec.runs if r.index == i}
        options = [m for m in free if m not in taken]
        if not options:
            break
        m = next((m for m in options if m not in used), options[0])
        taken.add(m)
        out.append((i, m, rnd, True))
    return out


def _dispatch(s: Session, rec: BisectRecord, slots: Sequence[tuple[int, str, int, bool]], *, role: str) -> None:
    """Record each run (its id chosen here) before it is dispatched: a controller killed in between leaves a run
    the record names and the history lacks, which :func:`run` dispatches again under the same id."""
    for index, module, rnd, again in slots:
        run = BisectRun(run_id=new_run_id(), role=role, index=index, module=module, round=rnd,  # type: ignore[arg-type]
                        again=again)
        _add_run(s, rec.bisect_id, run)
        _launch(s, rec, run)


def _launch(s: Session, rec: BisectRecord, run: BisectRun) -> None:
    cand = rec.candidates[run.index]
    devices = run.module or ",".join(m for m in rec.modules if m not in rec.lost)
    req: ValidateRequest = release_request(cand.source, models=rec.models, devices=devices, run_id=run.run_id)
    try:
        validate(s, req)
    # the release refused before anything ran (the broker's errors are raised)
    except (ServiceError, FleetError) as exc:
        if isinstance(exc, BrokerUnavailable):
            raise
        why = str(exc)
        runs = tuple(r for r in store(s).load(rec.bisect_id).runs if r.run_id != run.run_id)
        if run.role != "probe":
            store(s).patch(rec.bisect_id, runs=runs, status="failed", message=f"the {run.role} release: {why}")
        else:
            refused = {**store(s).load(rec.bisect_id).refused, run.index: why}
            store(s).patch(rec.bisect_id, runs=runs, refused=refused)
        return
    what = f"{run.role} release" if run.role != "probe" else \
        f"round {run.round}{' again' if run.again else ''}, on {run.module}"
    s.history().set_run_note(run.run_id, f"bisect {rec.bisect_id}: {what}, release {cand.version}")


def _add_run(s: Session, bisect_id: str, run: BisectRun) -> None:
    store(s).update(bisect_id, lambda r: r.model_copy(update={"runs": (*r.runs, run)}))


def _end(s: Session, rec: BisectRecord, status: str, message: str) -> None:
    store(s).patch(rec.bisect_id, status=status, message=message)


def cancel(s: Session, bisect_id: str) -> BisectRecord:
    """Mark the bisection cancelled and cancel its runs still running (a ``fleetctl bisect`` following it stops)."""
    rec = store(s).update(bisect_id, lambda r: r.model_copy(update={"status": "cancelled",
                                                                     "message": "cancelled"})
                          if r.status == "running" else r)
    for r in rec.runs:
        if not _finished(s, r):
            cancel_run(s, r.run_id)
    return rec


# ----------------------------------------------------------------------------------------------- calls


def _view(s: Session, r: BisectRun) -> RunView:
    """The run as the history holds it; pulled from the broker while it has not ended there."""
    v = s.fleet().view(r.run_id)
    return v if v.finished else broker_call(s, lambda: s.fleet().sync(r.run_id))


def _finished(s: Session, r: BisectRun) -> bool:
    return _view(s, r).finished


def _set_targets(s: Session, rec: BisectRecord) -> BisectRecord:
    """The regressions of the bad release against the good one on these modules (paired), or the end."""
    from controller.report.analysis.paired import PAIRED_TOLERANCE, paired_compare, paired_thresholds
    from controller.report.load import read_rows
    from controller.report.model import PairedRun

    good = next(r for r in rec.runs if r.role == "good")
    bad = next(r for r in rec.runs if r.role == "bad")
    rows = read_rows(s.read_history(), [good.run_id, bad.run_id])
    th = paired_thresholds(PAIRED_TOLERANCE if rec.tolerance is None else rec.tolerance, alpha=REFERENCE_ALPHA)
    rep = report_call(lambda: paired_compare(rows, [PairedRun(run_id=good.run_id, arm="A", round=0),
                                                     PairedRun(run_id=bad.run_id, arm="B", round=0)],
                                             release_a=rec.candidates[0].version,
                                             release_b=rec.candidates[-1].version, th=th))
    if rec.metric is not None:
        found = [c for c in rep.changes if c.metric == rec.metric and c.status == "regressed"]
    else:
        found = list(rep.regressions)
    targets = tuple(TargetRecord(model_key=c.model_key, metric=c.metric, bad_change=c.change) for c in found)
    if not targets:
        seen = "; ".join(f"{c.model_key} {c.metric} {c.change:+.1%} p={c.p_value:.2g}" for c in rep.changes
                         if rec.metric is None or c.metric == rec.metric) or "no figure of both"
        msg = (f"release {rec.candidates[-1].version} shows no regression against {rec.candidates[0].version} on "
               f"{', '.join(rep.modules) or 'these modules'} beyond {th.tolerance:.1%} at p < {th.alpha} ({seen}): "
               "nothing to bisect")
        return store(s).patch(rec.bisect_id, status="failed", message=msg)
    return store(s).patch(rec.bisect_id, targets=targets)


def assess(s: Session, rec: BisectRecord) -> Outcome:
    """The calls the finished runs of the bisection support (reads the history; writes nothing)."""
    from controller.report.load import read_rows

    probes = [r for r in rec.runs if r.role == "probe"]
    good = next((r for r in rec.runs if r.role == "good"), None)
    if rec.targets is None or good is None:
        return Outcome(rec, (), (), (), (), None)
    targets = [Target(t.model_key, t.metric, t.bad_change) for t in rec.targets]
    rows = read_rows(s.read_history(), [good.run_id, *(r.run_id for r in probes)])
    evidence: list[Evidence] = []
    measures: dict[int, list[BisectRun]] = {}
    failed: set[int] = set()
    tried: set[int] = set()
    moved: dict[int, int] = {}
    for r in probes:
        tried.add(r.index)
        p = _view(s, r).progress.get(r.module)
        outcome = _outcome(p, rows, r, targets)
        if outcome == "measured":
            measures.setdefault(r.index, []).append(r)
        elif outcome == "failed":
            failed.add(r.index)
        elif outcome == "lost":
            moved[r.index] = moved.get(r.index, 0) + 1
            # lost (or cancelled) again and again: skipped, not run forever
            if moved[r.index] >= MAX_MEASURES:
                failed.add(r.index)
        changes = _changes(rows, good.run_id, [r], targets) if outcome == "measured" else (None,) * len(targets)
        evidence.append(Evidence(r, rec.candidates[r.index].version, changes, outcome))
    calls: list[Call | None] = [None] * len(rec.candidates)
    calls[0], calls[-1] = "good", "bad"
    unsure: list[int] = []
    for i, runs in measures.items():
        pooled = _changes(rows, good.run_id, runs, targets)
        final = len(runs) >= MAX_MEASURES
        c = call_of([target_call(t, m, final=final) if m is not None else "unsure"
                     for t, m in zip(targets, pooled, strict=True)])
        if c == "unsure" and not final:
            unsure.append(i)
        elif c != "unsure":
            calls[i] = c
        else:
            # no figure on a target after every measurement
            calls[i] = "skip"
    for i in (failed | set(rec.refused)) - set(measures):
        calls[i] = "skip"
    homeless = sorted(tried - set(measures) - failed)
    return Outcome(rec, tuple(calls), tuple(sorted(unsure)), tuple(homeless), tuple(evidence), bounds(calls))


def _outcome(p: RunProgress | None, rows: object, r: BisectRun, targets: Sequence[Target]) -> str:
    """``measured`` (its rows are in), ``lost`` (the module, not the release: lost, never delivered, cancelled),
    ``failed`` (the release: a step or a target key failed), or ``running``."""
    import pandas as pd

    assert isinstance(rows, pd.DataFrame)
    if p is None or not p.state.terminal:
        return "running"
    if p.state in (RunState.LOST, RunState.CANCELLED) or (p.state == RunState.FAILED and p.attempt == 0):
        return "lost"
    keys = {t.model_key for t in targets}
    if p.state == RunState.FAILED or any(o.status == "failed" and o.model_key in keys for o in p.outcomes):
        return "failed"
    mine = rows[(rows["run_id"].astype(str) == r.run_id)] if len(rows) else rows
    return "measured" if len(mine) and keys <= set(mine["model_key"].astype(str)) else "failed"


def _changes(rows: object, good_id: str, runs: Sequence[BisectRun],
             targets: Sequence[Target]) -> tuple[Measured | None, ...]:
    """The paired change of the candidate's runs against the good release's run on the same modules, per target:
    measurement ``j`` pairs the candidate's rows on its module with the good run's rows of that module."""
    import numpy as np
    import pandas as pd

    from controller.report.analysis.paired import paired_compare
    from controller.report.model import ALL_METRICS, PairedRun, ReportError

    assert isinstance(rows, pd.DataFrame)
    parts, plan = [], []
    run_col = rows["run_id"].astype(str)
    module_col = rows["module"].astype(str)
    for j, r in enumerate(runs):
        a = rows[(run_col == good_id) & (module_col == r.module)].astype({"run_id": str})
        b = rows[(run_col == r.run_id) & (module_col == r.module)].astype({"run_id": str})
        parts += [a.assign(run_id=f"A{j}"), b.assign(run_id=f"B{j}")]
        plan += [PairedRun(run_id=f"A{j}", arm="A", round=j), PairedRun(run_id=f"B{j}", arm="B", round=j)]
    frame = pd.concat(parts, ignore_index=True)
    frame = frame[frame["model_key"].astype(str).isin({t.model_key for t in targets})]
    wanted = {t.metric for t in targets}
    # only the targets' figures: every other metric's signed-rank test (a permutation test where the simulated
    # figures tie) cost a followed bisection most of a core
    frame = frame.assign(**{m: np.nan for m in ALL_METRICS if m in frame.columns and m not in wanted})
    try:
        rep = paired_compare(frame, plan, release_a="good", release_b="candidate")
    except ReportError:
        return (None,) * len(targets)
    by = {(c.model_key, c.metric): c for c in rep.changes}
    out: list[Measured | None] = []
    for t in targets:
        c = by.get((t.model_key, t.metric))
        out.append(None if c is None else Measured(c.change, c.ci_low, c.ci_high))
    return tuple(out)


def _lost(s: Session, out: Outcome, rec: BisectRecord) -> tuple[str, ...]:
    """Modules left out: those a run of the bisection was lost on (not cancelled) and still not usable."""
    lost = set(rec.lost)
    gone = [e.run.module for e in out.evidence if e.outcome == "lost" and e.run.module]
    if gone:
        mods = [m for m in s.inventory().modules if m.name in gone]
        statuses = broker_call(s, lambda: s.broker().statuses(mods)) if mods else {}
        lost |= {n for n, st in statuses.items() if st.state in ("offline", "unreachable", "bad")}
    return tuple(sorted(lost))
