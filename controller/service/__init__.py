"""The controller's service layer: what ``fleetctl``, the HTTP API, the demo and the benchmarks call.

A :class:`Session` holds one caller's resources (settings, inventory, run history, fleet),
opened when first asked for and closed together. There is no global session: the CLI makes
one per invocation, the HTTP API one per worker thread, the demo and the benchmarks their own.

The operations are functions of a session. They return typed values and raise
:class:`ServiceError` leaves (bad input, not found, conflict) or the fleet's
``BrokerUnavailable``; front ends turn those into one line and exit code 2, or an HTTP status.
Reading never writes the run history, except the operations whose name says so:
:func:`sync` (pull progress and rows from the broker), :func:`judge` (record the verdict),
:func:`validate`, :func:`retry` and :func:`cancel`.

Heavy parts (pandas for reports, paramiko for SSH) are imported inside the operations that
need them, so that a front end which does not use them never loads them.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contract.files import sha256_file
from contract.records import MODEL_KEYS, ResultRow, RunProgress, RunState, parse_model_keys
from contract.settings import load_settings
from controller.errors import FleetctlError
from controller.fleet import (
    BadRelease,
    BrokerUnavailable,
    Fleet,
    FleetError,
    ModuleStatus,
    RunIdInUse,
    RunView,
    broker_errors,
    module_failed,
    new_run_id,
    release_version,
)
from controller.history import History, HistoryError, RunInfo
from controller.inventory import Inventory, Module, load_inventory, select
from controller.settings import ControllerSettings

if TYPE_CHECKING:
    from controller.report.model import Report

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- errors
class ServiceError(FleetctlError, RuntimeError):
    """Root of the service's own errors: the user's to fix (one line, exit 2, HTTP 4xx)."""


class BadRequest(ServiceError, ValueError):
    """Bad input: no such tarball, unknown baseline, bad run id (HTTP 400)."""


class NotFound(ServiceError, LookupError):
    """No such run or module (HTTP 404)."""

    http_status = 404


class Conflict(ServiceError):
    """The request contradicts what exists: a run id already used (HTTP 409)."""

    http_status = 409


class UnusableRelease(ServiceError, ValueError):
    """A release URL that is bad, unreachable, too big, or a release whose sha256 is not the one
    asked for (HTTP 422). Nothing half-downloaded is left."""

    http_status = 422


# --------------------------------------------------------------------------- session
@dataclass
class Session:
    """Settings, inventory, run history and fleet of one caller, opened lazily, closed together."""

    settings: ControllerSettings
    _history: History | None = None
    _inventory: Inventory | None = None
    _fleet: Fleet | None = None
    _closers: list[Callable[[], None]] = field(default_factory=list)

    @classmethod
    def load(cls, config: Path | None = None, *, inventory: Path | None = None,
             history: Path | None = None) -> Session:
        """A session on the settings of ``config`` (else ``FLEET_CONFIG``), ``FLEET_*`` and overrides."""
        return cls(load_settings(ControllerSettings, config, inventory=inventory, history=history))

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for c in reversed(self._closers):
            with contextlib.suppress(Exception):
                c()
        self._closers.clear()
        self._history = self._fleet = None

    @property
    def history_path(self) -> Path:
        return self.settings.history_path

    def history(self) -> History:
        """The run history, created when absent (for operations that write it)."""
        if self._history is None:
            self._history = History(self.history_path)
            self._closers.append(self._history.close)
        return self._history

    def has_history(self) -> bool:
        return self._history is not None or self.history_path.exists()

    def read_history(self) -> History:
        """The run history for reading: never creates one (NotFound when there is none yet)."""
        if not self.has_history():
            raise NotFound(f"no run history at {self.history_path} yet (no run was started with these settings)")
        return self.history()

    def inventory(self) -> Inventory:
        if self._inventory is None:
            self._inventory = load_inventory(self.settings.inventory)
        return self._inventory

    def fleet(self) -> Fleet:
        """The broker seam, on the run history (created when absent)."""
        if self._fleet is None:
            self._fleet = Fleet(self.settings, self.history(), failures_for_bad=self.settings.failures_for_bad,
                                failures_cooldown=self.settings.failures_cooldown,
                                clock_skew_warn=self.settings.clock_skew_warn)
            self._closers.append(self._fleet.close)
        return self._fleet

    def read_fleet(self) -> Fleet:
        """The broker seam for reading module states: without a run history file yet, on an empty
        one in memory (the states need the failure counts), so that no file is created."""
        if self._fleet is None and not self.has_history():
            empty = History(":memory:")
            self._closers.append(empty.close)
            self._fleet = Fleet(self.settings, empty, failures_for_bad=self.settings.failures_for_bad,
                                failures_cooldown=self.settings.failures_cooldown,
                                clock_skew_warn=self.settings.clock_skew_warn)
            self._closers.append(self._fleet.close)
        return self.fleet()

    def broker(self, *, read: bool = False) -> Fleet:
        """The fleet, its broker checked first (one clear error when it cannot be reached)."""
        fleet = self.read_fleet() if read else self.fleet()
        fleet.check_broker()
        return fleet


def _broker_call(s: Session, fn: Callable[[], Any]) -> Any:
    """Run a broker read; a broker that cannot be reached is one BrokerUnavailable naming it."""
    try:
        return fn()
    except broker_errors() as exc:  # redis/kombu are imported only when something was raised
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise BrokerUnavailable(f"broker {s.settings.redacted_broker_url()} unreachable: {first}") from exc


# --------------------------------------------------------------------------- records
@dataclass(frozen=True)
class ValidateRequest:
    """What ``fleetctl validate`` and ``POST /api/v1/runs`` ask for.

    The release is a path as the controller sees it, or (``url``, then ``release`` is None) an
    http/https URL it downloads into ``<data_dir>/releases/<sha256>/`` once every other check
    passed. ``sha256``: what the release must hash to (checked before anything is dispatched).
    """

    release: Path | None
    models: tuple[str, ...] = tuple(MODEL_KEYS)
    devices: str = "all"
    baseline: str | None = None
    run_id: str | None = None
    resume: bool = False
    url: str | None = None
    sha256: str | None = None


def release_request(release: str, *, models: tuple[str, ...] = tuple(MODEL_KEYS), devices: str = "all",
                    baseline: str | None = None, run_id: str | None = None, resume: bool = False,
                    sha256: str | None = None) -> ValidateRequest:
    """A request for the release as a person or a CI job typed it: an http/https URL (downloaded
    by the controller) or a path as the controller sees it."""
    from controller.service.release_url import is_url

    url = release if is_url(release) else None
    return ValidateRequest(release=None if url else Path(release).expanduser(), url=url, models=models,
                           devices=devices, baseline=baseline, run_id=run_id, resume=resume, sha256=sha256)


@dataclass(frozen=True)
class Launched:
    """A run dispatched: module -> "queued" or why it was not."""

    run_id: str
    release: str
    sha256: str
    models: tuple[str, ...]
    modules: Mapping[str, str]
    resumed: bool = False

    @property
    def queued(self) -> int:
        return sum(v == "queued" for v in self.modules.values())


@dataclass(frozen=True)
class Judgement:
    run_id: str
    verdict: str  # pass | regressed | incomplete | failed | cancelled
    line: str  # the one-line verdict (the report's verdict line when reports are installed)
    state: str  # the run's state: running | done | failed | cancelled
    report: Report | None = None

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"


@dataclass(frozen=True)
class Device:
    module: Module
    status: ModuleStatus


@dataclass(frozen=True)
class RunDetail:
    info: RunInfo
    view: RunView
    rows: int

    @property
    def state(self) -> str:
        return self.view.state() if self.view.finished else "running"


@dataclass(frozen=True)
class ModuleDetail:
    module: Module
    status: ModuleStatus
    recent: tuple[tuple[RunInfo, RunProgress | None], ...]


@dataclass(frozen=True)
class LogFile:
    module: str
    name: str  # NN-step[-key].log
    step: str
    model_key: str | None
    path: str
    text: str


def exit_code(verdict: str | None) -> int:
    """The CLI's exit code for a verdict: 0 pass, 1 anything else (failed, regressed, ...)."""
    return 0 if verdict == "pass" else 1


# --------------------------------------------------------------------------- validate
def check_run_id(run_id: str) -> str:
    from agent.errors import BadInput
    from agent.store import check_run_id as check

    try:
        return check(run_id)
    except BadInput as exc:
        raise BadRequest(str(exc)) from None


def check_baseline(s: Session, baseline: str) -> str:
    """The baseline's run id; BadRequest when the history has no such baseline (never writes)."""
    found = s.history().baseline_run_id(baseline) if s.has_history() else None
    if found is None:
        raise BadRequest(f"no baseline {baseline!r} in {s.history_path} (see: fleetctl baseline list)")
    return found


def prepare(s: Session, req: ValidateRequest) -> tuple[str, list[Module], RunInfo | None]:
    """Every check that needs no broker and no hashing, before anything is dispatched:
    (release version, modules, the run resumed or None)."""
    from controller.service.release_url import ReleaseUrlError, check_release_url, check_sha256, clip

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
        resumed_models(existing, req.models)  # refused before anything is hashed or downloaded
    return version, mods, existing


def validate(s: Session, req: ValidateRequest) -> Launched:
    """Check the request, make the release available on each module, dispatch. Returns at once."""
    version, mods, existing = prepare(s, req)
    h = s.history()  # before the fleet: the run is recorded in this history
    fleet = s.broker()
    if req.release is not None:
        release, sha = req.release, sha256_file(req.release)
    else:  # hashed while it downloaded, and checked against req.sha256 there
        release, sha = download_release(s, str(req.url), req.sha256)
    if req.sha256 and sha != req.sha256.strip().lower():
        raise UnusableRelease(f"{release}: sha256 {sha[:12]}… does not match the expected {req.sha256[:12]}…")
    if existing is not None and existing.sha256 and existing.sha256 != sha:
        raise Conflict(f"run {existing.run_id!r} validated another release ({existing.release}, sha256 "
                       f"{existing.sha256[:12]}); {release} has sha256 {sha[:12]}: not resumed")
    models = resumed_models(existing, req.models) if existing is not None else req.models
    if existing is not None:
        h.set_run_state(existing.run_id, "running")
    rid = req.run_id or new_run_id()
    try:  # before the release is pushed: a run id another controller used (dispatch checks it again)
        names = [m.name for m in mods]
        _broker_call(s, lambda: fleet.check_new_run_id(rid, resume=existing is not None, modules=names))
    except RunIdInUse as exc:
        raise Conflict(str(exc)) from None
    statuses = _broker_call(s, lambda: fleet.statuses(mods))
    usable = [m for m in mods if statuses[m.name].state not in ("offline", "unreachable", "bad")]
    paths, errors = distribute(s, usable, release, sha)
    result = fleet.dispatch(run_id=rid, modules=mods, tarballs=paths, sha256=sha, release=version, models=models,
                            tarball_label=str(release.resolve()), statuses=statuses,
                            resume=existing is not None)
    result.update(errors)
    prune_releases(s)
    return Launched(rid, version, sha, tuple(models), dict(result), resumed=existing is not None)


def resumed_models(existing: RunInfo, asked: tuple[str, ...]) -> tuple[str, ...]:
    """The model keys a resumed run asks its modules for: the run's own (a module answers a run id only for
    the same request). ``all`` (the default) means all of the run's; another set is refused."""
    if set(asked) == set(existing.models) or set(asked) == set(MODEL_KEYS):
        return tuple(existing.models)
    raise Conflict(f"run {existing.run_id!r} validates models {','.join(existing.models)}; --resume resumes the "
                   f"same models (leave --models out, or give those)")


SHA256_NAME = re.compile(r"[0-9a-f]{64}")


def releases_in_use(s: Session) -> set[str]:
    """sha256 of the releases runs may still read: those of runs not ended (a queued run reads its tarball
    when it starts) and the ``keep_releases`` newest by their last run. Kept staged here and pushed on the
    modules; empty before the first run."""
    return s.read_history().releases_in_use(s.settings.keep_releases) if s.has_history() else set()


def prune_releases(s: Session) -> list[Path]:
    """Remove the releases staged under ``<data_dir>/releases/<sha256>/`` (local transport, URL
    downloads) that no running run uses and that are not among the ``keep_releases`` newest; the
    folders removed. Anything else there (a download in progress, a name not a sha256) stays."""
    root = s.settings.data_dir.expanduser() / "releases"
    if not root.is_dir():
        return []
    keep = releases_in_use(s)
    gone = [d for d in sorted(root.iterdir())
            if d.is_dir() and not d.is_symlink() and SHA256_NAME.fullmatch(d.name) and d.name not in keep]
    for d in gone:
        shutil.rmtree(d, ignore_errors=True)
        log.info("staged release %s removed (kept: %d newest and those of running runs)", d.name,
                 s.settings.keep_releases)
    return gone


def download_release(s: Session, url: str, sha256: str | None = None) -> tuple[Path, str]:
    """Fetch a release URL into ``<data_dir>/releases/<sha256>/<name>`` (streamed, size-limited, with a
    deadline, checked against ``sha256`` when given); its path and sha256. UnusableRelease on any failure."""
    from controller.service.release_url import (
        ReleaseUrlError,
        check_release_url,
        check_sha256,
        fetch_release,
        url_policy,
    )

    try:
        return fetch_release(check_release_url(url), s.settings.data_dir.expanduser() / "releases",
                             sha256=check_sha256(sha256), max_bytes=s.settings.release_download_max_bytes,
                             timeout=s.settings.release_download_timeout, policy=url_policy(s.settings))
    except ReleaseUrlError as exc:
        raise UnusableRelease(str(exc)) from None


def distribute(s: Session, modules: list[Module], tarball: Path, sha: str) -> tuple[dict[str, str], dict[str, str]]:
    """Make the release available on each module: (module -> path there, module -> error).

    Modules of the local transport read it from under the data folder (agents read tarballs only
    from their release roots: ``<data_dir>/releases`` by default); the others get it pushed over SSH.
    """
    paths: dict[str, str] = {}
    local = [m for m in modules if m.transport == "local"]
    if local:
        from agent.validate import stage_local_release

        staged = str(stage_local_release(tarball, sha, s.settings.data_dir))
        paths = {m.name: staged for m in local}
    errors: dict[str, str] = {}
    remote = [m for m in modules if m.transport == "ssh"]
    if remote:
        from controller.remote.push import push_release

        results = push_release(remote, tarball, sha, known_hosts=s.settings.known_hosts, identity=s.settings.ssh_key,
                               keep_newest=s.settings.keep_releases, keep=releases_in_use(s))
        for name, r in results.items():
            if r.pruned:
                log.info("%s: removed %d release(s) pushed there before: %s", name, len(r.pruned),
                         ", ".join(x[:16] for x in r.pruned))
            if r.error:
                errors[name] = f"push failed: {r.error}"
            else:
                paths[name] = str(r.remote_path)
    return paths, errors


def retry(s: Session, run: str, *, failed_only: bool = False, run_id: str | None = None) -> Launched:
    """A new run of the same release and model keys on the same modules (``failed_only``: only the
    modules whose part failed, was cancelled or lost, with the keys that did not pass there)."""
    info = find_run(s, run)
    models = info.models
    devices = ",".join(info.modules)
    if failed_only:
        view = s.fleet().view(info.run_id)
        failed = {m: p for m, p in view.progress.items() if p is None or p.state != RunState.DONE or module_failed(p)}
        if not failed:
            raise BadRequest(f"run {info.run_id}: no module failed; nothing to retry")
        keys: set[str] = set()
        for p in failed.values():
            passed = {o.model_key for o in p.outcomes if o.status == "passed"} if p else set()
            keys |= set(info.models) - passed
        models = tuple(k for k in info.models if k in keys) or info.models
        devices = ",".join(failed)
    if not info.tarball:
        raise BadRequest(f"run {info.run_id} has no release path recorded")
    return validate(s, ValidateRequest(release=Path(info.tarball), models=models, devices=devices, run_id=run_id))


# --------------------------------------------------------------------------- follow and judge
def find_run(s: Session, run: str) -> RunInfo:
    """A run by id, unique prefix or 'latest' (never writes)."""
    if not s.has_history():
        raise NotFound(f"no run {run!r}: no run history at {s.history_path} yet")
    try:
        return s.read_history().find_run(run)
    except HistoryError as exc:
        raise NotFound(str(exc)) from None


def sync(s: Session, run_id: str) -> RunView:
    """Pull the run's progress and rows from the broker into the history (writes)."""
    return s.fleet().sync(run_id)


def view(s: Session, run: str, *, live: bool = False) -> RunView:
    """The run's state per module from the history; ``live``: the broker's newer progress of the
    modules not finished yet, read without writing."""
    info = find_run(s, run)
    fleet = s.fleet()
    base = fleet.view(info.run_id)
    pending = [m for m, p in base.progress.items() if p is None or not p.state.terminal]
    if not live or not pending:
        return base
    fresh = _broker_call(s, lambda: fleet.kv.progress(info.run_id, pending))
    merged = dict(base.progress)
    for m, p in fresh.items():
        old = merged.get(m)
        if p is not None and (old is None or p.updated_at >= old.updated_at):
            merged[m] = p
    return RunView(base.run_id, base.modules, merged)


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
    try:
        from controller.report import build_report
        from controller.report.model import Thresholds
        from controller.report.render import verdict_line
    except ModuleNotFoundError:  # no controller extras (pandas): the modules' states alone
        verdict, line = (state, f"{state.upper()} {info.run_id}: some modules {state}") if failed else (
            "pass", f"PASS {info.run_id}: every module finished")
    else:
        th = Thresholds(tolerance=tolerance) if tolerance is not None else None
        rep = _report_call(lambda: build_report(h, info.run_id, baseline=baseline, thresholds=th))
        verdict, line = str(rep.verdict), verdict_line(rep)
        if failed and verdict == "pass":
            verdict, line = "failed", f"some modules {state}; {line}"
    h.set_run_state(info.run_id, state, verdict=verdict, line=line if state != "running" else None)
    return Judgement(info.run_id, verdict, line, state, rep)


def recorded_judgement(info: RunInfo) -> Judgement | None:
    """The verdict the history holds for an ended run, as it was reached (its baseline included), or
    None when there is none to show (running, never judged, resumed since, or judged before the
    history kept the line): then :func:`judge` reaches it. No report is built here, so ``fleetctl
    status`` of an ended run needs neither pandas nor the rows."""
    if info.state == "running" or info.verdict is None or info.verdict_line is None:
        return None
    return Judgement(info.run_id, info.verdict, info.verdict_line, info.state)


def _report_call(fn: Callable[[], Any]) -> Any:
    from controller.report.model import ReportError

    try:
        return fn()
    except ReportError as exc:
        raise BadRequest(str(exc)) from None


def cancel(s: Session, run: str, devices: str | None = None) -> tuple[str, list[str]]:
    """Durable cancel of a run, or of the modules of it that ``devices`` selects: (run id, modules)."""
    info = find_run(s, run)
    names = list(info.modules)
    if devices:
        known = {m.name: m for m in s.inventory().modules}
        names = [m.name for m in select([known[n] for n in info.modules if n in known], devices)]
    fleet = s.broker()
    _broker_call(s, lambda: fleet.cancel(info.run_id, None if not devices else names))
    return info.run_id, names


# --------------------------------------------------------------------------- read
def runs(s: Session, limit: int = 20) -> list[RunInfo]:
    if not s.has_history():
        return []
    return s.history().runs(limit=limit)


def results(s: Session, run: str, *, pull: bool = False) -> tuple[RunInfo, list[ResultRow]]:
    """The result rows of a run from the history (``pull``: sync from the broker first, which writes)."""
    info = find_run(s, run)
    if pull and info.kind == "run":
        sync(s, info.run_id)
    return info, s.history().rows(info.run_id)


def devices(s: Session, selector: str = "all") -> list[Device]:
    mods = s.inventory().select(selector)
    fleet = s.broker(read=True)
    st = _broker_call(s, lambda: fleet.statuses(mods))
    return [Device(m, st[m.name]) for m in mods]


def reset_module(s: Session, name: str) -> int:
    """Clear a module's failed runs in a row (``fleetctl devices reset``): recorded as an event of the module in
    the history; how many there were. A module bad for another reason (its heartbeat) stays bad."""
    if name not in {m.name for m in s.inventory().modules}:
        raise NotFound(f"no module {name!r} in {s.settings.inventory}")
    return s.fleet().reset_failures(name)


def describe_run(s: Session, run: str, *, live: bool = True) -> RunDetail:
    info = find_run(s, run)
    v = view(s, info.run_id, live=live and info.kind == "run" and info.state == "running")
    return RunDetail(info, v, s.history().row_count(info.run_id))


def describe_module(s: Session, name: str, *, recent: int = 10) -> ModuleDetail:
    mods = [m for m in s.inventory().modules if m.name == name]
    if not mods:
        raise NotFound(f"no module {name!r} in {s.settings.inventory}")
    fleet = s.broker(read=True)
    status = _broker_call(s, lambda: fleet.statuses(mods))[name]
    found: list[tuple[RunInfo, RunProgress | None]] = []
    if s.has_history():
        h = s.history()
        for info in h.runs(limit=200):
            if name in info.modules:
                found.append((info, h.progress(info.run_id).get(name)))
                if len(found) >= recent:
                    break
    return ModuleDetail(mods[0], status, tuple(found))


def report(s: Session, run: str = "latest", baseline: str | None = None, *, tolerance: float = 0.05) -> Report:
    """The report of a run (pandas): verdict, regressions, outliers (never writes)."""
    from controller.report.load import build_report
    from controller.report.model import Thresholds

    h = s.read_history()
    return _report_call(lambda: build_report(h, run, baseline, thresholds=Thresholds(tolerance=tolerance)))


def logs(s: Session, run: str, *, module: str | None = None, step: str | None = None,
         key: str | None = None) -> list[LogFile]:
    """The step logs a run left on its modules (local modules: their workdir; SSH modules: over SSH)."""
    info = find_run(s, run)
    names = [m for m in info.modules if module is None or m == module]
    if module is not None and not names:
        raise NotFound(f"run {info.run_id} did not run on module {module!r} (modules: {', '.join(info.modules)})")
    known = {m.name: m for m in s.inventory().modules}
    out: list[LogFile] = []
    for name in names:
        m = known.get(name)
        if m is None:
            raise NotFound(f"module {name!r} of run {info.run_id} is no longer in {s.settings.inventory}")
        files = _local_logs(m, info.run_id) if m.transport == "local" else _remote_logs(s, m, info.run_id)
        out += [f for f in files if (step is None or f.step == step) and (key is None or f.model_key == key)]
    return out


def parse_log_name(name: str) -> tuple[str, str | None]:
    """``07-benchmark-qwen35_mtp.log`` -> ("benchmark", "qwen35_mtp"); ``03-configure.log`` -> ("configure", None)."""
    _, _, rest = name.removesuffix(".log").partition("-")  # drop NN
    for k in sorted(MODEL_KEYS, key=len, reverse=True):
        if rest.endswith("-" + k):
            return rest[: -len(k) - 1], k
    return rest, None


def _local_logs(m: Module, run_id: str) -> list[LogFile]:
    folder = Path(m.workdir).expanduser() / "runs" / check_run_id(run_id) / "logs"
    if not folder.is_dir():
        return []
    out = []
    for p in sorted(folder.glob("*.log")):
        step, model_key = parse_log_name(p.name)
        out.append(LogFile(m.name, p.name, step, model_key, str(p), p.read_text(encoding="utf-8", errors="replace")))
    return out


_REMOTE_LOGS = r"""
import json, os, sys
d = os.path.join(os.path.expanduser(sys.argv[1]), "runs", sys.argv[2], "logs")
out = {}
if os.path.isdir(d):
    for n in sorted(os.listdir(d)):
        if n.endswith(".log"):
            with open(os.path.join(d, n), "rb") as fh:
                out[n] = fh.read(4 << 20).decode("utf-8", "replace")
print(json.dumps(out))
"""


def _remote_logs(s: Session, m: Module, run_id: str) -> list[LogFile]:
    from controller.remote import ssh

    target = ssh.SshTarget.of(m, s.settings.known_hosts, s.settings.ssh_key)
    with ssh.open_session(target) as sess:
        found = sess.python("python3", _REMOTE_LOGS, m.workdir, check_run_id(run_id), what="read step logs")
    out = []
    for name, text in sorted(found.items()):
        step, model_key = parse_log_name(str(name))
        out.append(LogFile(m.name, str(name), step, model_key, f"{m.host}:{m.workdir}/runs/{run_id}/logs/{name}",
                           str(text)))
    return out


def version() -> dict[str, str]:
    import platform
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        v = dist_version("m1000-fleet")
    except PackageNotFoundError:
        v = "unknown (not installed)"
    from contract.records import SCHEMA_VERSION

    return {"fleetctl": v, "record_schema": str(SCHEMA_VERSION), "python": platform.python_version()}


# --------------------------------------------------------------------------- summaries (API, webhooks)
def progress_dict(p: RunProgress | None) -> dict[str, Any]:
    if p is None:
        return {"state": "queued", "step": "queued", "progress": 0.0}
    return p.model_dump(mode="json", exclude={"schema_version", "run_id"})


def run_summary(info: RunInfo, v: RunView | None = None, *, rows: int | None = None,
                judgement: Judgement | None = None) -> dict[str, Any]:
    """A run as JSON (the API's run resource and the webhooks' body)."""
    d: dict[str, Any] = {
        "run_id": info.run_id, "release": info.release, "sha256": info.sha256, "tarball": info.tarball,
        "models": list(info.models), "modules": list(info.modules), "created_at": info.created_at,
        "finished_at": info.finished_at, "state": info.state, "verdict": info.verdict,
        "verdict_line": info.verdict_line,
    }
    if v is not None:
        d["state"] = v.state() if v.finished else "running"
        d["module_states"] = {m: progress_dict(p) for m, p in v.progress.items()}
    if rows is not None:
        d["rows"] = rows
    if judgement is not None:
        d.update(verdict=judgement.verdict, verdict_line=judgement.line, state=judgement.state)
    return d


def device_dict(d: Device) -> dict[str, Any]:
    hb = d.status.heartbeat
    return {"module": d.module.name, "host": d.module.host, "transport": d.module.transport,
            "labels": dict(d.module.labels), "state": d.status.state, "reason": d.status.reason,
            "agent_version": hb.agent_version if hb else None, "heartbeat_age_s": d.status.age,
            "clock_skew_s": d.status.skew,
            "free_disk_bytes": hb.free_disk_bytes if hb else None, "run_id": hb.run_id if hb else None}


def modules_named(s: Session, names: Iterable[str]) -> list[Module]:
    known = {m.name: m for m in s.inventory().modules}
    return [known[n] for n in names if n in known]


def errors_of(v: RunView) -> dict[str, list[str]]:
    """module -> the one-line errors of its part of the run."""
    out: dict[str, list[str]] = {}
    for m, p in v.progress.items():
        if p is None:
            continue
        errs = [o.error.one_line() for o in p.outcomes if o.error] or ([p.error.one_line()] if p.error else [])
        if errs:
            out[m] = errs
    return out


__all__ = [
    "BadRelease", "BadRequest", "BrokerUnavailable", "Conflict", "Device", "FleetError", "Judgement", "Launched",
    "LogFile", "ModuleDetail", "NotFound", "RunDetail", "ServiceError", "Session", "UnusableRelease", "ValidateRequest",
    "cancel",
    "describe_module", "describe_run", "devices", "exit_code", "find_run", "follow", "judge", "logs", "prepare",
    "report", "results", "retry", "run_summary", "runs", "sync", "validate", "version", "view",
]
