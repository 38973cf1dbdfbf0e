"""Paired A/B on the same modules: release B against release A, run alternately (A B B A per round) on each module.

A module's speed drifts (clocks, temperature, the day); between two fleets of runs that drift is noise the
unpaired verdict must tolerate (5 %). Here every figure of B is compared with A's figure *of the same module, the
same round and the same profile*, so what the module brings cancels:

* per (round, module, key, profile, metric): ``d = mean(badness of the B runs) - mean(badness of the A runs)`` in
  log units (badness as :mod:`.frame`: larger is worse). A round is A B B A, so the two arms' means sit at the same
  time: a drift linear in time within the round cancels exactly, a level per module and round cancels too. The
  round's means rather than "each B against its adjacent A": with A B B A both are the same figure;
* per (key, profile, metric), the *cell*: the mean of ``d`` over the (module, round) pairs (pairing has taken the
  slow module out already; the mean is the most efficient of the robust-enough figures here);
* per (key, metric): the Hodges-Lehmann centre of the cells over the key's profiles with its distribution-free
  95 % interval, and the one-sided Wilcoxon signed-rank test across profiles, as the unpaired key-level figure
  (ADR 0016): one bad profile does not make a key-level change;
* the rule is :func:`.verdict.key_status` with the paired tolerance (:data:`PAIRED_TOLERANCE`, 1 %: beyond it
  *and* ``p < alpha``: regressed);
* the **minimum detectable change** of each (key, metric): a power calculation at ``alpha`` from the measured
  noise: with ``se`` the standard error of the centre (the cells' standard deviation over the square root of the
  profiles), the smallest true change the rule names with probability :data:`POWER` (95 %) is
  ``max(tol + z_power se, (z_(1-alpha) + z_power) se)`` (a z-test in place of the signed-rank test); none when the
  key has too few profiles for the exact signed-rank test to reach ``alpha`` at all.

Measured (``bench/report.py --paired-power``): docs/adr/0019-paired-comparison.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import pandas as pd

from contract.records import WINDOW_METRICS
from controller.report.analysis.compare import WindowTest
from controller.report.analysis.frame import SIGN, B, prepare, present_metrics, relative_change
from controller.report.analysis.stats import hodges_lehmann_groups, wilcoxon_groups, window_interval, window_t_p
from controller.report.analysis.verdict import key_status, threshold
from controller.report.model import (
    ALL_METRICS,
    DERIVED,
    Arm,
    PairedChange,
    PairedReport,
    PairedRun,
    ReportError,
    Thresholds,
    Verdict,
)

ABBA: tuple[Arm, ...] = ("A", "B", "B", "A")  # one round, in run order
# the paired mode's default tolerance (the unpaired verdict's is 5 %)
PAIRED_TOLERANCE = 0.01
# the detection probability the minimum detectable change is stated at
POWER = 0.95


def paired_thresholds(tolerance: float = PAIRED_TOLERANCE, alpha: float = 0.01) -> Thresholds:
    return Thresholds(tolerance=tolerance, alpha=alpha)


def pair_differences(rows: pd.DataFrame, runs: Iterable[PairedRun]) -> tuple[pd.DataFrame, list[str]]:
    """Per (round, module, model_key, profile): ``d_<metric>`` = B's mean badness minus A's, over the rows of the
    release's benchmark of the runs in ``runs``; and notes on what could not be paired (a module or round with
    rows of one release only)."""
    d, _, notes = _paired(rows, runs)
    return d, notes


def _paired(rows: pd.DataFrame, runs: Iterable[PairedRun]) -> tuple[pd.DataFrame, dict[tuple[str, str], float],
                                                                    list[str]]:
    """:func:`pair_differences`, and per (key, metric) release A's figure (the median of its runs' mean figures:
    what a start-up cost's floor in seconds is taken from)."""
    plan = {r.run_id: r for r in runs}
    if "run_id" not in rows.columns:
        raise ReportError("rows frame lacks column 'run_id'")
    df = rows.reset_index(drop=True)
    keep = df["run_id"].astype(str).isin(plan).to_numpy().copy()
    if "source" in df.columns:
        keep &= (df["source"].astype(str) == "release").to_numpy()
    df = df[keep].reset_index(drop=True)
    if not len(df):
        return pd.DataFrame(), {}, ["no rows of the compared runs"]
    cur = prepare(df)
    run_ids = df["run_id"].astype(str).to_numpy()[cur.index.to_numpy()]
    metrics = present_metrics(cur, ALL_METRICS)
    long = pd.DataFrame({
        "round": [plan[r].round for r in run_ids], "arm": [plan[r].arm for r in run_ids],
        "module": cur["module"].astype(str).to_numpy(), "model_key": cur["model_key"].astype(str).to_numpy(),
        "profile": cur["profile"].astype(str).to_numpy(),
        **{m: cur[B[m]].to_numpy() for m in metrics}})
    ids = ["round", "module", "model_key", "profile"]
    means = long.groupby([*ids, "arm"], sort=True)[metrics].mean()
    arms = means.index.get_level_values("arm")
    a = means[arms == "A"].droplevel("arm")
    b = means[arms == "B"].droplevel("arm")
    d = b.sub(a).dropna(how="all").reset_index()
    notes: list[str] = []
    seen = long.groupby(["round", "module"])["arm"].unique()
    for (rnd, module), got in seen.items():
        if len(got) < 2:
            notes.append(f"module {module}, round {rnd}: rows of release {got[0]} only (not paired)")
    d.columns = [*ids, *(f"d_{m}" for m in metrics)]
    level = a.groupby(level="model_key").median()
    a_level = {(str(k), m): float(np.exp(SIGN[m] * v)) for m in metrics for k, v in level[m].dropna().items()}
    return d, a_level, notes


def paired_compare(rows: pd.DataFrame, runs: Iterable[PairedRun], *, release_a: str, release_b: str,
                   th: Thresholds | None = None) -> PairedReport:
    """The paired verdict of release B against release A (see the module's docstring)."""
    th = th or paired_thresholds()
    runs = tuple(runs)
    d, a_level, notes = _paired(rows, runs)
    rounds = len({r.round for r in runs})
    if not len(d):
        return PairedReport(release_a=release_a, release_b=release_b, rounds=rounds, modules=(),
                            tolerance=th.tolerance, changes=(), regressions=(), verdict="failed",
                            notes=tuple(notes or ["no figure of both releases on one module"]))
    metrics = [c[2:] for c in d.columns if c.startswith("d_")]
    long = d.melt(id_vars=["round", "module", "model_key", "profile"], value_vars=[f"d_{m}" for m in metrics],
                  var_name="metric", value_name="d").dropna(subset=["d"])
    long["metric"] = long["metric"].str.slice(2)
    cells = long.groupby(["model_key", "metric", "profile"], sort=True)["d"].agg(["mean", "count"]).reset_index()
    cells = cells.rename(columns={"mean": "t", "count": "pairs"})
    noise = long.groupby(["model_key", "metric"], sort=True)["d"].std(ddof=1)
    index = pd.MultiIndex.from_arrays([cells["model_key"], cells["metric"]]).unique().sort_values()
    at = index.get_indexer(pd.MultiIndex.from_arrays([cells["model_key"], cells["metric"]]))
    t = cells["t"].to_numpy(dtype=float)
    centre, lo, hi = hodges_lehmann_groups(t, at, len(index))
    p = wilcoxon_groups(cells, index, "t")
    sizes = np.bincount(at, minlength=len(index))
    sd = cells.groupby(at)["t"].std(ddof=1).reindex(range(len(index))).to_numpy(dtype=float)
    pairs = cells.groupby(at)["pairs"].max().reindex(range(len(index))).to_numpy().copy()
    windows = _window_tests(long)
    changes: list[PairedChange] = []
    for i, (key, metric) in enumerate(index):
        bounds = None if np.isnan(lo[i]) else (float(lo[i]), float(hi[i]))
        mid, profiles = float(centre[i]), int(sizes[i])
        # one window (start) per (round, module): its mean, t-test and t-interval over the pairs (none below
        # MIN_WINDOWS_FOR_INTERVAL), not the profiles' (one figure on every profile)
        if metric in WINDOW_METRICS:
            w = windows.get((str(key), str(metric)))
            if w is not None:
                p[i], mid, bounds, pairs[i] = w.p, w.mean, w.interval, w.n
            else:
                p[i], bounds = 1.0, None
            # a start or a window has no profiles of its own
            profiles = 0
        ch = float(relative_change(metric, mid))
        a_lo, a_hi = (None, None) if bounds is None else sorted(float(relative_change(metric, x)) for x in bounds)
        se = float(sd[i]) / math.sqrt(int(sizes[i])) if sizes[i] > 1 else math.nan
        changes.append(PairedChange(
            model_key=str(key), metric=str(metric), change=ch, ci_low=a_lo, ci_high=a_hi, p_value=float(p[i]),
            profiles=profiles, pairs=int(pairs[i]), noise=float(np.expm1(noise.get((key, metric), math.nan))),
            mdc=None if metric in WINDOW_METRICS else minimum_detectable_change(str(metric), se, int(sizes[i]), th),
            status=key_status(str(metric), ch, float(p[i]), th, a_level.get((str(key), str(metric)))),
            tolerance=th.tol(str(metric))))
    regs = _fold([c for c in changes if c.status == "regressed"])
    verdict: Verdict = "regressed" if regs else ("incomplete" if notes else "pass")
    modules = tuple(sorted(set(d["module"].astype(str))))
    return PairedReport(release_a=release_a, release_b=release_b, rounds=rounds, modules=modules,
                        tolerance=th.tolerance, changes=tuple(changes), regressions=tuple(regs), verdict=verdict,
                        notes=tuple(notes))


def _window_tests(long: pd.DataFrame) -> dict[tuple[str, str], WindowTest]:
    """Per (key, energy or start-up metric): the one-sided p-value (in the median's direction) of a t-test over the
    (round, module) pairs' window differences (each pair's median over the profiles: a key's rows carry one window's
    figure; fewer than 3 pairs: 1.0, no test), their mean and its t-interval."""
    energy = long[long["metric"].isin(WINDOW_METRICS)]
    per = energy.groupby(["model_key", "metric", "round", "module"], sort=True)["d"].median()
    out: dict[tuple[str, str], WindowTest] = {}
    for (key, metric), v in per.groupby(level=[0, 1]):
        x = v.to_numpy(dtype=float)
        out[(str(key), str(metric))] = WindowTest(window_t_p(x), len(x), float(np.mean(x)), window_interval(x))
    return out


def minimum_detectable_change(metric: str, se: float, profiles: int, th: Thresholds,
                              power: float = POWER) -> float | None:
    """The smallest true change (magnitude, relative) that the rule (beyond tolerance and ``p < alpha``) names
    with probability ``power``, for a centre of standard error ``se`` (log units): a power calculation with the
    normal distribution. None where the exact one-sided signed-rank test over ``profiles`` values cannot reach
    ``alpha`` (its smallest p is 2^-profiles) or where there is no noise estimate."""
    from scipy import stats

    if profiles < 2 or 0.5**profiles >= th.alpha or not math.isfinite(se):
        return None
    z_a, z_p = float(stats.norm.ppf(1 - th.alpha)), float(stats.norm.ppf(power))
    need = max(threshold(metric, th.tol(metric)) + z_p * se, (z_a + z_p) * se)  # badness (log units)
    return abs(float(relative_change(metric, need)))


def _fold(regs: list[PairedChange]) -> list[PairedChange]:
    """One finding per cause: a derived metric (TPOT, TTFT) left out where its primary regressed on the key."""
    primary = {(r.model_key, r.metric) for r in regs}
    return [r for r in regs if (r.model_key, DERIVED.get(r.metric, "")) not in primary]
