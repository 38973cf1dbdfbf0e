"""The null distributions of the report's tests from ``scipy.special``: the same numbers as ``scipy.stats``, bit
for bit, without importing it (``scipy.stats`` parses every docstring as it loads: the import costs more than the
analysis of 100 k rows; ADR 0054 has the figures).

Each function below follows the ``scipy.stats`` code path it stands for (scipy 1.17), operation for operation, so
the floats are the same; the binomial tails call the Boost functions ``scipy.stats.binom`` calls, which are private
(``scipy.special._ufuncs``). ``tests/report/test_nulls.py`` compares every function with ``scipy.stats`` on many
inputs (ties, zeros, every exact size). Inputs that path does not take (NaN in a Wilcoxon row) go to ``scipy.stats``
itself.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np
from scipy import special
from scipy.special import _ufuncs

# scipy's method="auto": the exact null distribution up to 50 values, the normal above
WILCOXON_EXACT_UP_TO = 50


def _binom(fn: Any, k: Any, n: Any, p: float, *, sf: bool) -> Any:
    """``scipy.stats.binom.sf`` / ``.cdf`` (``rv_discrete``): the support checks, then the Boost function."""
    k, n = np.asarray(k), np.asarray(n)
    k, n = np.broadcast_arrays(k, n)
    ok = (n >= 0) & (n == np.floor(n)) & (0 <= p <= 1)
    inside = ok & (k >= 0) & (k < n) & np.isfinite(k)
    out = np.zeros(k.shape, dtype=float)
    out[(((k < 0) | np.isneginf(k)) if sf else (k >= n)) & ok] = 1.0
    out[~ok | np.isnan(k)] = np.nan
    if inside.any():
        out[inside] = np.clip(fn(np.floor(k[inside]), n[inside], p), 0, 1)
    return out[()] if out.ndim == 0 else out


def binom_sf(k: Any, n: Any, p: float) -> Any:
    """``scipy.stats.binom.sf(k, n, p)``: P(X > k)."""
    return _binom(_ufuncs._binom_sf, k, n, p, sf=True)


def binom_cdf(k: Any, n: Any, p: float) -> Any:
    """``scipy.stats.binom.cdf(k, n, p)``: P(X <= k)."""
    return _binom(_ufuncs._binom_cdf, k, n, p, sf=False)


def norm_sf(x: float) -> float:
    """``scipy.stats.norm.sf(x)`` of a number: ``ndtr(-x)`` (NaN stays NaN)."""
    return float(special.ndtr(-x))


def norm_ppf(q: float) -> float:
    """``scipy.stats.norm.ppf(q)`` for 0 < q < 1: ``ndtri(q)``."""
    if not 0 < q < 1:
        raise ValueError(f"norm_ppf: q must lie strictly between 0 and 1, not {q}")
    return float(special.ndtri(q))


def t_sf(t: float, df: float) -> float:
    """``scipy.stats.t.sf(t, df)``: P(T > t) for Student's t with ``df`` degrees of freedom."""
    return float(special.stdtr(df, -t))


def t_ppf(q: float, df: float) -> float:
    """``scipy.stats.t.ppf(q, df)`` for 0 < q < 1: ``stdtrit(df, q)``."""
    if not 0 < q < 1:
        raise ValueError(f"t_ppf: q must lie strictly between 0 and 1, not {q}")
    return float(special.stdtrit(df, q))


def ttest_1samp_p(x: np.ndarray, side: str) -> float:
    """``scipy.stats.ttest_1samp(x, 0.0, alternative=side).pvalue`` of a 1-d float array (``side``: 'greater'
    or 'less'): the mean, the variance as scipy's ``_var`` takes it (ddof 1), Student's t from ``stdtr``."""
    x = np.asarray(x, dtype=float)
    n = len(x)
    mean = np.mean(x, axis=0)
    d = mean - np.asarray(0.0)
    a_zero_mean = x - np.mean(x, axis=0, keepdims=True)
    var = np.mean(a_zero_mean**2, axis=0)
    nf = np.asarray(n, dtype=float)
    var *= nf / (nf - 1)
    denom = np.sqrt(var / n)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.divide(d, denom)
    df = np.asarray(n - 1, dtype=t.dtype)
    return float(special.stdtr(df, -t) if side == "greater" else special.stdtr(df, t))


@cache
def _wilcoxon_pmf(n: int) -> np.ndarray:
    """scipy's ``_get_wilcoxon_distr(n)``: P(R+ = r), r = 0..n (n + 1) / 2, with no ties or zeros."""
    c = np.ones(1, dtype=np.float64)
    for k in range(1, n + 1):
        prev_c = c
        c = np.zeros(k * (k + 1) // 2 + 1, dtype=np.float64)
        m = len(prev_c)
        c[:m] = prev_c * 0.5
        c[-m:] += prev_c * 0.5
    return c


def _exact_sf(k: int, n: int) -> float:
    pmfs = _wilcoxon_pmf(n)
    return float(pmfs[k:].sum()) if k <= n * (n + 1) / 4 else float(1 - pmfs[:k - 1 + 1].sum())


def _exact_cdf(k: int, n: int) -> float:
    pmfs = _wilcoxon_pmf(n)
    return float(pmfs[:k + 1].sum()) if k <= n * (n + 1) / 4 else float(1 - pmfs[k + 1:].sum())


def _ranks(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """scipy's ``_rankdata(a, 'average', return_ties=True)`` along the last axis of a 2-d array: the average
    ranks, and the tie counts (the count at each run's first sorted position, 0 elsewhere)."""
    rows, n = a.shape
    j = np.argsort(a, axis=-1, stable=True)
    y = np.take_along_axis(a, j, axis=-1)
    first = np.concatenate([np.ones((rows, 1), dtype=bool), y[:, :-1] != y[:, 1:]], axis=-1)
    indices = np.arange(a.size)[first.reshape(-1)]
    counts = np.diff(indices, append=np.asarray([a.size], dtype=indices.dtype))
    ordinal = np.broadcast_to(np.arange(1, n + 1, dtype=float), a.shape)
    ranks = np.repeat(ordinal[first] + (np.asarray(counts, dtype=float) - 1) / 2, counts).reshape(a.shape)
    out = np.empty_like(ranks)
    np.put_along_axis(out, j, ranks, axis=-1)
    t = np.zeros(a.shape, dtype=np.float64)
    t[first] = counts.astype(np.float64)
    return out, t


def wilcoxon_p(d: np.ndarray, alternative: str, *, exact: bool) -> np.ndarray:
    """``scipy.stats.wilcoxon(d, axis=1, zero_method="zsplit", alternative=alternative, method=M).pvalue`` of
    each row of a 2-d float array: M "auto" (``exact``) or "approx" (not). "auto" takes the exact null
    distribution where no row has a tie or a zero and rows have at most 50 values (else the normal one, but
    with ties or zeros and at most 13 values a permutation test, which is scipy's own: those go to scipy)."""
    d = np.asarray(d, dtype=float)
    if d.ndim != 2 or alternative not in ("greater", "less") or np.isnan(d).any() or d.shape[0] == 0:
        return _scipy_wilcoxon(d, alternative, exact)
    n = d.shape[-1]
    i_zeros = d == 0
    count = np.asarray(float(n))
    r, t = _ranks(np.abs(d))
    r_plus = np.sum((d > 0).astype(float) * r, axis=-1)
    has_ties = bool(np.any(t == 0))
    r_zero_2 = np.sum(i_zeros.astype(float) * r, axis=-1) / 2
    r_plus = r_plus + r_zero_2
    if exact and n <= WILCOXON_EXACT_UP_TO:
        if has_ties or bool(i_zeros.any()):
            # scipy's permutation test (n <= 13) or normal
            return _scipy_wilcoxon(d, alternative, exact)
        if alternative == "less":
            return np.array([_exact_cdf(int(k), n) for k in np.ceil(r_plus)], dtype=float)
        return np.array([_exact_sf(int(k), n) for k in np.floor(r_plus)], dtype=float)
    mn = count * (count + 1.0) * 0.25
    se = count * (count + 1.0) * (2.0 * count + 1.0)
    tie_correct = np.sum(t**3 - t, axis=-1)
    se = np.sqrt((se - tie_correct / 2) / 24)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = (r_plus - mn) / se
    return np.asarray(special.ndtr(-z) if alternative == "greater" else special.ndtr(z), dtype=float)


def _scipy_wilcoxon(d: np.ndarray, alternative: str, exact: bool) -> np.ndarray:
    # only for inputs the path above does not take
    from scipy import stats

    return np.asarray(stats.wilcoxon(d, axis=1, zero_method="zsplit", alternative=alternative,
                                     method="auto" if exact else "approx").pvalue, dtype=float)
