"""Change points over the run history: one series per (model key, profile, metric), fleet-wide and per module.

Pure pandas over a rows frame (:func:`controller.report.load.read_rows`) and the runs' (release, created_at);
the detector is :mod:`controller.report.analysis.changepoints`.

* **release order**: when every release's name parses as a version (``packaging.version``), by version,
  ties (``1.4`` and ``1.4.0``) by the earliest start of a run of each; otherwise (one nightly name that does
  not parse is enough) every release by the earliest start of its runs. Runs without a release are left out.
* **a release's value**: per run the fleet median over modules (fleet scope) or the module's value (module
  scope); a release run several times: the median of its runs.
* **one finding per cause**: change points of one model key at the same release and scope (the fleet, or one
  module) are one finding; a derived metric (``tpot_ms`` of ``decode_tps``) moved with its primary is named
  under it, as the verdict folds them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd
from packaging.version import InvalidVersion, Version

from contract.records import METRICS
from controller.report.analysis.changepoints import ChangePoint, DetectorSettings, analyse_series
from controller.report.model import DERIVED, FLEET


@dataclass(frozen=True)
class SeriesChange:
    """One change point of one series: (model key, profile, metric) fleet-wide (``module`` ``'*'``) or on one
    module; ``release``: the first release of the new level, ``previous``: the release before it."""

    model_key: str
    profile: str
    metric: str
    module: str
    release: str
    previous: str
    change: ChangePoint
    values: tuple[float, ...]  # the series, in release order (for a plot)


@dataclass(frozen=True)
class Finding:
    """Change points of one model key at one release and scope: ``lead`` the largest primary-metric one."""

    lead: SeriesChange
    moved: tuple[SeriesChange, ...]  # every change point of the finding, the lead first


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
    """One value per (model key, profile, metric, module or '*', release): long frame ``value``."""
    rel = runs.set_index("run_id")["release"].astype(str)
    df = rows[rows["source"].astype(str) == "release"] if "source" in rows else rows
    df = df.assign(release=df["run_id"].astype(str).map(rel)).dropna(subset=["release"])
    keys = ["model_key", "profile", "run_id", "release"]
    long = df.melt(id_vars=[*keys, "module"], value_vars=list(metrics), var_name="metric").dropna(subset=["value"])
    long = long.astype({c: str for c in ("model_key", "profile", "run_id", "release", "module")})
    by = ["model_key", "profile", "metric", "run_id", "release"]
    fleet = long.groupby(by, observed=True)["value"].median().reset_index().assign(module=FLEET)
    per = pd.concat([fleet, long], ignore_index=True)
    return per.groupby(["model_key", "profile", "metric", "module", "release"], observed=True)["value"] \
        .median().reset_index()


def changes(rows: pd.DataFrame, runs: pd.DataFrame, settings: DetectorSettings | None = None, *,
            metrics: Sequence[str] = tuple(METRICS), modules: bool = True) -> list[SeriesChange]:
    """Every change point of every series (fleet-wide, and per module when ``modules``)."""
    order = release_order(runs)
    rank = {r: i for i, r in enumerate(order)}
    vals = release_values(rows, runs, [m for m in metrics if m in rows.columns])
    if not modules:
        vals = vals[vals["module"] == FLEET]
    vals = vals[vals["release"].isin(rank)].assign(rank=lambda d: d["release"].map(rank)).sort_values("rank")
    out = []
    for (key, profile, metric, module), g in vals.groupby(["model_key", "profile", "metric", "module"], sort=True):
        x = g["value"].to_numpy(dtype=float)
        rels = list(g["release"])
        for cp in analyse_series(x, settings).change_points:
            out.append(SeriesChange(model_key=str(key), profile=str(profile), metric=str(metric), module=str(module),
                                    release=rels[cp.index], previous=rels[cp.index - 1], change=cp,
                                    values=tuple(float(v) for v in x)))
    return out


def findings(found: Sequence[SeriesChange]) -> list[Finding]:
    """Change points of one model key at the same release and scope, as one finding each."""
    groups: dict[tuple[str, str, str], list[SeriesChange]] = {}
    for c in found:
        groups.setdefault((c.model_key, c.module, c.release), []).append(c)
    out = []
    for members in groups.values():
        ranked = sorted(members, key=lambda c: (c.metric in DERIVED, -abs(c.change.size)))
        out.append(Finding(lead=ranked[0], moved=tuple(ranked)))
    return sorted(out, key=lambda f: (f.lead.module != FLEET, f.lead.model_key, f.lead.release, f.lead.module))
