"""The runs' own noise: a finding on too few modules for an interval must stand out of it (ADR 0040).

Each module of a run runs the same release: within one run the modules are repeats of one measurement, and how far
they lie apart is the noise the run itself shows (a loaded machine, a real engine's tiny timings). With six or more
modules the verdict's tests and intervals over the modules weigh it already; with fewer (2 real llama.cpp modules
judged against a reference run of the same release made a minute before: 24 "regressions" down to -95 %, all of them
inside that noise) this module weighs each fleet finding, and each module's finding against its previous run, by a
pooled two-sample t-test of the judged run against its reference (the baseline's rows or the previous run's):

* a key (all its profiles): each module's level, the mean of its badness over the key's profiles; the judged run's
  levels against the reference's, the variance pooled from the spread of both runs' levels around their run's mean
  (the key's, at least every key's of the metric: a key of two modules in each run has 2 degrees of freedom);
* one profile: the cell's modules of both runs, the variance pooled from the spread of the modules around their
  cell's mean in both runs (the key's cells, at least every cell's of the metric);
* one module against its previous run: the change of its level, against the other modules' changes of level (every
  key's of the metric; their mean square: the variance of a change with nothing changed).

The runs also move as wholes (a loaded machine slows the judged run, not its two modules apart): where the spread of
every key's (cell's) change of the metric, 1.4826 MAD, is wider than the repeats', it is the noise (a llama.cpp
prefill cell at -98 % with 2 + 2 modules: 4 repeat spreads out, and inside the spread of the run's 21 cells'
changes). Each p is one-sided (in the direction of worse) and Bonferroni-adjusted over the metric's keys (a profile: its
cells): one run judges dozens of cells, and each of them at ``alpha`` would name one by chance in most runs. A
finding whose p is not below ``alpha`` is no regression: it is said as a change "not significant" (a key's change in
the report's table). The judged run's outlier modules are left out of both runs' spread. Where neither run has a
repeat (one module against one: no spread to estimate), the finding is judged as before. Pure: frames in, findings
out.

Lazy imports: :mod:`.nulls` (scipy.special: 395 ms CPU a fresh process, ``bench/import_costs.py``) is imported
by the tests that use it, as in :mod:`.stats`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import pandas as pd

from contract.records import WINDOW_METRICS
from controller.report.analysis.frame import B
from controller.report.analysis.stats import MIN_WINDOWS_FOR_INTERVAL
from controller.report.model import ALL_METRICS, FLEET, Change, Regression, Thresholds

# fewer modules: no distribution-free interval of a median at 95 % (stats.median_interval_ranks)
NOISE_BELOW = 6
assert NOISE_BELOW >= MIN_WINDOWS_FOR_INTERVAL


def _long(frame: pd.DataFrame, metric: str) -> pd.DataFrame:
    """One metric's rows: key, module, profile, badness (no NaN)."""
    out = pd.DataFrame({"key": frame["model_key"].astype(str).to_numpy(),
                        "module": frame["module"].astype(str).to_numpy(),
                        "profile": frame["profile"].astype(str).to_numpy(),
                        "b": frame[B[metric]].to_numpy(dtype=float)})
    return out[~np.isnan(out["b"].to_numpy())]


def _pooled(groups: list[np.ndarray]) -> tuple[float, int]:
    """The pooled variance of values around their groups' means, and its degrees of freedom."""
    ss = sum(float(((g - g.mean()) ** 2).sum()) for g in groups if len(g))
    df = sum(len(g) - 1 for g in groups if len(g))
    return (ss / df if df > 0 else math.nan), df


def _wider(a: tuple[float, int], b: tuple[float, int]) -> tuple[float, int]:
    """Of two (variance, degrees of freedom), the larger variance (a key's own noise, at least its metric's over
    every key: a key of three profiles says little of it), with its degrees of freedom."""
    if not math.isfinite(a[0]):
        return b
    if not math.isfinite(b[0]):
        return a
    return a if a[0] >= b[0] else b


class RunNoise:
    """The judged run's rows (``cur``: the included modules') and its reference's (``ref``), weighed one metric at a
    time, only for the findings there are (a run without any takes nothing)."""

    def __init__(self, cur: pd.DataFrame, ref: pd.DataFrame, th: Thresholds, left_out: Iterable[str] = ()) -> None:
        self.cur, self.th = cur, th
        # the judged run's outlier modules: their level in the reference is no noise either
        out = set(left_out)
        self.ref = ref[~ref["module"].astype(str).isin(out).to_numpy()] if out else ref
        self._cache: dict[str, tuple[pd.DataFrame, pd.DataFrame]] = {}

    def _rows(self, metric: str) -> tuple[pd.DataFrame, pd.DataFrame]:
        if metric not in self._cache:
            self._cache[metric] = (_long(self.cur, metric), _long(self.ref, metric))
        return self._cache[metric]

    def modules(self, key: str, metric: str) -> int:
        x = self._rows(metric)[0]
        return int(x.loc[x["key"] == key, "module"].nunique())

    def _levels(self, metric: str) -> tuple[pd.Series, pd.Series]:
        """Per (key, module), its mean badness over the key's profiles both runs have (judged run, reference)."""
        x, y = self._rows(metric)
        both = pd.MultiIndex.from_frame(x[["key", "profile"]]).intersection(
            pd.MultiIndex.from_frame(y[["key", "profile"]]))

        def level(z: pd.DataFrame) -> pd.Series:
            z = z[pd.MultiIndex.from_frame(z[["key", "profile"]]).isin(both)]
            return z.groupby(["key", "module"])["b"].mean()

        return level(x), level(y)

    def _level_var(self, key: str, metric: str) -> tuple[float, int]:
        """The pooled variance of the module levels around their run's mean: the key's, at least every key's."""
        x, y = self._levels(metric)
        groups = [g.to_numpy() for side in (x, y) for _, g in side.groupby(level="key")]
        mine = [side.xs(key, level="key").to_numpy() for side in (x, y) if key in side.index.get_level_values("key")]
        return _wider(_pooled(mine), _pooled(groups))

    def key_p(self, key: str, metric: str, sign: float = 1.0) -> float | None:
        """The one-sided p (worse; ``sign`` -1: better) of the key's change against the runs' spread of module levels,
        Bonferroni over the metric's keys; None: no repeat in either run (nothing to weigh it by)."""
        x, y = self._levels(metric)
        if key not in x.index.get_level_values("key") or key not in y.index.get_level_values("key"):
            return None
        a, b = x.xs(key, level="key"), y.xs(key, level="key")
        var, df = self._level_var(key, metric)
        factor = 1 / len(a) + 1 / len(b)
        changes = (x.groupby(level="key").mean() - y.groupby(level="key").mean()).dropna()
        var = max(var, _robust_var(changes.to_numpy()) / factor) if math.isfinite(var) else var
        p = _t_p(sign * float(a.mean() - b.mean()), var, factor, df)
        return None if p is None else min(1.0, p * x.index.get_level_values("key").nunique())

    def profile_p(self, key: str, profile: str, metric: str) -> float | None:
        """The one-sided p (worse) of one profile's change against the spread of the modules around their cell's mean
        in both runs (the key's cells, at least every key's), Bonferroni over the metric's cells."""
        x, y = self._rows(metric)

        def cells(z: pd.DataFrame) -> list[np.ndarray]:
            return [g.to_numpy() for _, g in z.groupby(["key", "profile"])["b"]]

        var, df = _wider(_pooled(cells(x[x["key"] == key]) + cells(y[y["key"] == key])), _pooled(cells(x) + cells(y)))
        a = x.loc[(x["key"] == key) & (x["profile"] == profile), "b"].to_numpy()
        b = y.loc[(y["key"] == key) & (y["profile"] == profile), "b"].to_numpy()
        if not len(a) or not len(b):
            return None
        factor = 1 / len(a) + 1 / len(b)
        # the runs as wholes move too (a loaded machine slows one run, not its modules apart): the spread of every
        # cell's change of the metric (robust: most cells did not change) when it is the wider
        changes = (x.groupby(["key", "profile"])["b"].mean() - y.groupby(["key", "profile"])["b"].mean()).dropna()
        var = max(var, _robust_var(changes.to_numpy()) / factor) if math.isfinite(var) else var
        p = _t_p(float(a.mean() - b.mean()), var, factor, df)
        return None if p is None else min(1.0, p * len(x.groupby(["key", "profile"])))

    def module_p(self, module: str, key: str, metric: str) -> float | None:
        """The one-sided p (worse) of one module's change of level against its previous run's, by how far the other
        modules' levels (of every key of the metric) moved from their previous run's: those changes' mean square
        is the variance of a change with nothing changed (the module's own change is not in it); Bonferroni over
        the metric's keys."""
        x, y = self._levels(metric)
        d = (x - y).dropna()
        if (key, module) not in d.index:
            return None
        rest = d.drop(index=(key, module)).to_numpy()
        var = float(np.mean(rest**2)) if len(rest) else math.nan
        p = _t_p(float(d[(key, module)]), var, 1.0, len(rest))
        return None if p is None else min(1.0, p * x.index.get_level_values("key").nunique())


def _robust_var(changes: np.ndarray) -> float:
    """The variance of changes with nothing changed, from all of them: (1.4826 MAD)^2, robust to the few that did
    (0 below 3 changes: no estimate)."""
    if len(changes) < 3:
        return 0.0
    return float((1.4826 * np.median(np.abs(changes - np.median(changes)))) ** 2)


def _t_p(diff: float, var: float, factor: float, df: int) -> float | None:
    """P(T > t), t = diff / sqrt(var factor); None without a spread to weigh it by (no degrees of freedom, or none
    apart: a synthetic fleet without noise)."""
    from controller.report.analysis.nulls import t_sf

    if df < 1 or not math.isfinite(var) or var <= 0.0:
        return None
    return t_sf(diff / math.sqrt(var * factor), df)


def _judged(metric: str) -> bool:
    # energy and starts: t-tests over the modules
    return metric in ALL_METRICS and metric not in WINDOW_METRICS


def weigh(regs: list[Regression], changes: list[Change], noise: RunNoise, against: str
          ) -> tuple[list[Regression], list[Change]]:
    """The findings (and key-level changes) against ``against`` on fewer than :data:`NOISE_BELOW` modules, weighed
    by the runs' noise: those inside it are no regression (a key's change: "not significant")."""
    th = noise.th
    kept: list[Regression] = []
    quiet: set[tuple[str, str]] = set()
    for r in regs:
        if r.against != against or not _judged(r.metric) or noise.modules(r.model_key, r.metric) >= NOISE_BELOW:
            kept.append(r)
            continue
        if r.module != FLEET:
            p = noise.module_p(r.module, r.model_key, r.metric)
        elif r.profile == FLEET:
            p = noise.key_p(r.model_key, r.metric)
        else:
            p = noise.profile_p(r.model_key, r.profile, r.metric)
        if p is None:
            kept.append(r)
        elif p < th.alpha:
            kept.append(r.model_copy(update={"detail": f"{r.detail}; beyond the runs' own spread (p {p:.2g})"}))
        elif r.module == FLEET and r.profile == FLEET:
            quiet.add((r.model_key, r.metric))
    out: list[Change] = []
    for c in changes:
        if c.against == against and c.status in ("regressed", "improved") and _judged(c.metric) and (
                (c.model_key, c.metric) in quiet or c.status == "improved"
                and noise.modules(c.model_key, c.metric) < NOISE_BELOW and _improved_in_noise(noise, c)):
            c = c.model_copy(update={"status": "not significant"})
        out.append(c)
    return kept, out


def _improved_in_noise(noise: RunNoise, c: Change) -> bool:
    """An improvement the runs' noise does not show (its p in the better direction not below alpha)."""
    p = noise.key_p(c.model_key, c.metric, sign=-1.0)  # in the direction of better
    return p is not None and p >= noise.th.alpha
