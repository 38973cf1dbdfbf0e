"""The report's null distributions from scipy.special (:mod:`controller.report.analysis.nulls`) give the very
floats of scipy.stats (bit for bit) on many inputs: every exact Wilcoxon size, ties, zeros, large samples."""

from __future__ import annotations

import numpy as np
from scipy import stats

from controller.report.analysis import nulls


def _same(a: object, b: object) -> None:
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    assert a.shape == b.shape
    assert np.array_equal(a, b, equal_nan=True), (a[a != b], b[a != b])


def test_binomial_tails_equal_scipy() -> None:
    k = np.array([-3.0, -1, 0, 1, 2, 5, 7.5, 9, 10, 11, 40, np.nan, np.inf, -np.inf])
    for n in (0, 1, 2, 9, 10, 37, 400):
        _same(nulls.binom_sf(k, n, 0.5), stats.binom.sf(k, n, 0.5))
        _same(nulls.binom_cdf(k, n, 0.5), stats.binom.cdf(k, n, 0.5))
    nn = np.array([0, 3, 3, 8, 12, 2.5, -1, 60])
    kk = np.array([0, 1, 3, 4, 6, 1, 0, 45])
    _same(nulls.binom_sf(kk - 1, nn, 0.5), stats.binom.sf(kk - 1, nn, 0.5))
    _same(nulls.binom_cdf(kk, nn, 0.5), stats.binom.cdf(kk, nn, 0.5))
    assert nulls.binom_sf(2.0, 5.0, 0.5) == stats.binom.sf(2.0, 5.0, 0.5)


def test_normal_and_student_equal_scipy() -> None:
    rng = np.random.default_rng(3)
    for x in [0.0, -0.0, 1e-300, 0.5, 1.96, 8.3, 40.0, -2.0, float("inf"), float("nan"), *rng.normal(0, 3, 200)]:
        _same(nulls.norm_sf(float(x)), stats.norm.sf(float(x)))
    for q in (1e-12, 0.025, 0.5, 0.975, 0.999999):
        assert nulls.norm_ppf(q) == stats.norm.ppf(q)
    for n in (3, 4, 7, 30, 200):
        for scale in (1e-9, 0.02, 5.0):
            x = rng.normal(0.01, scale, n)
            for side in ("greater", "less"):
                _same(nulls.ttest_1samp_p(x, side), stats.ttest_1samp(x, 0.0, alternative=side).pvalue)
    x = np.array([0.1, 0.1, 0.1, 0.2])
    _same(nulls.ttest_1samp_p(x, "less"), stats.ttest_1samp(x, 0.0, alternative="less").pvalue)


def _scipy_w(d: np.ndarray, side: str, exact: bool) -> np.ndarray:
    return stats.wilcoxon(d, axis=1, zero_method="zsplit", alternative=side,
                          method="auto" if exact else "approx").pvalue


def test_wilcoxon_exact_sizes_equal_scipy() -> None:
    """No ties nor zeros (the report's exact rows): every size 2..60 (exact up to 50, normal above)."""
    rng = np.random.default_rng(7)
    for n in range(2, 61):
        d = rng.normal(0.0, 0.03, (6, n)) + rng.normal(0, 0.02, (6, 1))
        for side in ("greater", "less"):
            _same(nulls.wilcoxon_p(d, side, exact=True), _scipy_w(d, side, True))


def test_wilcoxon_with_ties_and_zeros_equal_scipy() -> None:
    """The report's tied rows (method "approx"): ties, zeros, rows all one value, all zero."""
    rng = np.random.default_rng(11)
    for n in (2, 3, 5, 8, 13, 14, 30, 51, 90):
        d = np.round(rng.normal(0.0, 0.03, (30, n)), 2)
        d[0] = 0.0
        d[1] = 0.05
        d[2, : n // 2] = 0.0
        for side in ("greater", "less"):
            _same(nulls.wilcoxon_p(d, side, exact=False), _scipy_w(d, side, False))


def test_wilcoxon_nan_rows_go_to_scipy() -> None:
    d = np.array([[0.1, -0.2, np.nan, 0.3, 0.4], [0.1, 0.2, 0.3, 0.5, -0.05]])
    for side in ("greater", "less"):
        _same(nulls.wilcoxon_p(d, side, exact=True), _scipy_w(d, side, True))
