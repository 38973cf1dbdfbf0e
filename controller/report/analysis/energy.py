"""Energy outliers: modules (then model keys of a module) whose energy per token is out of line with the fleet's.

The unit of evidence is the benchmark window: the agent measures one energy figure per (module, model key), and
every row of the key carries it (``agent.telemetry.energy``). Counted once a row, a key's dozen rows were a
dozen figures of one measurement, and the speed outliers' sign test over them called window-to-window noise
(J/token 0.93x to 1.12x of the fleet's on four identical simulated modules, ``make demo``) an outlier at
p < 0.001. Here:

- a window's figure is the median J/token of its rows (one value where the agent gave it; synthetic fleets may
  vary it by row);
- each window's deviation is taken from the median of the *other* modules' windows of the key (log units), and
  judged by the spread of the other modules' windows of the key, at least the pooled one (:func:`_window_sd`),
  estimated from at least :data:`MIN_KEYS` keys' windows: with one key there is no energy outlier (its few
  windows are no estimate of the noise: 11 of 100 one-key demos named an identical module one, issue 46);
- a module is an outlier when the median of its windows' deviations is past the outlier tolerance and its t (the
  median over 1.25 spread / sqrt(windows), Student's t with the spread's degrees of freedom) has a two-sided p
  below ``outlier_alpha`` / the modules tested; then a (module, key) on the other modules when its one window is
  past the tolerance with p below ``outlier_alpha`` / the windows tested (Bonferroni: a z of 4 against an
  estimated spread named 3 % of runs of 4 identical modules x 7 keys; ADR 0040).

They stay in the fleet's figures (their speed is not in doubt). Pure: a prepared frame in, records out.

Lazy imports: :mod:`.nulls` (scipy.special: 395 ms CPU a fresh process, ``bench/import_costs.py``) is imported
by the tests that use it, as in :mod:`.stats`.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from controller.report.model import ENERGY_PRIMARY, FLEET, Outlier, Thresholds, WorstCase

# spreads: a window this far out counts in an outlier's share of windows out (shown, not the test)
Z = 4.0
# the spread a window is judged by comes from at least this many keys' windows
MIN_KEYS = 2
# the standard error of a median of normal figures is sqrt(pi / 2) that of their mean
MEDIAN_SE = 1.2533
# a worst case's profile: the whole key's benchmark window
WINDOW = "window"


def windows(cur: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Modules x model keys: each window's figure (the median of its rows'; NaN where a module has none)."""
    has = cur[["module", "model_key", metric]].dropna(subset=[metric])
    has = has[has[metric] > 0]
    if has.empty:
        return pd.DataFrame()
    return has.groupby(["module", "model_key"], observed=True)[metric].median().unstack().sort_index()


def energy_outliers(cur: pd.DataFrame, th: Thresholds) -> tuple[Outlier, ...]:
    """The energy outliers of a prepared frame (module-wide first, then single keys), largest first."""
    metric = ENERGY_PRIMARY[0]
    if metric not in cur.columns:
        return ()
    w = windows(cur, metric)
    # a median of the others needs two of them
    if len(w) < 3:
        return ()
    x = np.log(w.to_numpy(dtype=float))  # J/token: higher is worse, as a badness
    modules, keys = [str(m) for m in w.index], [str(k) for k in w.columns]
    found: list[Outlier] = []
    devs: list[np.ndarray] = []
    sds: list[np.ndarray] = []
    dfs: list[int] = []
    pools: list[float] = []
    for i in range(len(x)):
        others = np.delete(x, i, axis=0)
        count = np.sum(~np.isnan(others), axis=0)
        with np.errstate(all="ignore"):
            mid = np.where(count >= 2, np.nanmedian(np.where(count >= 2, others, 0.0), axis=0), np.nan)
        devs.append(x[i] - mid)
        spread, pooled, df = _window_sd(others, th.z_floor)
        sds.append(spread)
        pools.append(pooled)
        dfs.append(df)
    # Bonferroni: the modules tested, then the windows tested (one p each, two-sided)
    tested = [i for i in range(len(x)) if dfs[i] > 0 and bool((~np.isnan(devs[i])).any())]
    for i in tested:
        module, d = modules[i], devs[i][~np.isnan(devs[i])]
        typ = _cautious_median(d)
        # over several keys the pooled spread (a key's own, from three windows, is noisy: the larger of the two on
        # every key made the typical spread too wide), over one the key's own
        sd = pools[i] if len(d) > 1 else float(sds[i][~np.isnan(devs[i])][0])
        se = MEDIAN_SE * sd / math.sqrt(len(d)) if len(d) > 1 else sd
        if abs(math.exp(typ) - 1) >= th.outlier_tolerance and _t_p(typ / se, dfs[i]) * len(tested) < th.outlier_alpha:
            found.append(_outlier(module, FLEET, typ, se, sds[i], x[i], devs[i], keys, metric, th, dfs[i]))
    named = {o.module for o in found}
    cells = sum(int(np.sum(~np.isnan(devs[i]))) for i in tested)
    for i in tested:
        if modules[i] in named:
            continue
        for j, key in enumerate(keys):
            d = float(devs[i][j])
            if (not math.isnan(d) and abs(math.exp(d) - 1) >= th.outlier_tolerance
                    and _t_p(d / sds[i][j], dfs[i]) * cells < th.outlier_alpha):
                found.append(_outlier(modules[i], key, d, sds[i][j], sds[i][j:j + 1], x[i, j:j + 1],
                                      devs[i][j:j + 1], [key], metric, th, dfs[i]))
    found.sort(key=lambda o: abs(math.log(o.factor)), reverse=True)
    return tuple(found)


def _t_p(t: float, df: int) -> float:
    """Two-sided p of Student's t with ``df`` degrees of freedom: the spread is an estimate from a few windows
    (a z of 4 against a spread of 21 windows' differences named 3 % of runs of 4 identical modules x 7 keys)."""
    from controller.report.analysis.nulls import t_sf

    return 2 * t_sf(abs(t), df)


def _window_sd(others: np.ndarray, floor: float) -> tuple[np.ndarray, float, int]:
    """Per key, the spread of a module's window deviation from the others' median, from the *other* modules only
    (a hot module must not widen the spread it is judged by): Shamos's estimator (1.0483 x the median of the
    pairwise differences) of the key's windows, at least that of every key's pooled (a key of three modules
    says little; a cell of four modules' MAD is mostly the gap between its middle two), times the deviation's
    own factor sqrt(1 + pi / (2 n)) for the median of n others. Keys differ: an MTP key's windows spread 6 %
    where a plain key's spread 2 % (the accept length moves its decode). Then the pooled spread alone (times the
    same factor), and its degrees of freedom (the keys' windows less one each); 0 where fewer than
    :data:`MIN_KEYS` keys have two windows: one key's few windows are no estimate of the module's energy noise
    (11 of 100 one-key demos named an identical module an outlier, issue 46), and no window is judged."""
    cols = [others[~np.isnan(others[:, j]), j] for j in range(others.shape[1])]
    diffs = [np.abs(c[:, None] - c[None, :])[np.triu_indices(len(c), 1)] if len(c) >= 2 else np.array([])
             for c in cols]
    pairs = np.concatenate(diffs) if diffs else np.array([])
    pooled = 1.0483 * float(np.median(pairs)) if len(pairs) else floor
    per_key = np.array([1.0483 * float(np.median(d)) if len(d) else pooled for d in diffs])
    factor = math.sqrt(1 + math.pi / (2 * len(others)))
    sd = np.maximum(np.maximum(per_key, pooled), floor) * factor
    keys = sum(1 for c in cols if len(c) >= 2)
    return sd, max(pooled, floor) * factor, (sum(len(c) - 1 for c in cols if len(c) >= 2) if keys >= MIN_KEYS else 0)


def _cautious_median(d: np.ndarray) -> float:
    """The median, but of an even count the middle figure nearer zero (of two windows, one far out must not
    make the whole module out of line: it is a key outlier)."""
    s = np.sort(d)
    n = len(s)
    if n % 2:
        return float(s[n // 2])
    a, b = float(s[n // 2 - 1]), float(s[n // 2])
    return a if abs(a) < abs(b) else b


def _outlier(module: str, key: str, typ: float, se: float, spread: np.ndarray, x: np.ndarray, dev: np.ndarray,
             keys: list[str], metric: str, th: Thresholds, df: int) -> Outlier:
    """The record: factor the fleet's J/token over the module's (0.8 = 25 % more energy per token), its
    windows and their share past :data:`Z` spreads on its side, the z test's p, the worst windows."""
    side = 1.0 if typ > 0 else -1.0
    order = [j for j in np.argsort(-side * np.nan_to_num(dev, nan=-side * np.inf)) if not math.isnan(dev[j])]
    worst = tuple(WorstCase(model_key=keys[j], profile=WINDOW, metric=metric, value=math.exp(float(x[j])),
                            fleet_median=math.exp(float(x[j] - dev[j])), z=float(dev[j] / spread[j]))
                  for j in order[:th.worst_cases])
    n = int(np.sum(~np.isnan(dev)))
    out = int(np.sum(side * np.nan_to_num(dev) > Z * spread))
    from controller.report.analysis.nulls import t_ppf

    half = t_ppf(0.975, df) * se
    lo, hi = typ - half, typ + half
    return Outlier(module=module, model_key=key, factor=math.exp(-typ), cells=n, share_out=out / max(n, 1),
                   p_value=_t_p(typ / se, df), worst=worst, ci_low=math.exp(-hi), ci_high=math.exp(-lo), metric=metric)
