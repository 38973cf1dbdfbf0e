"""The regression policy: what counts as a regression or an outlier, one finding per cause, the verdict.

Read this file to know what a report will call a regression; the figures it judges are taken
beneath (:mod:`.compare`, :mod:`.outliers`; the numpy speed tricks in :mod:`.frame`,
:mod:`.groups`, :mod:`.middles`). The numbers (tolerances, alphas) are
:class:`~controller.report.model.Thresholds`. What keeps false alarms out and still names a
real regression:

* every figure is a *badness* in log units, ``b = ±log(value)``, signed so that larger is worse;
  a change is ``value / reference - 1``;
* **outliers first**: a module whose *typical* deviation from the fleet median (over all its
  figures) is beyond ``outlier_tolerance`` and one-sided by a sign test (``p < outlier_alpha``)
  is named once; then the same per (module, model key) on the other modules
  (:func:`outlier_hits`). Outlier modules are left out of the fleet figures, so a slow module is
  not a regression;
* **one model key, fleet-wide** (against the baseline or the previous run): per profile the fleet's trimmed
  mean of the change (the interquartile mean of the modules, at least the best and the worst left out; with 2
  modules, or an even count below 12, the lower median as below where the middle two differ by more than the
  tolerance, the trimmed mean where they agree: ADR 0042), then the Hodges-Lehmann centre of those over
  the key's profiles (ADR 0016: a 6 % change named in every seed where the median of medians missed 3 in
  1,000); worse than the metric's tolerance and ``p < alpha`` by a Wilcoxon signed-rank test across profiles:
  regressed (:func:`key_status`);
* **one profile, fleet-wide**: worse than tolerance with ``p < alpha_profile`` by a sign test
  across modules; with fewer than ``min_modules_for_test`` modules, only a change of 3x the
  tolerance (:func:`profile_regressed`). In cells of fewer than :data:`LOWER_MEDIAN_BELOW` rows
  the fleet median is the lower median of the badness (with an even count the less bad of the
  middle two), so that half of a small fleet is not a fleet-wide regression;
* **one module against its previous run**: the median over profiles worse than tolerance and
  ``p < alpha`` by a sign test (:func:`module_regressed`); changes a fleet-wide finding or the
  outlier list already explain are folded into those findings (:func:`fold`);
* MTP: accept rates are metrics like the others (higher is better); a prompt answered correctly
  by the reference and wrongly now is a regression (:func:`answer_flipped`);
* **a metric gone**: a table metric the baseline has for a key's profiles and this run's rows of those profiles
  have no figure of (the column dropped or renamed, or every figure flagged invalid by the parser: 0, negative,
  inf) is a finding, never a pass (:func:`missing_metrics`; issue 45).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import pandas as pd

from contract.records import ENERGY_METRICS, METRICS, STARTUP_METRICS
from controller.report.model import DERIVED, FLEET, Outlier, Regression, Status, Thresholds, Verdict

# a table's columns
TABLE_METRICS = tuple(m for m in METRICS if m not in ENERGY_METRICS and m not in STARTUP_METRICS)
# the run's figure, on every key's rows
PRECOMPILE_METRICS = ("precompile_s", "precompile_fetch_s")
# cells with fewer rows: the fleet median is the lower median of the badness
LOWER_MEDIAN_BELOW = 12
# cells of more rows: the key-level figure takes their median, not their trimmed mean (ADR 0016)
TRIM_UP_TO = 1024


# -- a change beyond tolerance (``METRICS[m]``: higher is better) --------------------------------
def worse(metric: str, change: Any, tol: float) -> Any:
    """Whether ``change`` (value / reference - 1) is worse than the tolerance."""
    return change <= -tol if METRICS[metric] else change >= tol


def better(metric: str, change: Any, tol: float) -> Any:
    """Whether ``change`` is better than the tolerance."""
    return change >= tol if METRICS[metric] else change <= -tol


def threshold(metric: str, tol: float) -> float:
    """Tolerance as a badness difference (log units)."""
    return -math.log(1 - tol) if METRICS[metric] else math.log(1 + tol)


# -- the rules ------------------------------------------------------------------------------------
def key_status(metric: str, change: float, p: float, th: Thresholds, base: float | None = None) -> Status:
    """One model key, fleet-wide: ``change`` the centre over profiles, ``p`` the Wilcoxon test's (the t-test's over
    the modules' starts or windows). A start-up cost that moved less than ``startup_floor_s`` from ``base`` (its
    reference, seconds) is within tolerance whatever the fraction: a millisecond's first request 20 % longer is
    timer noise, not a slower release (docs/adr/0029-start-up-costs-judged.md)."""
    if metric in STARTUP_METRICS and base is not None and abs(base * change) < th.startup_floor_s:
        return "within tolerance"
    tol = th.tol(metric)
    if worse(metric, change, tol):
        return "regressed" if p < th.alpha else "not significant"
    if better(metric, change, tol):
        return "improved" if p < th.alpha else "not significant"
    return "within tolerance"


def profile_regressed(cells: pd.DataFrame, th: Thresholds) -> tuple[np.ndarray, pd.Series]:
    """One profile of one key, fleet-wide, per cell (columns ``metric``, ``change``, ``n`` modules,
    ``p`` the sign test of the modules worse than tolerance): which regressed, and which were
    tested (enough modules for the sign test; the others only by a gross change)."""
    tol = cells["metric"].map(th.tol)
    up = cells["metric"].map(METRICS).astype(bool)
    beyond = np.where(up, cells["change"] <= -tol, cells["change"] >= tol)
    tested = cells["n"] >= th.min_modules_for_test
    gross = np.where(up, cells["change"] <= -3 * tol, cells["change"] >= 3 * tol)
    return beyond & np.where(tested, cells["p"] < th.alpha_profile, gross), tested


def module_regressed(metric: str, change: pd.Series, p: pd.Series, th: Thresholds) -> pd.Series:
    """One module against its previous run, per module/key: median change over profiles, sign test."""
    return worse(metric, change, th.tol(metric)) & (p < th.alpha)


def outlier_hits(stats: pd.DataFrame, th: Thresholds) -> pd.Series:
    """Outlier modules (or module/key pairs), per group (columns ``factor``: typical performance
    relative to the fleet median; ``p``: sign test of the deviations' direction)."""
    off = (stats["factor"] - 1.0).abs() >= th.outlier_tolerance
    return off & (stats["p"] < th.outlier_alpha)


def answer_flipped(correct: np.ndarray, ref_correct: np.ndarray) -> np.ndarray:
    """Per row: an MTP prompt answered wrongly now (0) and rightly in the reference (NaN: not asked)."""
    return (correct == 0.0) & (np.nan_to_num(ref_correct, nan=0.0) >= 0.5)


def missing_metrics(cur: pd.DataFrame, cells: pd.DataFrame, ref: pd.DataFrame, modkey_names: Any,
                    against: str = "baseline") -> list[Regression]:
    """Findings for table metrics ``ref`` (figures per key/profile, text index) has and ``cur`` (a prepared frame:
    invalid figures are NaN there) lacks: per (module, key), the rows of the profiles ``ref`` has a figure for, none
    with a figure. One fleet-wide finding where every module with such rows lacks it, else one per module.
    ``cells``: (model_key, profile) text per cell code; ``modkey_names(code)``: (module, key) of a module/key code.
    A finding's ``value`` and ``change`` are None (:func:`is_missing`), ``baseline`` the reference's median."""
    if not len(cur) or not len(cells):
        return []
    r = ref.reindex(pd.MultiIndex.from_frame(cells[["model_key", "profile"]]))
    cell, modkey = cur["cell"].to_numpy(), cur["modkey"].to_numpy()
    size = int(modkey.max()) + 1
    slot = np.zeros(int(cells.index.max()) + 1, dtype=bool)
    out: list[Regression] = []
    for m in TABLE_METRICS:
        had = r[m].to_numpy(dtype=float) if m in r.columns else np.full(len(r), np.nan)
        if m not in cur.columns or not np.isfinite(had).any():
            continue
        slot[:] = False
        slot[cells.index.to_numpy()] = np.isfinite(had)
        wanted = slot[cell]
        rows = np.bincount(modkey[wanted], minlength=size)
        figures = np.bincount(modkey[wanted & np.isfinite(cur[m].to_numpy())], minlength=size)
        lacking = np.flatnonzero((rows > 0) & (figures == 0))
        if not len(lacking):
            continue
        per_key: dict[str, list[str]] = {}
        for code in lacking.tolist():
            module, key = modkey_names(code)
            per_key.setdefault(key, []).append(module)
        with_rows: dict[str, int] = {}
        for code in np.flatnonzero(rows > 0).tolist():
            key = modkey_names(code)[1]
            with_rows[key] = with_rows.get(key, 0) + 1
        for key, mods in sorted(per_key.items()):
            base = float(np.nanmedian(had[(cells["model_key"] == key).to_numpy()]))
            every = len(mods) == with_rows[key] and len(mods) > 1
            for module in [FLEET] if every else sorted(mods):
                out.append(Regression(
                    module=module, model_key=key, profile=FLEET, metric=m, baseline=base, value=None, change=None,
                    against=against, n=len(mods), modules=tuple(sorted(mods)) if every else (module,),
                    detail=f"missing: no {m} figure on {len(mods)} module(s); the {against} has it (the column "
                           "dropped or renamed, or every figure flagged invalid)"))
    return out


def is_missing(r: Regression) -> bool:
    """A finding of :func:`missing_metrics`: a metric the reference has and the run lacks."""
    return r.value is None and r.change is None and r.metric in TABLE_METRICS


# -- one finding per cause, and the verdict --------------------------------------------------------
def fold(regs: list[Regression], outliers: tuple[Outlier, ...],
         energy_outliers: tuple[Outlier, ...] = ()) -> list[Regression]:
    """One finding per cause: derived metrics into their primary, previous into baseline, module
    findings into fleet findings or the module's outlier entry (an energy outlier's: its energy findings)."""
    fleet_kpm = {(r.model_key, r.profile, DERIVED.get(r.metric, r.metric)) for r in regs if r.module == FLEET}
    out_mods = {o.module for o in outliers if o.model_key == FLEET}
    out_mk = {(o.module, o.model_key) for o in outliers}
    hot_mods = {o.module for o in energy_outliers if o.model_key == FLEET}
    hot_mk = {(o.module, o.model_key) for o in energy_outliers}

    def explained(r: Regression) -> bool:
        metric = DERIVED.get(r.metric, r.metric)
        by_fleet = (r.model_key, FLEET, metric) in fleet_kpm or (r.model_key, r.profile, metric) in fleet_kpm
        by_energy = metric in ENERGY_METRICS and (r.module in hot_mods or (r.module, r.model_key) in hot_mk)
        return by_fleet or by_energy or r.module in out_mods or (r.module, r.model_key) in out_mk

    kept = [r for r in regs if r.module == FLEET or not explained(r)]
    # same finding against both references -> one entry
    merged: dict[tuple[str, str, str, str], Regression] = {}
    for r in kept:
        ident = (r.module, r.model_key, r.profile, r.metric)
        if ident in merged:
            a = merged[ident]
            extra = f"; vs {r.against}: {r.change:+.1%}" if r.change is not None else f"; also vs {r.against}"
            merged[ident] = a.model_copy(update={"against": f"{a.against}+{r.against}", "detail": a.detail + extra})
        else:
            merged[ident] = r
    # derived metric moved with its primary -> related
    result: dict[tuple[str, str, str, str], Regression] = {}
    for ident, r in merged.items():
        prim = DERIVED.get(r.metric)
        pid = (r.module, r.model_key, r.profile, prim) if prim else None
        if pid and pid in merged:
            continue
        result[ident] = r
    for r in merged.values():
        prim = DERIVED.get(r.metric)
        pid = (r.module, r.model_key, r.profile, prim) if prim else None
        if pid and pid in result and r.change is not None:
            p = result[pid]
            result[pid] = p.model_copy(update={"related": (*p.related, f"{r.metric} {r.change:+.1%}")})
    order = {"correct": 1}
    return sorted(_one_precompile(list(result.values())), key=lambda r: (
        r.module != FLEET, r.model_key, order.get(r.metric, 0), r.profile, r.metric, r.module))


def _one_precompile(regs: list[Regression]) -> list[Regression]:
    """A precompile's finding once: its figure is the run's, on every key's rows, so each key found the same
    change; kept is the first key's, its model key ``*``, the keys named in its detail."""
    out: list[Regression] = []
    seen: dict[tuple[str, str, str], int] = {}
    for r in regs:
        if r.metric not in PRECOMPILE_METRICS:
            out.append(r)
            continue
        ident = (r.module, r.metric, r.against)
        if ident in seen:
            i = seen[ident]
            out[i] = out[i].model_copy(update={"detail": f"{out[i].detail}, {r.model_key}"})
            continue
        seen[ident] = len(out)
        out.append(r.model_copy(update={"model_key": FLEET, "detail": f"{r.detail}; the run's, on the rows of "
                                                                         f"{r.model_key}"}))
    return out


def decide(state: str, n_rows: int, regressions: tuple[Regression, ...], notes: list[str],
           expected_modules: Iterable[str], expected_keys: Iterable[str], refused: Iterable[str] = ()) -> Verdict:
    """The verdict: failed (the run failed, or no row), regressed (any finding left after folding),
    incomplete (still running, cancelled, results missing, or ``refused``: modules refused at dispatch, the run
    judged on those that ran), else pass."""
    if state == "failed" or n_rows == 0:
        return "failed"
    if regressions:
        return "regressed"
    incomplete = bool(list(refused)) or state in ("running", "cancelled") or any(
        n.startswith("no results") or " of " in n and "profiles" in n for n in notes)
    return "incomplete" if incomplete else "pass"