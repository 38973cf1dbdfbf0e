"""The history's change points, computed once per history version and kept in the history (ADR 0043).

:func:`keep_findings` runs the detector (:func:`controller.report.trend.changes`, default settings) over every
series of the history and keeps what it found in the history (:class:`controller.history.trends.TrendFindings`)
under the version it read; ``/metrics`` (:mod:`controller.serve.metrics`) and ``fleetctl trend`` /
``GET /api/v1/trend`` (:func:`trend_of`) read them instead of searching the history again. The path that ends a run
never runs this search (:func:`controller.service.lifecycle.queue_change_points`: the run's own series only).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from contract.records import METRICS
from controller.history import DatabaseError
from controller.report.analysis.changepoints import ChangePoint, DetectorSettings
from controller.report.load import history_frames, trend_frames
from controller.report.model import FLEET
from controller.report.trend import SeriesChange, TrendQuery, TrendResult, changes, kept_records, trend_records

if TYPE_CHECKING:
    import pandas as pd

    from controller.history import History

# what the findings are kept under: every change point at the detector's default settings
NAME = "changes"
# the body's format: a body of another is computed again
FORMAT = 1


@dataclass(frozen=True)
class KeptFindings:
    """Every change point of the history at ``version`` (default settings), with what the readers ask beside
    them: ``series`` (model key, metric) with a value in some release (``/metrics`` says 0 for those without a
    change point), ``profiles`` model key -> its profiles with rows, ``releases`` how many (not '')."""

    version: str
    changes: tuple[SeriesChange, ...]
    series: frozenset[tuple[str, str]] = frozenset()
    profiles: dict[str, tuple[str, ...]] = field(default_factory=dict)
    releases: int = 0


def encode(k: KeptFindings) -> str:
    return json.dumps({
        "format": FORMAT, "releases": k.releases, "profiles": k.profiles, "series": sorted(k.series),
        "changes": [{"k": c.model_key, "p": c.profile, "m": c.metric, "mod": c.module, "r": c.release,
                     "prev": c.previous, "until": c.until, "values": list(c.values), "cp": asdict(c.change)}
                    for c in k.changes]})


def decode(version: str, body: str) -> KeptFindings | None:
    """The findings of a kept body (None: a body of another format, or not one at all)."""
    try:
        doc = json.loads(body)
        if doc.get("format") != FORMAT:
            return None
        found = tuple(SeriesChange(model_key=c["k"], profile=c["p"], metric=c["m"], module=c["mod"], release=c["r"],
                                   previous=c["prev"], until=c["until"], values=tuple(c["values"]),
                                   change=ChangePoint(**c["cp"])) for c in doc["changes"])
        return KeptFindings(version, found, frozenset((k, m) for k, m in doc["series"]),
                            {k: tuple(ps) for k, ps in doc["profiles"].items()}, int(doc["releases"]))
    except (ValueError, KeyError, TypeError):
        return None


def read_kept(history: History, *, current: bool = True) -> KeptFindings | None:
    """The findings the history keeps: only if of its current version (``current``), else whichever it has."""
    got = history.trend_findings(NAME)
    if got is None or (current and got[0] != history.trend_version()):
        return None
    return decode(*got)


def compute(history: History) -> KeptFindings:
    """Every change point of the history (the full search: not on the path that ends a run), at the version read
    before its rows (rows stored meanwhile make the next reader compute again)."""
    version = history.trend_version()
    rows, runs = history_frames(history)
    return findings_of(version, rows, runs)


def findings_of(version: str, rows: pd.DataFrame, runs: pd.DataFrame) -> KeptFindings:
    """:class:`KeptFindings` of a history's rows and runs (:func:`controller.report.load.history_frames`)."""
    releases = len(set(runs["release"].astype(str)) - {""})
    if not len(rows):
        return KeptFindings(version, (), releases=releases)
    keys = rows["model_key"].astype(str)
    profiles: dict[str, set[str]] = {}
    for k, p in set(zip(keys, rows["profile"].astype(str), strict=True)):
        profiles.setdefault(k, set()).add(p)
    release_rows = rows["source"].astype(str) == "release" if "source" in rows else True
    series = {(k, m) for m in METRICS if m in rows.columns
              for k in keys[release_rows & rows[m].notna() & rows["profile"].notna()].unique()}
    return KeptFindings(version, tuple(changes(rows, runs)), frozenset(series),
                        {k: tuple(sorted(ps)) for k, ps in profiles.items()}, releases)


def keep_findings(history: History) -> KeptFindings:
    """:func:`compute`, kept in the history (a history that cannot be written: computed all the same)."""
    got = compute(history)
    with contextlib.suppress(*DatabaseError):
        history.keep_trend_findings(NAME, got.version, encode(got))
    return got


def current_findings(history: History) -> KeptFindings:
    """The findings of the history as it is now: those kept, else computed and kept."""
    return read_kept(history) or keep_findings(history)


def trend_of(history: History, query: TrendQuery) -> TrendResult:
    """What ``fleetctl trend`` and ``GET /api/v1/trend`` answer: from the kept findings at the default settings
    (computed and kept when the history changed since), from the rows for other settings or to say what no change
    point means here (the reach)."""
    if query.settings == DetectorSettings():
        kept = current_findings(history)
        got = kept_records(kept.changes, dict(kept.profiles), kept.releases, query)
        if got is not None:
            return got
    return trend_records(*trend_frames(history, query), query)


def in_force_counts(k: KeptFindings) -> dict[tuple[str, str, str], int]:
    """(model key, metric, 'fleet' or 'module') -> change points in force (0: a series without one; every (key,
    metric) with a value in some release, both scopes): ``m1000_trend_change_points``."""
    out = {(key, m, scope): 0 for key, m in k.series for scope in ("fleet", "module")}
    for c in k.changes:
        if c.change.in_force:
            at = (c.model_key, c.metric, "fleet" if c.module == FLEET else "module")
            out[at] = out.get(at, 0) + 1
    return out
