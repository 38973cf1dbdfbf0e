"""A run's life through the service: validate (or resume), retry, sync, view, follow, judge, cancel.

:func:`validate` checks everything that needs no broker first (:func:`prepare`), then makes
the release available on each module (:mod:`controller.service.releases`) and dispatches.
Of these, :func:`sync`, :func:`judge`, :func:`validate`, :func:`retry` and :func:`cancel`
write the run history; :func:`find_run` and :func:`view` only read it.

Lazy imports: :mod:`controller.report` is imported by :func:`judge` and the change-point check only: it
loads pandas (462 ms CPU a fresh process, ``bench/import_costs.py``:
bench/results/import_costs_20261207_0346_lazy-libraries.txt), which ``fleetctl status`` of a
judged run, ``validate`` and ``sync`` do not need (``tests/cli/test_lean_verbs.py``), and a controller
installed without pandas judges by the modules' states alone.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path

from contract import compat
from contract.compat import refused_line
from contract.priority import check_priority
from contract.records import MODEL_KEYS, RunProgress, RunState, parse_model_keys
from contract.settings import RESULT_EXPIRES
from contract.vocab import BadInput
from contract.vocab import check_run_id as check
from controller.command import fleetctl
from controller.fleet import (
    BadRelease,
    ModuleStatus,
    RunIdInUse,
    RunView,
    module_failed,
    new_run_id,
    newer_progress,
    refused_parts,
    release_version,
)
from controller.fleet.reservations import ON_RESERVED, split_reserved
from controller.fleet.runs import refused_note
from controller.history import CHANGE_CHECK_EVENT, CHANGE_POINT_EVENT, History, HistoryError, RunInfo
from controller.inventory import Module, select
from controller.service.records import Judgement, Launched, ValidateRequest
from controller.service.release_url import ReleaseUrlError, check_release_url, check_sha256, clip
from controller.service.releases import (
    distribute,
    download_release,
    prune_releases,
    read_release,
    release_problem,
)
from controller.service.reservations import refused_for
from controller.service.session import (
    BadRequest,
    Conflict,
    Forbidden,
    NotFound,
    Session,
    UnusableRelease,
    broker_call,
    report_call,
)


def check_run_id(run_id: str) -> str:
    try:
        return check(run_id)
    except BadInput as exc:
        raise BadRequest(str(exc)) from None


def check_baseline(s: Session, baseline: str) -> str:
    """The baseline's run id; BadRequest when the history has no such baseline (never writes)."""
    found = s.history().baseline_run_id(baseline) if s.has_history() else None
    if found is None:
        raise BadRequest(f"no baseline {baseline!r} in {s.history_path} (see: {fleetctl('baseline', 'list')})")
    return found


def prepare(s: Session, req: ValidateRequest) -> tuple[str, list[Module], RunInfo | None]:
    """Every check that needs no broker and no hashing, before anything is dispatched:
    (release version, modules, the run resumed or None)."""
    if (req.release is None) == (req.url is None):
        raise BadRequest("give the release as a path or as a URL (one of them)")
    try:
        check_sha256(req.sha256)
        if req.url is not None:
            version = release_version(Path(check_release_url(req.url).name))
    except ReleaseUrlError as exc:
        raise UnusableRelease(str(exc)) from None
    if req.release is not None:
        try:
            found = req.release.is_file()
        except OSError:  # a name too long for the file system, say
            found = False
        if not found:
            raise BadRelease(f"{clip(str(req.release))}: no such release tarball")
        version = release_version(req.release)
    parse_model_keys(list(req.models))
    try:
        check_priority(req.priority)
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
    if req.on_reserved not in ON_RESERVED:
        raise BadRequest(f"--on-reserved {req.on_reserved!r}: use one of {', '.join(ON_RESERVED)}")
    if req.preempt and req.priority != "urgent":
        raise BadRequest(f"--preempt stops running runs for an urgent one: give --priority urgent (not {req.priority})")
    mods = s.inventory().select(req.devices)
    if req.baseline:
        check_baseline(s, req.baseline)
    existing = s.history().run(req.run_id) if req.run_id and s.has_history() else None
    if req.run_id:
        check_run_id(req.run_id)
        if existing is not None and not req.resume:
            raise Conflict(f"run id {req.run_id!r} already exists in {s.history_path}; give --resume to resume it, "
                           "or choose another run id")
        if existing is not None and existing.kind != "run":
            raise Conflict(f"{req.run_id!r} is a {existing.kind}, not a run")
    if req.resume and existing is None:
        raise NotFound(f"--resume: no run {req.run_id!r} in {s.history_path}")
    if existing is not None:
        # refused before anything is hashed or downloaded
        resumed_models(existing, req.models)
    return version, mods, existing


def validate(s: Session, req: ValidateRequest) -> Launched:
    """Check the request, make the release available on each module, dispatch. Returns at once."""
    version, mods, existing = prepare(s, req)
    # before the fleet: the run is recorded in this history
    h = s.history()
    fleet = s.broker()
    models = resumed_models(existing, req.models) if existing is not None else req.models
    # a tarball: hashed, and its members listed until the pipeline's files were seen, in one read; a URL: hashed while
    # it downloaded, and checked against req.sha256 there
    if req.release is not None:
        release = req.release
        sha, problem = read_release(release, models)
    else:
        release, sha = download_release(s, str(req.url), req.sha256)
        problem = release_problem(release, models)
    if req.sha256 and sha != req.sha256.strip().lower():
        raise UnusableRelease(f"{release}: sha256 {sha[:12]}… does not match the expected {req.sha256[:12]}…")
    if existing is not None and existing.sha256 and existing.sha256 != sha:
        raise Conflict(f"run {existing.run_id!r} validated another release ({existing.release}, sha256 "
                       f"{existing.sha256[:12]}); {release} has sha256 {sha[:12]}: not resumed")
    # before anything is dispatched or pushed: refused once, not by every module
    if problem is not None:
        raise BadRelease(f"{clip(str(release))}: {problem}")
    if existing is not None:
        h.set_run_state(existing.run_id, "running")
    rid = req.run_id or new_run_id()
    # before the release is pushed: a run id another controller used (dispatch checks it again)
    try:
        names = [m.name for m in mods]
        broker_call(s, lambda: fleet.check_new_run_id(rid, resume=existing is not None, modules=names))
    except RunIdInUse as exc:
        raise Conflict(str(exc)) from None
    statuses = broker_call(s, lambda: fleet.statuses(mods))
    # reserved by another user: left out, or queued there to wait for the reservation's end (the agent holds it)
    refused, waiting = split_reserved(refused_for(s, [m.name for m in mods], req.user or s.user), len(mods),
                                      req.on_reserved)
    usable = [m for m in mods if statuses[m.name].state not in ("offline", "bad")  # unreachable: queued
              and m.name not in refused]
    # before the release is pushed and the run is created
    apart = check_contracts(usable, statuses)
    victims = preemptable(s, rid, [m.name for m in usable], statuses) if req.preempt else {}
    if not req.preempt_others:
        check_preempt(victims, req.user or s.user, reserved_by(s, list(victims), req.user or s.user))
    paths, errors = distribute(s, usable, release, sha)
    # a resumed run asks each module for what it asked it before (a module answers a run id only for that request)
    own = existing.module_models if existing is not None else req.module_models
    result = fleet.dispatch(run_id=rid, modules=mods, tarballs=paths, sha256=sha, release=version, models=models,
                            tarball_label=str(release.resolve()), statuses=statuses,
                            resume=existing is not None, module_models=own, priority=req.priority,
                            refused=refused, user=req.user or s.user)
    # the row dispatch made (a resumed run keeps its first user)
    h.set_started_by(rid, req.user or s.user)
    result.update(errors)
    preempted = preempt_running(s, rid, result, victims)
    prune_releases(s)
    return Launched(rid, version, sha, tuple(models), dict(result), resumed=existing is not None, preempted=preempted,
                    waiting={m: why for m, why in waiting.items() if result.get(m) == "queued"},
                    apart={m: note for m, note in apart.items() if result.get(m) == "queued"})


def check_contracts(modules: Sequence[Module], statuses: Mapping[str, ModuleStatus]) -> dict[str, str]:
    """:class:`Conflict`, naming ``fleetctl deploy``, when a module's agent cannot run this controller's requests
    (its heartbeat's contract version too far from ours, :func:`contract.compat.judge`): refused before the run is
    created, not a failed run in the history. Else module -> what to upgrade, for those one version apart (pure)."""
    found = {m.name: compat.judge(hb.schema_version) for m in modules if (hb := statuses[m.name].heartbeat) is not None}
    refused = {name: c for name, c in found.items() if not c.runs}
    if refused:
        raise Conflict(refused_line(refused))
    return {name: c.note(name) for name, c in found.items() if c.note(name)}


def preemptable(s: Session, rid: str, modules: Sequence[str], statuses: Mapping[str, ModuleStatus]
                ) -> dict[str, RunInfo]:
    """module -> the run it is running (by its heartbeat) that ``rid`` would preempt there: any but an urgent one
    (urgent runs do not preempt each other) and ``rid`` itself."""
    h = s.history()
    out: dict[str, RunInfo] = {}
    for m in modules:
        hb = statuses[m].heartbeat if m in statuses else None
        running = hb.run_id if hb is not None else None
        if not running or running == rid:
            continue
        info = h.run(running)
        if info is not None and info.priority != "urgent":
            out[m] = info
    return out


def reserved_by(s: Session, modules: Sequence[str], user: str) -> set[str]:
    """Those of ``modules`` that ``user`` holds a reservation of."""
    if not modules:
        return set()
    fleet = s.fleet()
    return {m for m, r in broker_call(s, lambda: fleet.held(modules)).items() if r.user == user}


def check_preempt(victims: Mapping[str, RunInfo], user: str, reserved: set[str]) -> None:
    """Refused (:class:`Forbidden`, naming the run, its user and the module) when ``user`` would preempt another
    user's run on a module ``user`` has not reserved (pure)."""
    for m, info in victims.items():
        if info.started_by and info.started_by != user and m not in reserved:
            raise Forbidden(f"--preempt would stop run {info.run_id} of user {info.started_by} on {m}: preempting "
                            f"another user's run needs role admin, or your reservation of {m}")


def preempt_running(s: Session, rid: str, queued: Mapping[str, str], victims: Mapping[str, RunInfo]
                    ) -> dict[str, str]:
    """Ask each module ``rid`` was queued on to stop the run :func:`preemptable` named there: it is interrupted as
    for a clean shutdown and resumes from its passed keys after ``rid``. module -> the run asked to stop."""
    fleet = s.fleet()
    out = {m: info.run_id for m, info in victims.items() if queued.get(m) == "queued"}
    for m, running in out.items():
        broker_call(s, partial(fleet.kv.preempt, running, m, rid))
    return out


def resumed_models(existing: RunInfo, asked: tuple[str, ...]) -> tuple[str, ...]:
    """The model keys a resumed run asks its modules for: the run's own (a module answers a run id only for
    the same request). ``all`` (the default) means all of the run's; another set is refused."""
    if set(asked) == set(existing.models) or set(asked) == set(MODEL_KEYS):
        return tuple(existing.models)
    raise Conflict(f"run {existing.run_id!r} validates models {','.join(existing.models)}; --resume resumes the "
                   f"same models (leave --models out, or give those)")


def retry(s: Session, run: str, *, failed_only: bool = False, run_id: str | None = None, user: str = "") -> Launched:
    """A new run of the same release and model keys on the same modules (``failed_only``: only the
    modules whose part failed, was cancelled or lost, each with the keys that did not pass there), started by
    ``user`` ('' : the session's)."""
    info = find_run(s, run)
    models = info.models
    devices = ",".join(info.modules)
    # a retry of a retry asks each module for what it was asked
    own = dict(info.module_models)
    if failed_only:
        view = s.fleet().view(info.run_id)
        failed = {m: p for m, p in view.progress.items() if p is None or p.state != RunState.DONE or module_failed(p)}
        if not failed:
            raise BadRequest(f"run {info.run_id}: no module failed; nothing to retry")
        own = {m: retried_keys(info.models_of(m), p) for m, p in failed.items()}
        models = tuple(k for k in info.models if any(k in keys for keys in own.values()))
        devices = ",".join(failed)
    if not info.tarball:
        raise BadRequest(f"run {info.run_id} has no release path recorded")
    return validate(s, ValidateRequest(release=Path(info.tarball), models=models, devices=devices, run_id=run_id,
                                       module_models=own, priority=info.priority, user=user))


def retried_keys(asked: tuple[str, ...], p: RunProgress | None) -> tuple[str, ...]:
    """The keys a module runs again in ``retry --failed-only``: those of ``asked`` that did not pass there, or all
    of them when every one passed and its part failed all the same (its final state never arrived, say) (pure)."""
    passed = {o.model_key for o in p.outcomes if o.status == "passed"} if p is not None else set()
    return tuple(k for k in asked if k not in passed) or asked


def find_run(s: Session, run: str) -> RunInfo:
    """A run by id, unique prefix or 'latest' (never writes)."""
    if not s.has_history():
        raise NotFound(f"no run {run!r}: {s.no_history()}")
    try:
        return s.read_history().find_run(run)
    except HistoryError as exc:
        raise NotFound(str(exc)) from None


def sync(s: Session, run_id: str) -> RunView:
    """Pull the run's progress and rows from the broker into the history (writes)."""
    return s.fleet().sync(run_id)


def settled_view(s: Session, info: RunInfo, now: float | None = None) -> RunView | None:
    """The view of an ended run from the history alone when nothing on the broker can change it any more: every
    module's recorded state is final, and none is a module given up (LOST) young enough for late rows to be taken
    (:meth:`Fleet.sync`'s rule, ``RESULT_EXPIRES``). None otherwise: then :func:`sync` reads the broker. Opens no
    broker connection and imports no Celery (``fleetctl status`` of a judged run, issue 47)."""
    if info.state == "running":
        return None
    known = s.read_history().progress(info.run_id)
    now = time.time() if now is None else now
    late_ok = now - info.created_at < RESULT_EXPIRES
    for m in info.modules:
        p = known.get(m)
        if p is None or not p.state.terminal or (late_ok and p.state == RunState.LOST):
            return None
    return RunView(info.run_id, info.modules, {m: known[m] for m in info.modules})


def view(s: Session, run: str, *, live: bool = False) -> RunView:
    """The run's state per module from the history; ``live``: the broker's newer progress of the
    modules not finished yet, read without writing."""
    info = find_run(s, run)
    fleet = s.fleet()
    base = fleet.view(info.run_id)
    pending = [m for m, p in base.progress.items() if p is None or not p.state.terminal]
    if not live or not pending:
        return base
    fresh = broker_call(s, lambda: fleet.kv.progress(info.run_id, pending))
    return RunView(base.run_id, base.modules, newer_progress(base.progress, fresh))


def follow(s: Session, run_id: str, *, on_view: Callable[[RunView], None] | None = None, interval: float = 0.5,
           timeout: float | None = None) -> RunView:
    """Sync until every module of the run is finished (or ``timeout``), calling ``on_view`` each time."""
    end = None if timeout is None else time.monotonic() + timeout
    while True:
        v = sync(s, run_id)
        if on_view is not None:
            on_view(v)
        if v.finished or (end is not None and time.monotonic() > end):
            return v
        time.sleep(interval)


def judge(s: Session, run: str, baseline: str | None = None, *, tolerance: float | None = None) -> Judgement:
    """The verdict of a run from what the history holds, recorded in the history (writes)."""
    h = s.history()
    try:
        info = h.find_run(run)
    except HistoryError as exc:
        raise NotFound(str(exc)) from None
    v = s.fleet().view(info.run_id)
    state = v.state() if v.finished else "running"
    failed = state in ("failed", "cancelled")
    rep = None
    findings = None
    try:
        from controller.report import build_report
        from controller.report.model import Thresholds
        from controller.report.render import findings_json, verdict_line
    # no controller extras (pandas): the modules' states alone
    except ModuleNotFoundError:
        refused = refused_parts(v.progress)
        verdict, line = (state, f"{state.upper()} {info.run_id}: some modules {state}") if failed else (
            ("incomplete", f"INCOMPLETE {info.run_id}: {refused_note(refused, len(v.progress) - len(refused))}")
            if refused else ("pass", f"PASS {info.run_id}: every module finished"))
    else:
        th = Thresholds(tolerance=tolerance) if tolerance is not None else None
        rep = report_call(lambda: build_report(h, info.run_id, baseline=baseline, thresholds=th,
                                               same_environment=s.settings.baseline_same_environment))
        verdict, line, findings = str(rep.verdict), verdict_line(rep), findings_json(rep)
        if failed and verdict == "pass":
            verdict, line = "failed", f"some modules {state}; {line}"
    h.set_run_state(info.run_id, state, verdict=verdict, line=line if state != "running" else None,
                    findings=findings)
    if rep is not None and state != "running" and info.release:
        queue_change_check(h, info, verdict, line, state)
    return Judgement(info.run_id, verdict, line, state, rep)


def queue_change_check(h: History, info: RunInfo, verdict: str, line: str, state: str) -> bool:
    """Queue the search for the change points the run made detectable (:func:`queue_change_points`) for
    ``fleetctl serve``, the sender of webhooks, to run in a thread of its own (ADR 0043): the path that ends a run
    searches nothing. Nothing is queued while the history holds fewer releases than a change point needs."""
    from controller.report.trend import MIN_RELEASES

    if h.release_count() < MIN_RELEASES:
        return False
    h.queue_webhook(info.run_id, CHANGE_CHECK_EVENT, verdict, line, state, "")
    return True


def queue_change_points(h: History, info: RunInfo, verdict: str, state: str) -> int:
    """Queue the webhook event of the change points across the release history that the run made detectable
    (those of its model keys the history without it does not have: a level shift is named once), when there
    are any; how many. A history the detector cannot take is left unsaid (the verdict stands).

    The path that ends a run (ADR 0043): nothing is read or searched while the history holds fewer releases than a
    change point needs (a run whose release has no neighbour cannot make one), and then only the run's own series
    (:func:`controller.report.trend.new_changes`), never every series of the history."""
    from controller.report.load import history_frames, read_rows, run_keys
    from controller.report.model import ReportError
    from controller.report.trend import MIN_RELEASES, change_payload, describe, new_changes, scope_of

    if h.release_count() < MIN_RELEASES:
        return 0
    try:
        rows, runs = history_frames(h, run_keys(info, read_rows(h, [info.run_id])))
        found = new_changes(rows, runs, info.run_id)
    except ReportError:
        return 0
    if not found:
        return 0
    lead = max(found, key=lambda c: abs(c.change.size))
    line = (f"{len(found)} new change point{'s' if len(found) > 1 else ''} with run {info.run_id} ({info.release}): "
            f"{lead.model_key} {lead.profile} {lead.metric} {describe(lead)} ({scope_of(lead.module)})")
    h.queue_webhook(info.run_id, CHANGE_POINT_EVENT, verdict, line, state,
                    json.dumps({"change_points": [change_payload(c) for c in found]}))
    return len(found)


def recorded_judgement(info: RunInfo) -> Judgement | None:
    """The verdict the history holds for an ended run, as it was reached (its baseline included), or
    None when there is none to show (running, never judged, resumed since, or judged before the
    history kept the line): then :func:`judge` reaches it. No report is built here, so ``fleetctl
    status`` of an ended run needs neither pandas nor the rows."""
    if info.state == "running" or info.verdict is None or info.verdict_line is None:
        return None
    return Judgement(info.run_id, info.verdict, info.verdict_line, info.state)


def cancel(s: Session, run: str, devices: str | None = None, *, user: str = "") -> tuple[str, list[str]]:
    """Durable cancel of a run, or of the modules of it that ``devices`` selects: (run id, modules). Who sent it
    (``user``; '': the session's) is the cancel's reason on the broker and an event of each module in the history."""
    info = find_run(s, run)
    names = list(info.modules)
    if devices:
        known = {m.name: m for m in s.inventory().modules}
        names = [m.name for m in select([known[n] for n in info.modules if n in known], devices)]
    fleet = s.broker()
    who = user or s.user
    broker_call(s, lambda: fleet.cancel(info.run_id, None if not devices else names, reason=f"cancelled by {who}"))
    s.history().add_events(info.run_id, names, f"cancel requested by {who}")
    return info.run_id, names
