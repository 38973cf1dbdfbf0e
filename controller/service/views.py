"""What the front ends show: runs, results, devices, run and module details, reports, JSON summaries.

Reading never writes the run history here, but for :func:`results` with ``pull`` (a sync
first) and :func:`reset_module` (``fleetctl devices reset``: an event of the module).
:func:`run_summary` and :func:`device_dict` are the API's resources and the webhooks' body.

Lazy imports: :mod:`controller.report` is imported by :func:`report` and :func:`trend` only: it loads pandas
(462 ms CPU a fresh process, ``bench/import_costs.py``:
bench/results/import_costs_20261207_0346_lazy-libraries.txt), which the listing and status views do
not need (``tests/cli/test_lean_verbs.py``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from contract.compat import judge
from contract.oneline import error_line
from contract.records import ResultRow, RunProgress
from contract.version import versions
from controller.fleet import BrokerUnavailable, RunView, newer_progress
from controller.history import RunInfo
from controller.inventory import Module
from controller.service.lifecycle import find_run, sync, view
from controller.service.records import Device, Judgement, ModuleDetail, RunDetail
from controller.service.session import NotFound, Session, broker_call, report_call

if TYPE_CHECKING:
    from controller.report.model import Report
    from controller.report.trend import TrendQuery, TrendResult


def runs(s: Session, limit: int = 20, *, live: bool = True) -> list[RunInfo]:
    """Recent runs, newest first; ``live``: as :func:`with_broker_states` shows them (never writes)."""
    if not s.has_history():
        return []
    items = s.history().runs(limit=limit)
    return with_broker_states(s, items)[0] if live else items


def with_broker_states(s: Session, items: list[RunInfo]) -> tuple[list[RunInfo], str | None]:
    """``items`` with each run the history holds as running in the state its modules' records on the broker give
    (done, failed, cancelled once every module ended there), and why that could not be read (None: read, or
    nothing to read). Read, never written (``fleetctl status RUN`` records it); one round trip to the broker for
    every module of those runs the history has not seen end, none when no run is running."""
    running = [i for i in items if i.state == "running" and i.kind == "run"]
    if not running:
        return items, None
    h = s.history()
    known = {i.run_id: h.progress(i.run_id) for i in running}
    pairs = [(i.run_id, m) for i in running for m in i.modules
             if not ((p := known[i.run_id].get(m)) is not None and p.state.terminal)]
    try:
        fleet = s.fleet()
        fresh = broker_call(s, lambda: fleet.kv.progress_of(pairs))
    # BrokerUnavailable is one; so is an embedded broker's folder that cannot be made
    except OSError as exc:
        why = str(exc) if isinstance(exc, BrokerUnavailable) else f"broker not read: {error_line(exc)}"
        return items, f"{why}: the states of running runs are the history's"
    states: dict[str, str] = {}
    for i in running:
        mine = {m: p for (rid, m), p in fresh.items() if rid == i.run_id}
        view = RunView(i.run_id, i.modules, newer_progress({m: known[i.run_id].get(m) for m in i.modules}, mine))
        if view.finished:
            states[i.run_id] = view.state()
    return [i.model_copy(update={"state": states[i.run_id]}) if i.run_id in states else i for i in items], None


def results(s: Session, run: str, *, pull: bool = False) -> tuple[RunInfo, list[ResultRow]]:
    """The result rows of a run from the history (``pull``: sync from the broker first, which writes)."""
    info = find_run(s, run)
    if pull and info.kind == "run":
        sync(s, info.run_id)
    return info, s.history().rows(info.run_id)


def devices(s: Session, selector: str = "all") -> list[Device]:
    mods = s.inventory().select(selector)
    fleet = s.broker(read=True)
    st = broker_call(s, lambda: fleet.statuses(mods))
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
    status = broker_call(s, lambda: fleet.statuses(mods))[name]
    found: list[tuple[RunInfo, RunProgress | None]] = []
    if s.has_history():
        h = s.history()
        for info in h.runs(limit=200):
            if name in info.modules:
                found.append((info, h.progress(info.run_id).get(name)))
                if len(found) >= recent:
                    break
    return ModuleDetail(mods[0], status, tuple(found))


def report(s: Session, run: str = "latest", baseline: str | None = None, *, tolerance: float = 0.05,
           energy_tolerance: float = 0.05, startup_tolerance: float | None = None,
           with_history: bool = False) -> Report:
    """The report of a run (pandas): verdict, regressions, outliers (never writes); ``with_history``: the
    change points of its model keys across the release history too (the HTML report's "History")."""
    from controller.report.load import build_report
    from controller.report.model import Thresholds

    h = s.read_history()
    limits = {"tolerance": tolerance, "energy_tolerance": energy_tolerance}
    if startup_tolerance is not None:  # else Thresholds' default
        limits["startup_tolerance"] = startup_tolerance
    return report_call(lambda: build_report(h, run, baseline, thresholds=Thresholds.model_validate(limits),
                                            with_history=with_history,
                                            same_environment=s.settings.baseline_same_environment))


def trend(s: Session, query: TrendQuery) -> TrendResult:
    """The change points across the release history that ``query`` asks for: the records of ``fleetctl trend
    -o json``: from the findings the history keeps (computed and kept when it changed since: the only write)."""
    from controller.report.kept import trend_of

    return trend_of(s.read_history(), query)


def version() -> dict[str, str]:
    return versions()


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
        "verdict_line": info.verdict_line, "started_by": info.started_by,
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
            "agent_version": hb.agent_version if hb else None, "contract": hb.schema_version if hb else None,
            "contract_standing": judge(hb.schema_version).standing if hb else None, "heartbeat_age_s": d.status.age,
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
