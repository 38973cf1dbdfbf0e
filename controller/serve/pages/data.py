"""What the run browser's pages show, read through the service layer the API's JSON routes use.

Each function takes a :class:`controller.service.Session` and returns plain records for a template; the queries that
the service has no verb for (the runs list's filters, the releases' verdict counts, the modules' last golden checks)
are single indexed or bounded statements of the history (:mod:`controller.history.browse`), so a page costs the same
whether the history holds ten runs or ten thousand (``bench/pages.py``). Nothing here writes, but
:func:`release_trend`'s findings: when the history changed since they were kept, a thread computes and keeps them
(what ``/metrics`` does) and the page shows those kept meanwhile.

Lazy imports: the findings' modules (:mod:`controller.report.kept`, :mod:`~controller.report.trend`) load pandas
(462 ms of CPU, 88 MiB: ``bench/import_costs.py``, bench/results/import_costs_20261207_0346_lazy-libraries.txt) at
the first release page that shows a trend, not when the API starts.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from contract.records import RunProgress
from controller import service
from controller.errors import FleetctlError
from controller.history import RunInfo
from controller.history.browse import RunsWhere
from controller.service import Session
from controller.service.reservations import reservation_dict, reservations

VERDICTS = ("pass", "regressed", "incomplete", "failed")
STATES = ("running", "done", "failed", "cancelled")
MAX_LIMIT = 500


class FilterError(FleetctlError, ValueError):
    """A filter of the runs page that cannot be used (HTTP 400, the field named)."""


@dataclass(frozen=True)
class RunsFilter:
    """The runs page's filters (each '' for any): parsed from the query by :meth:`parse` (pure)."""

    release: str = ""
    # a verdict, or 'none' (not judged)
    verdict: str = ""
    state: str = ""
    module: str = ""
    user: str = ""
    # YYYY-MM-DD, UTC, from that day
    since: str = ""
    # YYYY-MM-DD, UTC, to that day included
    until: str = ""
    # created before this (the next page)
    before: float | None = None
    limit: int = 50

    @classmethod
    def parse(cls, q: dict[str, str]) -> RunsFilter:
        def text(name: str) -> str:
            v = q.get(name, "").strip()
            if len(v) > 200:
                raise FilterError(f"{name}: longer than 200 characters")
            return v

        verdict, state = text("verdict"), text("state")
        if verdict and verdict not in (*VERDICTS, "none"):
            raise FilterError(f"verdict: {verdict[:40]!r} is none of {', '.join(VERDICTS)}, none")
        if state and state not in STATES:
            raise FilterError(f"state: {state[:40]!r} is none of {', '.join(STATES)}")
        since, until = text("since"), text("until")
        for name, v in (("since", since), ("until", until)):
            if v:
                try:
                    dt.date.fromisoformat(v)
                except ValueError:
                    raise FilterError(f"{name}: {v[:40]!r} is not a date (YYYY-MM-DD)") from None
        try:
            limit = int(q.get("limit") or 50)
            before = float(q["before"]) if q.get("before") else None
        except ValueError:
            raise FilterError("limit and before are numbers") from None
        if not 1 <= limit <= MAX_LIMIT:
            raise FilterError(f"limit: 1..{MAX_LIMIT}")
        return cls(text("release"), verdict, state, text("module"), text("user"), since, until, before, limit)

    def query(self) -> dict[str, str]:
        """The filters as a query (for links that keep them), empty ones left out."""
        d = {"release": self.release, "verdict": self.verdict, "state": self.state, "module": self.module,
             "user": self.user, "since": self.since, "until": self.until}
        return {k: v for k, v in d.items() if v}

    def where(self) -> RunsWhere:
        """The runs it selects, as the history reads them (pure)."""
        return RunsWhere(release=self.release, verdict=self.verdict, state=self.state, user=self.user,
                         module=self.module, since=_day(self.since) if self.since else None,
                         until=_day(self.until) + 86400 if self.until else None, before=self.before)


def _day(text: str) -> float:
    return dt.datetime.combine(dt.date.fromisoformat(text), dt.time(), dt.timezone.utc).timestamp()


@dataclass(frozen=True)
class RunsPage:
    runs: list[RunInfo]
    # for the filter's suggestions, newest first
    releases: list[str]
    users: list[str]
    modules: list[str]
    # the next page's ``before`` (None: no more)
    more: float | None
    # why the running runs' states are the history's (the broker could not be read)
    note: str | None


def runs_page(s: Session, f: RunsFilter) -> RunsPage:
    """The runs ``f`` selects, newest first, running ones in the broker's state (:func:`service.with_broker_states`,
    as ``GET /api/v1/runs``)."""
    mods = [m.name for m in s.inventory().modules]
    if not s.has_history():
        return RunsPage([], [], [], mods, None, None)
    h = s.history()
    found = h.runs_where(f.where(), f.limit + 1)
    more = found[f.limit - 1].created_at if len(found) > f.limit else None
    items, note = service.with_broker_states(s, found[:f.limit])
    return RunsPage(items, h.recent_releases(), h.run_users(), mods, more, note)


def live_runs(s: Session, ids: list[str]) -> dict[str, dict[str, Any]]:
    """run id -> state, verdict and verdict line of those of ``ids`` in the history (the runs page's poll)."""
    if not ids or not s.has_history():
        return {}
    items, _ = service.with_broker_states(s, s.history().runs_of(ids))
    return {i.run_id: {"state": i.state, "verdict": i.verdict, "verdict_line": i.verdict_line} for i in items}


# --------------------------------------------------------------------------- modules
@dataclass(frozen=True)
class ModuleRow:
    # as service.device_dict gives it
    device: dict[str, Any]
    # ok, needs attention or bad
    health: str
    why: str
    # as reservation_dict (controller.service.reservations) gives it
    reserved: dict[str, Any] | None
    # the newest golden check it took part in
    golden: RunInfo | None
    # its failed golden check since its last reset
    drift: str | None


def health_of(state: str, reason: str, drift: str | None) -> tuple[str, str]:
    """(ok | needs attention | bad, why) of a module (pure): bad as the fleet says; needs attention when it cannot
    take work now (no heartbeat), failed its golden check, or its state comes with a note (clock skew, a name
    conflict)."""
    if state == "bad":
        return "bad", reason or "bad"
    if state in ("unreachable", "offline"):
        return "needs attention", reason or state
    if drift:
        return "needs attention", f"golden check: {drift}"
    if reason:
        return "needs attention", reason
    return "ok", ""


def golden_checks(s: Session, recent: int = 200) -> dict[str, RunInfo]:
    """module -> the newest golden check run it was part of (of the ``recent`` newest golden checks)."""
    if not s.has_history():
        return {}
    out: dict[str, RunInfo] = {}
    for info in s.history().golden_runs(recent):
        for m in info.modules:
            out.setdefault(m, info)
    return out


def modules_page(s: Session) -> list[ModuleRow]:
    held = {r.module: reservation_dict(r) for r in reservations(s)}
    golden = golden_checks(s)
    drifts = s.history().module_marks()[1] if s.has_history() else {}
    out = []
    for d in service.devices(s):
        dd = service.device_dict(d)
        health, why = health_of(dd["state"], dd["reason"], drifts.get(dd["module"]))
        out.append(ModuleRow(dd, health, why, held.get(dd["module"]), golden.get(dd["module"]),
                             drifts.get(dd["module"])))
    return out


@dataclass(frozen=True)
class ModulePage:
    row: ModuleRow
    # (run, its progress there as service.progress_dict)
    runs: list[tuple[RunInfo, dict[str, Any]]]
    # (ts, run id or '', message), newest first
    events: list[tuple[float, str, str]]


def module_page(s: Session, name: str, recent: int = 20) -> ModulePage:
    """A module's row (its state as :func:`service.devices` reads it), its ``recent`` newest runs (its part of
    each, by the history's ``(module, updated_at)`` index, and its telemetry) and its events: the module's own
    (resets, golden drifts, reservations) and its runs' (newest 50)."""
    if name not in {m.name for m in s.inventory().modules}:
        raise service.NotFound(f"no module {name!r} in {s.settings.inventory}")
    (dev,) = service.devices(s, name)
    dd = service.device_dict(dev)
    held = reservations(s, name)
    if not s.has_history():
        health, why = health_of(dd["state"], dd["reason"], None)
        return ModulePage(ModuleRow(dd, health, why, reservation_dict(held[0]) if held else None, None, None), [], [])
    h = s.history()
    drift = h.golden_drift(name)
    health, why = health_of(dd["state"], dd["reason"], drift)
    row = ModuleRow(dd, health, why, reservation_dict(held[0]) if held else None, golden_checks(s).get(name), drift)
    parts = h.module_progress(name, recent)
    infos = {i.run_id: i for i in h.runs_of([r for r, _ in parts], kind_run=True)}
    runs = []
    for rid, progress in parts:
        if (info := infos.get(rid)) is None:
            continue
        t = h.telemetry(info.run_id).get(name)  # kept apart from the progress
        p = service.progress_dict(RunProgress.model_validate_json(progress))
        runs.append((info, {**p, "telemetry": t.model_dump(mode="json") if t else None}))
    runs.sort(key=lambda r: r[0].created_at, reverse=True)
    return ModulePage(row, runs, h.module_log(name))


# --------------------------------------------------------------------------- releases
@dataclass(frozen=True)
class ReleaseRow:
    release: str
    runs: int
    verdicts: dict[str, int]  # verdict ('' : not judged) -> runs
    newest: float
    newest_run: str
    newest_verdict: str | None


def releases_page(s: Session, limit: int = 100) -> list[ReleaseRow]:
    """Each release's runs and their verdicts, newest release first (by its newest run)."""
    if not s.has_history():
        return []
    h = s.history()
    newest = h.release_runs_counted(limit)
    counts: dict[str, dict[str, int]] = {}
    last: dict[str, tuple[str, str | None]] = {}
    for rel, rid, verdict in h.release_verdicts([rel for rel, _, _ in newest]):
        c = counts.setdefault(rel, {})
        c[verdict or ""] = c.get(verdict or "", 0) + 1
        last.setdefault(rel, (rid, verdict))
    return [ReleaseRow(rel, n, counts.get(rel, {}), t, *last.get(rel, ("", None))) for rel, n, t in newest]


@dataclass
class _Kept:
    """The history's kept findings as the pages read them: decoded once per kept version, and whether they are the
    history's current ones, checked in a thread at most every :data:`CHECK_EVERY` seconds (the check reads every
    run: 30-50 ms at 10,000 runs, not on a page's path); when they are not, the same thread computes and keeps
    them (a minute at 10,000 runs, as ``/metrics`` does)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    thread: threading.Thread | None = None
    # history location -> (kept version, KeptFindings)
    decoded: dict[str, Any] = field(default_factory=dict)
    # history location -> its version at the last check
    current: dict[str, str] = field(default_factory=dict)
    checked: dict[str, float] = field(default_factory=dict)

    def findings(self, s: Session) -> tuple[Any, bool]:
        """(the kept findings or None, whether they may be stale); starts the check when it is due."""
        from controller.report.kept import NAME, decode

        where = str(s.settings.history_location)
        h = s.read_history()
        version = h.trend_findings_version(NAME)
        kept = None
        if version is not None:
            got = self.decoded.get(where)
            if got is None or got[0] != version:
                body = h.trend_findings(NAME)
                got = (version, decode(*body) if body else None)
                self.decoded[where] = got
            kept = got[1]
        if time.monotonic() - self.checked.get(where, -CHECK_EVERY) >= CHECK_EVERY:
            self.start(s.settings, where)
        return kept, kept is None or self.current.get(where) != kept.version

    def start(self, settings: Any, where: str) -> None:
        with self.lock:
            if self.thread is not None and self.thread.is_alive():
                return
            self.checked[where] = time.monotonic()
            self.thread = threading.Thread(target=self._run, args=(settings, where), name="pages-findings",
                                           daemon=True)
            self.thread.start()

    def _run(self, settings: Any, where: str) -> None:
        from controller.report.kept import keep_findings, read_kept

        with Session(settings) as s:
            h = s.read_history()
            version = h.trend_version()
            # not of the history's current version (or none): computed and kept
            if read_kept(h) is None:
                version = keep_findings(h).version
            self.current[where] = version


# s between two checks that the kept findings are the history's current ones
CHECK_EVERY = 10.0
KEPT = _Kept()


@dataclass(frozen=True)
class Trend:
    # TrendRecord's fields (fleetctl trend -o json)
    records: list[dict[str, Any]]
    releases: int
    # the findings may be of the history before its last change (newer ones being computed)
    stale: bool
    # no findings kept yet (being computed)
    none_kept: bool


def release_trend(s: Session, models: tuple[str, ...] | None = None) -> Trend:
    """The change points ``fleetctl trend`` names (default settings), from the findings the history keeps; never
    the search itself on the page's path (:class:`_Kept`)."""
    from controller.report.trend import TrendQuery, kept_records

    if not s.has_history():
        return Trend([], 0, False, False)
    kept, stale = KEPT.findings(s)
    if kept is None:
        return Trend([], 0, True, True)
    got = kept_records(kept.changes, dict(kept.profiles), kept.releases, TrendQuery(models=models))
    return Trend(got.records if got else [], kept.releases, stale, False)


def release_runs(s: Session, release: str, limit: int = 50) -> list[RunInfo]:
    if not s.has_history():
        return []
    return s.history().release_run_infos(release, limit)
