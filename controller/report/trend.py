"""Change points over the run history: one series per (model key, profile, metric), fleet-wide and per module.

Pure pandas over a rows frame (:func:`controller.report.load.read_rows`) and the runs' (release, created_at);
the detector is :mod:`controller.report.analysis.changepoints` (every series at once:
:mod:`controller.report.analysis.changepoints_batch`).

* **release order**: when every release's name parses as a version (``packaging.version``), by version,
  ties (``1.4`` and ``1.4.0``) by the earliest start of a run of each; otherwise (one nightly name that does
  not parse is enough) every release by the earliest start of its runs. Runs without a release are left out.
* **a release's value**: per run the fleet median over modules (fleet scope) or the module's value (module
  scope); a release run several times: the median of its runs.
* **one finding per cause**: change points of one model key at the same release and scope (the fleet, or one
  module) are one finding; a derived metric (``tpot_ms`` of ``decode_tps``) moved with its primary is named
  under it, as the verdict folds them.

The records of ``fleetctl trend -o json`` and ``GET /api/v1/trend`` are :func:`trend_records` (one function for
both); the report's "History" section is :func:`history_section`; the change points a run newly makes
detectable (its webhook event) are :func:`new_changes`.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd
from packaging.version import InvalidVersion, Version

from contract.records import METRICS
from controller.errors import FleetctlError
from controller.report.analysis.changepoints import (
    DEFAULT_MIN_SEGMENT,
    ChangePoint,
    DetectorSettings,
    SeriesError,
    reach,
)
from controller.report.analysis.changepoints_batch import analyse_many
from controller.report.model import DERIVED, FLEET, HistorySection, ReportError, TrendSeries

# no change point can be named in a series of fewer releases: min_segment on each side of it (ADR 0039)
MIN_RELEASES = 2 * DEFAULT_MIN_SEGMENT
# the report's "History" section draws at most this many series (the rest are counted)
MAX_CHARTS = 24


class TrendError(FleetctlError, ValueError):
    """A CSV file or column the detector cannot take, or a bad setting (exit 2)."""


@dataclass(frozen=True)
class SeriesChange:
    """One change point of one series: (model key, profile, metric) fleet-wide (``module`` ``'*'``) or on one
    module; ``release``: the first release of the new level (a drift: the first it moved), ``previous``: the
    release before it; ``until``: a drift's first release at the new level (a step: ``release``)."""

    model_key: str
    profile: str
    metric: str
    module: str
    release: str
    previous: str
    change: ChangePoint
    values: tuple[float, ...]  # the series, in release order (for a plot)
    until: str = ""


@dataclass(frozen=True)
class Finding:
    """Change points of one model key at one release and scope: ``lead`` the largest primary-metric one."""

    lead: SeriesChange
    # every change point of the finding, the lead first
    moved: tuple[SeriesChange, ...]
    # a fleet finding: the modules whose own series moved at that release too
    modules: tuple[str, ...] = ()


def release_order(runs: pd.DataFrame) -> list[str]:
    """Releases of ``runs`` (columns release, created_at) in release order (see the module's docstring)."""
    first = runs[runs["release"].astype(str) != ""].groupby("release", observed=True)["created_at"].min()
    versions: dict[str, Version] = {}
    for rel in first.index:
        try:
            versions[str(rel)] = Version(str(rel))
        except InvalidVersion:
            return [str(r) for r in first.sort_values(kind="stable").index]
    return sorted(versions, key=lambda r: (versions[r], float(first[r])))


def release_values(rows: pd.DataFrame, runs: pd.DataFrame, metrics: Sequence[str]) -> pd.DataFrame:
    """One value per (model key, profile, metric, module or '*', release): long frame ``value``, sorted by the
    key and the release as text. Every release a run has (a run without one: release ``''``), not only those of
    :func:`release_order`: :func:`_release_series` over them, as rows."""
    # a missing release: left out, as _release_series does
    order = sorted(set(runs["release"].astype(str).dropna()))
    found = _release_series(rows, runs, metrics, order, modules=True)
    lengths = [len(ranks) for _, ranks, _ in found]
    keys = [np.repeat(np.array([k[i] for k, _, _ in found], dtype=object), lengths) for i in range(4)]
    ranks = np.concatenate([r for _, r, _ in found]) if found else np.zeros(0, dtype=np.int64)
    return pd.DataFrame({"model_key": keys[0], "profile": keys[1], "metric": keys[2], "module": keys[3],
                         "release": np.array(order, dtype=object)[ranks],
                         "value": np.concatenate([x for _, _, x in found]) if found else np.zeros(0)}) \
        .astype(dict.fromkeys(("model_key", "profile", "metric", "module", "release"), str))  # empty: str too


def changes(rows: pd.DataFrame, runs: pd.DataFrame, settings: DetectorSettings | None = None, *,
            metrics: Sequence[str] = tuple(METRICS), modules: bool = True,
            only_modules: Collection[str] | None = None) -> list[SeriesChange]:
    """Every change point of every series (fleet-wide, and per module when ``modules``: of the modules
    ``only_modules`` only, when given; the fleet series are over every module all the same)."""
    order = release_order(runs)
    found = _release_series(rows, runs, [m for m in metrics if m in rows.columns], order, modules=modules,
                            only_modules=only_modules)
    out = []
    # every series at once (analyse_series of each, the same to the bit): a history's hundreds of series are
    # mostly of one length, analysed as one array
    for ((key, profile, metric, module), ranks, x), got in zip(found, analyse_many([f[2] for f in found], settings),
                                                               strict=True):
        for cp in got.change_points:
            out.append(SeriesChange(model_key=key, profile=profile, metric=metric, module=module,
                                    release=order[ranks[cp.index]], previous=order[ranks[cp.index - 1]], change=cp,
                                    values=tuple(float(v) for v in x), until=order[ranks[cp.end]]))
    return out


def _text_codes(col: pd.Series, extra: Sequence[str] = ()) -> tuple[np.ndarray, np.ndarray]:
    """``col`` as text (``astype(str)``) and ``extra``: the distinct texts, sorted, and each row's index into them
    (-1: missing). From the column's distinct values: no text made per row (a categorical: from its codes)."""
    codes, uniques = pd.factorize(col)
    texts = np.asarray(pd.Index(uniques).astype(str), dtype=object)
    distinct, inverse = np.unique(np.concatenate((texts, np.asarray(extra, dtype=object))).astype(str),
                                  return_inverse=True)
    return distinct, np.where(codes >= 0, inverse[:len(texts)][codes], -1)


def _release_series(rows: pd.DataFrame, runs: pd.DataFrame, metrics: Sequence[str], order: Sequence[str], *,
                    modules: bool, only_modules: Collection[str] | None = None,
                    ) -> list[tuple[tuple[str, str, str, str], np.ndarray, np.ndarray]]:
    """:func:`release_values` of the releases in ``order`` as series: ((model key, profile, metric, module), the
    releases' indices into ``order``, the values), sorted by the key as text, each in release order. The same
    medians over the same groups (pandas' group median, by integer codes of the texts, not the texts).
    ``only_modules``: the module series of those modules only (the fleet series: of every module's rows)."""
    if "source" in rows:
        sources, source = _text_codes(rows["source"])
        rows = rows[source == int(np.searchsorted(sources, "release"))] if "release" in sources else rows.iloc[:0]
    rel = runs.set_index("run_id")["release"].astype(str)
    run_texts, run = _text_codes(rows["run_id"])
    where = {r: i for i, r in enumerate(order)}
    run_rank = np.array([where.get(r, -1) if isinstance(r, str) else -1
                         for r in pd.Series(run_texts, dtype=object).map(rel)] + [-1], dtype=np.int64)
    keys, key = _text_codes(rows["model_key"])
    profiles, profile = _text_codes(rows["profile"])
    module_names, module = _text_codes(rows["module"], [FLEET])
    fleet = int(np.searchsorted(module_names, FLEET))
    names = np.array(sorted(metrics), dtype=object)
    rank = run_rank[run]
    ok = (key >= 0) & (profile >= 0) & (rank >= 0) & (module >= 0)
    wanted = None
    if modules and only_modules is not None:
        wanted = np.flatnonzero(np.isin(module_names, np.asarray(sorted(set(only_modules)), dtype=object)))
    cols = {"k": key, "p": profile, "run": run, "r": rank, "mod": module}
    found: list[tuple[tuple[int, int, int, int], np.ndarray, np.ndarray]] = []
    # one metric at a time (every group is of one metric): the long frame of a 10,000-run history's every metric
    # held at once was gigabytes; the same medians over the same groups
    for code, m in enumerate(names):
        v = rows[m].to_numpy(dtype=float, na_value=np.nan)
        i = np.flatnonzero(ok & ~np.isnan(v))
        if not len(i):
            continue
        long = pd.DataFrame({**{c: a[i].astype(np.int32) for c, a in cols.items()}, "value": v[i]})
        per_run = long.groupby(["k", "p", "run", "r"])["value"].median().reset_index().assign(mod=fleet)
        if wanted is not None:
            long = long[np.isin(long["mod"].to_numpy(), wanted)]
        per = pd.concat([per_run, long] if modules else [per_run], ignore_index=True)
        vals = per.groupby(["k", "p", "mod", "r"], sort=True)["value"].median().reset_index()
        ids = vals[["k", "p", "mod"]].to_numpy()
        starts = np.flatnonzero(np.r_[True, (ids[1:] != ids[:-1]).any(axis=1)]).tolist() if len(vals) else []
        ranks, values = vals["r"].to_numpy(), vals["value"].to_numpy()
        found += [((int(ids[a, 0]), int(ids[a, 1]), code, int(ids[a, 2])), ranks[a:b], values[a:b])
                  for a, b in zip(starts, [*starts[1:], len(vals)], strict=True)]
    # by (key, profile, metric, module): the order of the texts (sorted codes)
    found.sort(key=lambda f: f[0])
    return [((str(keys[k]), str(profiles[p]), str(names[mc]), str(module_names[mod])), r, x)
            for (k, p, mc, mod), r, x in found]


def findings(found: Sequence[SeriesChange]) -> list[Finding]:
    """Change points of one model key at the same release and scope, as one finding each; a module's change
    points at a release where the fleet's series of that key moved too are that fleet finding's (its
    ``modules``), not findings of their own: one cause, one finding."""
    groups: dict[tuple[str, str, str], list[SeriesChange]] = {}
    for c in found:
        groups.setdefault((c.model_key, c.module, c.release), []).append(c)
    fleet_at = {(key, release) for key, module, release in groups if module == FLEET}
    explained: dict[tuple[str, str], list[str]] = {}
    out = []
    for (key, module, release), members in groups.items():
        if module != FLEET and (key, release) in fleet_at:
            explained.setdefault((key, release), []).append(module)
            continue
        ranked = sorted(members, key=lambda c: (c.metric in DERIVED, -abs(c.change.size)))
        out.append(Finding(lead=ranked[0], moved=tuple(ranked)))
    out = [replace(f, modules=tuple(sorted(explained.get((f.lead.model_key, f.lead.release), ()))))
           if f.lead.module == FLEET else f for f in out]
    return sorted(out, key=lambda f: (f.lead.module != FLEET, f.lead.model_key, f.lead.release, f.lead.module))


# --------------------------------------------------------------------------- records (CLI and API)
def settings_of(min_magnitude: float, max_pvalue: float) -> DetectorSettings:
    """The detector's settings from the command's / the API's options (a bad one: :class:`TrendError`)."""
    try:
        return DetectorSettings(min_magnitude=min_magnitude, max_pvalue=max_pvalue)
    except SeriesError as exc:
        raise TrendError(str(exc)) from exc


def record(release: str, key: str, profile: str, metric: str, scope: str, cp: ChangePoint,
           until: str | None = None) -> dict[str, Any]:
    """One change point as a record (a row of ``fleetctl trend``'s table, an item of its JSON and the API's);
    ``until``: a drift's first release at the new level (a step: ``release``)."""
    drift = cp.kind == "drift"
    return {"release": release, "model_key": key, "profile": profile, "metric": metric, "scope": scope,
            "size": f"{cp.size:+.1%}", "ci": f"[{cp.ci_low:+.1%}, {cp.ci_high:+.1%}]", "p": f"{cp.p_value:.3g}",
            "in_force": "yes" if cp.in_force else "no",
            "drift": f"{cp.slope:+.2%}/release [{cp.slope_low:+.2%}, {cp.slope_high:+.2%}] to {until}" if drift else "",
            "size_value": cp.size, "ci_low": cp.ci_low, "ci_high": cp.ci_high, "p_value": cp.p_value,
            "index": cp.index, "kind": cp.kind, "until": release if until is None else until, "end": cp.end,
            "slope_value": cp.slope if drift else None, "slope_low": cp.slope_low if drift else None,
            "slope_high": cp.slope_high if drift else None}


def describe(c: SeriesChange) -> str:
    """A change in a line: ``-8.1 % at 1.6.0``, or ``drift +20.4 % (+0.55 %/release) from 1.1.0 to 1.39.0``."""
    cp = c.change
    if cp.kind == "drift":
        return f"drift {cp.size:+.1%} ({cp.slope:+.2%}/release) from {c.release} to {c.until}"
    return f"{cp.size:+.1%} at {c.release}"


def scope_of(module: str) -> str:
    return "fleet" if module == FLEET else module


@dataclass(frozen=True)
class TrendQuery:
    """What ``fleetctl trend`` and ``GET /api/v1/trend`` ask: ``models`` None for every key; ``devices`` None
    for every module's own series (else those modules'; the fleet series are always over every module)."""

    models: tuple[str, ...] | None = None
    profile: str | None = None
    metric: str | None = None
    devices: frozenset[str] | None = None
    settings: DetectorSettings = field(default_factory=DetectorSettings)

    def __post_init__(self) -> None:
        if self.metric is not None and self.metric not in METRICS:
            raise TrendError(f"--metric {self.metric!r}: not a metric ({', '.join(METRICS)})")


@dataclass(frozen=True)
class TrendResult:
    """The records of a query, and how many releases the history holds (for the "no change points" line); with
    no records, ``reach``: what the fleet series could have shown (:func:`reach_of`), else None."""

    records: list[dict[str, Any]]
    releases: int
    reach: HistoryReach | None = None


@dataclass(frozen=True)
class HistoryReach:
    """The smallest relative step the detector names over ``series`` series (their median): in the middle of
    the history and with ``min_segment`` releases after it (None: a series too short for one), at their noise
    (median relative noise)."""

    series: int
    releases: int
    noise: float
    middle: float | None
    fresh: float | None
    min_magnitude: float = 0.0

    def line(self) -> str:
        """``the smallest step it could find here: 2.1 % in the middle, 3.4 % 3 releases from the end (noise 1.0
        %, median of 12 series)``, or why none."""
        if self.middle is None or self.fresh is None:
            return f"no change point can be named under {MIN_RELEASES} releases"
        return (f"the smallest step it could find here: {self.middle:.1%} in the middle, {self.fresh:.1%} "
                f"{DEFAULT_MIN_SEGMENT} releases from the end (noise {self.noise:.1%}, median of {self.series} "
                f"series; none under --min-magnitude {self.min_magnitude:.1%})")

    def as_dict(self) -> dict[str, Any]:
        return {"series": self.series, "releases": self.releases, "noise": self.noise, "middle": self.middle,
                "fresh": self.fresh, "min_magnitude": self.min_magnitude}


def reach_of(series: Sequence[np.ndarray], settings: DetectorSettings) -> HistoryReach | None:
    """:class:`HistoryReach` of ``series`` (each at its own length and noise, then the medians of those long enough
    for a step); None for none."""
    got = [reach(x, settings) for x in series if len(x) >= 3]
    if not got:
        return None

    def median(values: list[float | None]) -> float | None:
        # a series too short for any: left out
        known = [v for v in values if v is not None]
        return float(np.median(known)) if known else None

    return HistoryReach(series=len(got), releases=max(r.n for r in got),
                        noise=float(np.nanmedian([r.noise for r in got])), middle=median([r.middle for r in got]),
                        fresh=median([r.fresh for r in got]), min_magnitude=settings.min_magnitude)

def trend_records(rows: pd.DataFrame, runs: pd.DataFrame, query: TrendQuery) -> TrendResult:
    """The findings of ``query`` over ``rows`` (:func:`controller.report.load.history_frames`) as records, the
    lead change point of each with ``moved_with`` (each other series), ``moved`` (series per metric) and
    ``values`` (the lead's series, in release order)."""
    if query.models is not None:
        rows = rows[rows["model_key"].astype(str).isin(query.models)]
    if query.profile is not None:
        of_profile = rows[rows["profile"].astype(str) == query.profile]
        # said, not "no change points": there is no series to look at
        if of_profile.empty and len(rows):
            raise _no_profile(query, {str(p) for p in rows["profile"].unique()})
        rows = of_profile
    found = changes(rows, runs, query.settings, metrics=[query.metric] if query.metric else tuple(METRICS))
    recs = _records(found, query)
    releases = len(set(runs["release"].astype(str)) - {""})
    if recs:
        return TrendResult(recs, releases)
    metrics = [m for m in ([query.metric] if query.metric else METRICS) if m in rows.columns]
    fleet = _release_series(rows, runs, metrics, release_order(runs), modules=False) if len(rows) else []
    return TrendResult(recs, releases, reach_of([x for _, _, x in fleet], query.settings))


def kept_records(found: Sequence[SeriesChange], profiles: dict[str, Sequence[str]], releases: int,
                 query: TrendQuery) -> TrendResult | None:
    """:func:`trend_records` of ``query`` from ``found``, every change point of every series of the history at the
    detector's default settings (kept: :mod:`controller.report.kept`), without a row read: a series is built from
    the rows of its own model key and profile alone, so the query's keys, profile and metric select series, not
    rows. ``profiles``: model key -> its profiles with rows. None when there is no record (the reach of the
    "no change points" line is read from the rows: :func:`trend_records`) or for other settings."""
    if query.settings != DetectorSettings():
        return None
    if query.profile is not None:
        have = {p for k, ps in profiles.items() if query.models is None or k in query.models for p in ps}
        if have and query.profile not in have:
            raise _no_profile(query, have)
    picked = [c for c in found if (query.models is None or c.model_key in query.models)
              and (query.profile is None or c.profile == query.profile)
              and (query.metric is None or c.metric == query.metric)]
    recs = _records(picked, query)
    return TrendResult(recs, releases) if recs else None


def _no_profile(query: TrendQuery, profiles: set[str]) -> ReportError:
    return ReportError(f"profile {query.profile!r}: no rows of it in the history"
                       f"{' of ' + ', '.join(query.models) if query.models else ''} (profiles: "
                       f"{', '.join(sorted(profiles))})")


def _records(found: Sequence[SeriesChange], query: TrendQuery) -> list[dict[str, Any]]:
    if query.devices is not None:
        found = [c for c in found if c.module == FLEET or c.module in query.devices]
    recs = []
    for f in findings(found):
        c = f.lead
        rec = record(c.release, c.model_key, c.profile, c.metric, scope_of(c.module), c.change, c.until)
        rec["moved_with"] = [f"{m.profile} {m.metric} {m.change.size:+.1%}" for m in f.moved[1:]]
        counts: dict[str, int] = {}
        for m in f.moved[1:]:
            counts[m.metric] = counts.get(m.metric, 0) + 1
        rec["moved"] = ", ".join(f"{metric} x{n}" for metric, n in counts.items())  # series per metric
        rec["values"] = list(c.values)
        rec["modules_moved"] = list(f.modules)
        recs.append(rec)
    return recs


# --------------------------------------------------------------------------- the report's "History" section
def history_section(rows: pd.DataFrame, runs: pd.DataFrame, release: str,
                    settings: DetectorSettings | None = None, *, max_charts: int = MAX_CHARTS) -> HistorySection:
    """The series of ``rows`` (the run's model keys over the history) with a change point in force or at
    ``release`` (the run's), fleet-wide first; none drawn when the history has under :data:`MIN_RELEASES`."""
    order = release_order(runs)
    if len(order) < MIN_RELEASES:
        return HistorySection(releases=len(order), needed=MIN_RELEASES, series=(), more=0)
    found = changes(rows, runs, settings)
    by_series: dict[tuple[str, str, str, str], list[SeriesChange]] = {}
    for c in found:
        by_series.setdefault((c.model_key, c.profile, c.metric, c.module), []).append(c)
    shown = [cs for cs in by_series.values() if any(c.change.in_force or c.release == release for c in cs)]
    shown.sort(key=lambda cs: (cs[0].module != FLEET, cs[0].model_key, cs[0].metric in DERIVED, cs[0].profile,
                               cs[0].metric, cs[0].module))
    # each series' releases: those of its values (c.values), in release order
    releases = {k: tuple(order[r] for r in ranks)
                for k, ranks, _ in _release_series(rows, runs, [m for m in METRICS if m in rows.columns], order,
                                                   modules=True)}
    series = []
    for cs in shown[:max_charts]:
        c = cs[0]
        rels = releases[(c.model_key, c.profile, c.metric, c.module)]
        series.append(TrendSeries(model_key=c.model_key, profile=c.profile, metric=c.metric, scope=scope_of(c.module),
                                  releases=rels, values=c.values, marks=tuple(x.change.index for x in cs),
                                  ends=tuple(x.change.end for x in cs),
                                  sizes=tuple(x.change.size for x in cs), in_force=tuple(x.change.in_force for x in cs),
                                  at_release=tuple(x.release == release for x in cs)))
    return HistorySection(releases=len(order), needed=MIN_RELEASES, series=tuple(series),
                          more=max(0, len(shown) - max_charts))


# --------------------------------------------------------------------------- a run's new change points
def new_changes(rows: pd.DataFrame, runs: pd.DataFrame, run_id: str,
                settings: DetectorSettings | None = None) -> list[SeriesChange]:
    """The change points of ``rows`` over the history with ``run_id`` that the history without it does not
    have (same series, same release; a drift: a change of the same series over any of its releases): what the run
    made detectable. A level shift is named by the run that first makes it significant, not by every run after it.

    Only the run's own series are searched (ADR 0043): those of the (model key, profile)s it has rows of, fleet-wide
    and of its modules; a series the run has no value in is the same with it and without it, so it has no change
    point the history without the run lacks."""
    own = rows[rows["run_id"].astype(str) == run_id]
    if not len(own):
        return []
    pairs = set(zip(own["model_key"].astype(str), own["profile"].astype(str), strict=True))
    key = rows["model_key"].astype(str) + "\0" + rows["profile"].astype(str)
    rows = rows[key.isin({f"{k}\0{p}" for k, p in pairs})]
    modules = {str(m) for m in own["module"].unique()}
    found = changes(rows, runs, settings, only_modules=modules)
    if not found:
        return []
    series = {(c.model_key, c.profile, c.metric) for c in found}
    key = rows["model_key"].astype(str) + "\0" + rows["profile"].astype(str)
    wanted = {f"{k}\0{p}" for k, p, _ in series}
    before_rows = rows[(rows["run_id"].astype(str) != run_id) & key.isin(wanted)]
    before_runs = runs[runs["run_id"].astype(str) != run_id]
    earlier = changes(before_rows, before_runs, settings, metrics=sorted({m for _, _, m in series}),
                      only_modules=modules)
    old = {(c.model_key, c.profile, c.metric, c.module, c.release) for c in earlier}
    rank = {r: i for i, r in enumerate(release_order(runs))}
    spans: dict[tuple[str, str, str, str], list[tuple[int, int]]] = {}
    for c in earlier:
        spans.setdefault((c.model_key, c.profile, c.metric, c.module), []).append(
            (rank.get(c.release, -1), rank.get(c.until or c.release, -1)))

    def known(c: SeriesChange) -> bool:
        # a drift's first and last releases are estimates that move as the history grows (and a drift may first
        # have been named as a step inside it): one that overlaps a change the history without the run had is that
        # change, not a new one
        if (c.model_key, c.profile, c.metric, c.module, c.release) in old:
            return True
        if c.change.kind != "drift":
            return False
        lo, hi = rank[c.release], rank[c.until]
        return any(a <= hi and b >= lo for a, b in spans.get((c.model_key, c.profile, c.metric, c.module), ()))

    return [c for c in found if not known(c)]


def change_payload(c: SeriesChange) -> dict[str, Any]:
    """One change point in a webhook body (the record's fields, and the release before it)."""
    rec = record(c.release, c.model_key, c.profile, c.metric, scope_of(c.module), c.change, c.until)
    return {**rec, "previous": c.previous}
