"""The statistical tests of a report: one-sided sign tests and Wilcoxon signed-rank tests, and the
estimates that go with them (the median's and the Hodges-Lehmann centre's distribution-free intervals).

Both are vectorised over many groups at once. Their null distributions are :mod:`.nulls` (``scipy.special``,
the same numbers as ``scipy.stats`` without its import: ``bench/nulls_import.py``).

Lazy imports: :mod:`.nulls` is imported by the tests that use it, not with :mod:`controller.report`: it loads
scipy.special (395 ms CPU a fresh process, ``bench/import_costs.py``:
bench/results/import_costs_20261207_0346_lazy-libraries.txt), which a trend of a history too short for a change
point, or a report refused before its analysis, does not need (:mod:`.changepoints` loads it at its first test too).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd


def sign_p(k: Any, n: Any) -> Any:
    """One-sided sign test: probability of >= k of n in one direction by chance (the binomial's tail)."""
    from controller.report.analysis.nulls import binom_sf

    k = np.asarray(k, dtype=float)
    n = np.asarray(n, dtype=float)
    if k.ndim == 1 and k.shape == n.shape and len(k) > 1024 and bool((n >= 0).all()) and bool((k >= 0).all()):
        # many groups (one per module/key), few distinct (k, n): each pair's probability once
        # (scipy evaluates element by element: the same bits as over every group)
        width = int(n.max()) + 1
        if (int(k.max()) + 1) * width <= 2**18:  # a table of every (k, n) pair
            ki, ni = k.astype(np.int64), n.astype(np.int64)
            if np.array_equal(ki, k) and np.array_equal(ni, n):  # whole numbers (counts)
                code = ki * width + ni
                pairs = np.flatnonzero(np.bincount(code))
                table = np.zeros(int(pairs[-1]) + 1)
                kp, np_ = (pairs // width).astype(float), (pairs % width).astype(float)
                table[pairs] = np.where(np_ > 0, binom_sf(kp - 1, np_, 0.5), 1.0)
                return np.take(table, code)
    return np.where(n > 0, binom_sf(k - 1, n, 0.5), 1.0)


def wilcoxon_groups(cells: pd.DataFrame, index: pd.MultiIndex, column: str = "d") -> np.ndarray:
    """One-sided Wilcoxon signed-rank p (in the direction of the median) of each (key, metric)
    group's cell figures (``column``) against 0 (groups: ``index``, sorted), one scipy call per group size
    (vectorised along the groups); each group's values in the order of ``cells``."""

    at = index.get_indexer(pd.MultiIndex.from_arrays([cells["model_key"], cells["metric"]]))
    order = np.argsort(at, kind="stable")
    sizes = np.bincount(at, minlength=len(index))
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    d = cells[column].to_numpy(dtype=float)[order]
    p = np.ones(len(index))
    for n in sorted(set(sizes.tolist())):
        if n < 2:
            continue
        groups = np.flatnonzero(sizes == n)
        vals = d[starts[groups][:, None] + np.arange(n)]
        nonzero = np.abs(vals).max(axis=1) > 1e-12
        res = np.ones(len(vals))
        # one-sided, in the direction of the group's median
        if nonzero.any():
            v = vals[nonzero]
            res[nonzero] = _signed_rank_p(v)
        p[groups] = res
    return p


def _signed_rank_p(v: np.ndarray) -> np.ndarray:
    """One-sided signed-rank p of each row of ``v`` in the direction of its median. Rows without ties or zeros:
    scipy's default (exact up to 50 values); rows with them: the normal approximation with the tie correction,
    where scipy's default is a permutation test (~1 s a row: a key's energy figure, the same on every profile,
    made a followed bisection spend most of a core in it)."""
    from controller.report.analysis.nulls import wilcoxon_p

    mag = np.sort(np.abs(v), axis=1)
    tied = (mag[:, 0] <= 1e-12) | (np.diff(mag, axis=1) <= 1e-12 * np.maximum(mag[:, 1:], 1e-300)).any(axis=1)
    out = np.ones(len(v))
    for rows, method in ((~tied, "auto"), (tied, "approx")):
        if rows.any():
            w = v[rows]
            up = wilcoxon_p(w, "greater", exact=method == "auto")
            down = wilcoxon_p(w, "less", exact=method == "auto")
            out[rows] = np.where(np.median(w, axis=1) >= 0, up, down)
    return out


def median_interval_ranks(n: Any, level: float = 0.95) -> np.ndarray:
    """Per group size n: the 1-based rank k whose order statistics [x_(k), x_(n+1-k)] are a distribution-free
    interval of the median with coverage >= ``level`` (a sign test inverted: the largest k with
    P(Binomial(n, 1/2) < k) <= (1 - level) / 2); 0 where no such interval exists (n < 6 at 95 %)."""
    from controller.report.analysis.nulls import binom_cdf

    n = np.asarray(n, dtype=np.int64)
    out = np.zeros(len(n), dtype=np.int64)
    for size in sorted(set(n.tolist())):
        if size < 1:
            continue
        cdf = binom_cdf(np.arange(size), size, 0.5)  # P(X <= j), j = 0..n-1
        ok = np.flatnonzero(cdf <= (1 - level) / 2)  # P(X < k) = cdf[k - 1] <= alpha / 2
        out[n == size] = int(ok[-1]) + 1 if len(ok) else 0
    return out


def median_intervals(values: np.ndarray, groups: np.ndarray, count: int, level: float = 0.95
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Per group code 0..count-1 of ``values``: the distribution-free interval of the median (NaN where none)."""
    order = np.lexsort((values, groups))
    v = values[order]
    sizes = np.bincount(groups, minlength=count)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    k = median_interval_ranks(sizes, level)
    has = k > 0
    lo, hi = np.full(count, np.nan), np.full(count, np.nan)
    lo[has] = v[(starts + k - 1)[has]]
    hi[has] = v[(starts + sizes - k)[has]]
    return lo, hi


# groups of more values: the median and its interval (n (n + 1) / 2 Walsh averages is enough)
HL_MAX = 2000
# the signed-rank statistic's exact null distribution up to this n, its normal limit above
_EXACT_UP_TO = 200


def signed_rank_k(n: int, level: float = 0.95) -> int:
    """The 1-based rank k of the sorted Walsh averages whose [W_(k), W_(N+1-k)] (N = n (n + 1) / 2) is the
    signed-rank test's interval of the centre with coverage >= ``level``: the largest k with P(T < k) <=
    (1 - level) / 2 under the null (exact up to n = 200, the normal approximation above); 0 where none (n < 6)."""
    from controller.report.analysis.nulls import norm_ppf

    if n < 1:
        return 0
    alpha = (1 - level) / 2
    if n > _EXACT_UP_TO:
        mean, sd = n * (n + 1) / 4, math.sqrt(n * (n + 1) * (2 * n + 1) / 24)
        return max(0, int(math.floor(mean - norm_ppf(1 - alpha) * sd + 0.5)))
    counts = np.zeros(n * (n + 1) // 2 + 1)
    counts[0] = 1.0
    # the number of rank subsets of each sum
    for r in range(1, n + 1):
        counts[r:] = counts[r:] + counts[:-r].copy()
    cdf = np.cumsum(counts) / 2.0**n
    ok = np.flatnonzero(cdf <= alpha)  # P(T <= j) = cdf[j]; P(T < k) = cdf[k - 1]
    return int(ok[-1]) + 1 if len(ok) else 0


def hodges_lehmann_groups(values: np.ndarray, groups: np.ndarray, count: int, level: float = 0.95
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per group code 0..count-1 of ``values`` (no NaN): the Hodges-Lehmann centre (the median of the Walsh
    averages (x_i + x_j) / 2, i <= j) and its distribution-free interval (the Walsh averages the
    signed-rank test does not reject; NaN where none). A group of more than :data:`HL_MAX` values: its median
    and the median's interval."""
    centre, lo, hi = np.full(count, np.nan), np.full(count, np.nan), np.full(count, np.nan)
    order = np.lexsort((values, groups))
    v = values[order]
    sizes = np.bincount(groups, minlength=count)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    big = sizes > HL_MAX
    if big.any():
        m_lo, m_hi = median_intervals(values, groups, count, level)
        lo[big], hi[big] = m_lo[big], m_hi[big]
    ks: dict[int, int] = {}
    for i in np.flatnonzero(sizes).tolist():
        x = v[starts[i]:starts[i] + sizes[i]]
        if big[i]:
            centre[i] = float(np.median(x))
            continue
        a, b = np.triu_indices(len(x))
        w = np.sort((x[a] + x[b]) / 2)
        centre[i] = float(np.median(w))
        k = ks.setdefault(len(x), signed_rank_k(len(x), level))
        if k:
            lo[i], hi[i] = w[k - 1], w[len(w) - k]
    return centre, lo, hi


def window_t_p(x: np.ndarray) -> float:
    """One-sided p-value (in the median's direction, as the signed-rank tests) of a one-sample t-test of the
    windows' changes ``x`` against zero: energy, one figure per benchmark window (fewer than 3 windows: 1.0, no
    test; identical windows: 0.0 for a change, 1.0 for none)."""
    from controller.report.analysis.nulls import ttest_1samp_p

    if len(x) < 3:
        return 1.0
    if float(np.std(x)) == 0.0:
        return 0.0 if float(x[0]) != 0.0 else 1.0
    side = "greater" if float(np.median(x)) > 0 else "less"
    return ttest_1samp_p(x, side)


# fewer windows or starts: no interval of their change (ADR 0040)
MIN_WINDOWS_FOR_INTERVAL = 4


def window_interval(x: np.ndarray, level: float = 0.95) -> tuple[float, float] | None:
    """The t-interval (``level``, two-sided) of the mean of the windows' changes ``x`` (log units; one per module's
    window or start, the figures :func:`window_t_p` tests): None below :data:`MIN_WINDOWS_FOR_INTERVAL` windows, and
    where they do not spread at all (identical figures say nothing of the noise: no zero-width interval)."""
    from controller.report.analysis.nulls import t_ppf

    x = np.asarray(x, dtype=float)
    x = x[~np.isnan(x)]
    if len(x) < MIN_WINDOWS_FOR_INTERVAL:
        return None
    sd = float(np.std(x, ddof=1))
    if sd == 0.0:
        return None
    half = t_ppf(0.5 + level / 2, len(x) - 1) * sd / math.sqrt(len(x))
    mean = float(np.mean(x))
    return mean - half, mean + half
