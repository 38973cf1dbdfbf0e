"""Groups: per-cell reductions from one sort agree with pandas' groupby (NaN skipped, groups absent)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from controller.report.analysis.groups import Groups, run_medians


@pytest.mark.parametrize("presorted", [False, True])
def test_groups_match_pandas(presorted: bool) -> None:
    rng = np.random.default_rng(7)
    n = 5_000
    codes = rng.integers(0, 40, n)
    codes[codes == 13] = 14  # an absent group
    if presorted:
        codes = np.sort(codes)
    x = rng.standard_normal((n, 3))
    x[rng.random((n, 3)) < 0.2] = np.nan
    x[codes == 7, 1] = np.nan  # a group whose column is all NaN
    g = Groups(codes)
    frame = pd.DataFrame(x).groupby(codes)
    assert list(g.present) == sorted(set(codes))
    np.testing.assert_allclose(g.median(x), frame.median().to_numpy(), rtol=0, atol=1e-12, equal_nan=True)
    lo, hi = g.middles([x[:, j] for j in range(3)])
    lower = frame.quantile(0.5, interpolation="lower").to_numpy()
    np.testing.assert_allclose(lo, lower, equal_nan=True)
    assert (np.nan_to_num(lo, nan=0) <= np.nan_to_num(hi, nan=0)).all()
    mn, mx = g.extremes(x)
    np.testing.assert_allclose(mn, frame.min().to_numpy(), equal_nan=True)
    np.testing.assert_allclose(mx, frame.max().to_numpy(), equal_nan=True)
    total, count = g.sums(x)
    np.testing.assert_allclose(total, frame.sum().to_numpy(), atol=1e-9)
    np.testing.assert_array_equal(count, frame.count().to_numpy())
    positive = pd.Series(x[:, 0] > 0).groupby(codes).sum().to_numpy()
    np.testing.assert_array_equal(g.counts([x[:, 0] > 0])[:, 0], positive)


def test_groups_of_nothing() -> None:
    g = Groups(np.zeros(0, dtype=np.int64))
    assert len(g) == 0
    lo, hi = g.middles(np.zeros((0, 2)))
    assert lo.shape == (0, 2) and hi.shape == (0, 2)
    assert g.extremes(np.zeros((0, 2)))[0].shape == (0, 2)
    assert g.sums(np.zeros((0, 2)))[1].shape == (0, 2)


@pytest.mark.parametrize("sizes", [[7] * 50, [1, 2, 3, 4, 5, 6, 30, 31] * 9])
def test_run_medians_equal_pandas_to_the_bit(sizes: list[int]) -> None:
    """Contiguous runs of one or several lengths, codes not in increasing order: the same values
    and order as pandas' group median (odd and even lengths, ties), a zero median as +0.0 (pandas
    and numpy's SIMD partition may land on either of two equal zeros, by CPU)."""
    rng = np.random.default_rng(3)
    codes = np.repeat(rng.permutation(len(sizes)) * 3, sizes)
    values = np.round(rng.standard_normal(len(codes)), 1)  # ties
    got = run_medians(values, codes)
    assert got is not None
    want = pd.Series(values).groupby(codes).median()
    np.testing.assert_array_equal(got[0], want.index.to_numpy())
    assert got[1].tobytes() == (want.to_numpy() + 0.0).tobytes()
    assert not np.signbit(got[1][got[1] == 0]).any()


def test_run_medians_declines_what_it_cannot_take() -> None:
    values = np.arange(6.0)
    assert run_medians(values, np.array([0, 0, 1, 1, 0, 0])) is None  # a code in two runs
    assert run_medians(np.array([1.0, np.nan]), np.array([0, 0])) is None  # NaN: pandas skips it
    assert run_medians(values, np.array([0, 1, 1, 2, 2, 2]), max_sizes=2) is None
    assert run_medians(values[:0], values[:0].astype(np.int64)) is None


@pytest.mark.parametrize("modules", [100, 40_000, 5_000_000])
def test_rows_in_module_order_past_16_bit_codes(modules: int) -> None:
    """The module order of the outlier statistics is numpy's stable argsort, also past 32,767
    modules (two 16-bit radix passes) and past 2**30 codes."""
    from controller.report.analysis.groups import by_module

    mod = np.random.default_rng(1).integers(0, modules, 50_000).astype(np.int32)
    np.testing.assert_array_equal(by_module(mod), np.argsort(mod, kind="stable"))
    assert by_module(np.sort(mod)) is None


def test_sign_p_once_per_pair_equals_scipy_per_group() -> None:
    """The sign test over many groups takes each distinct (k, n) once: the same bits as scipy over
    every group (n = 0 included); counts that are not whole numbers take scipy's path."""
    from scipy import stats

    from controller.report.analysis.stats import sign_p

    rng = np.random.default_rng(7)
    n = rng.integers(0, 60, size=5000).astype(float)
    k = np.floor(rng.random(5000) * (n + 1))
    want = np.where(n > 0, stats.binom.sf(k - 1, n, 0.5), 1.0)
    assert sign_p(k, n).tobytes() == want.tobytes()
    half = k + 0.5
    assert sign_p(half, n).tobytes() == np.where(n > 0, stats.binom.sf(half - 1, n, 0.5), 1.0).tobytes()


def test_group_median_of_few_values_equals_pandas_to_the_bit() -> None:
    """The (key, metric) medians of fleet_compare (Groups.median): odd and even groups, NaN skipped,
    a group of NaN only, groups out of order; the same bits as pandas' group median."""
    rng = np.random.default_rng(11)
    at = rng.integers(0, 40, size=600)
    at[:3] = 40  # a group of NaN only
    values = np.exp(rng.standard_normal(600))
    values[rng.random(600) < 0.1] = np.nan
    values[:3] = np.nan
    want = pd.Series(values).groupby(at).median()
    assert Groups(at).median(values)[:, 0].tobytes() == want.to_numpy().tobytes()


@pytest.mark.parametrize("kind", ["smooth", "ties", "skewed"])
def test_large_groups_middles_from_a_window_equal_a_partition(kind: str) -> None:
    """Groups of 2,048 values and more take their middles from a window around a sample's: the
    same values as a partition (NaN skipped, ties, a skewed group whose window check fails)."""
    rng = np.random.default_rng(5)
    sizes = [2048, 2049, 5000, 10870, 3000]
    codes = np.repeat(np.arange(len(sizes)), sizes)
    values = rng.standard_normal(len(codes))
    if kind == "ties":
        values = np.round(values, 1)
    if kind == "skewed":  # sorted halves: the every-16th sample is not a fair one
        values = np.concatenate([np.sort(values[codes == c]) for c in range(len(sizes))])
    values[rng.random(len(codes)) < 0.05] = np.nan
    lo, hi = Groups(codes).middles([values])
    for c in range(len(sizes)):
        v = values[codes == c]
        v = v[~np.isnan(v)]
        a, b = (len(v) - 1) // 2, len(v) // 2
        part = np.partition(v, (a, b))
        assert (lo[c, 0], hi[c, 0]) == (part[a], part[b])


@pytest.mark.parametrize("rows", [1000, 70_000])
def test_packed_bincount_equals_one_bincount_per_weight(rows: int) -> None:
    """Outlier counts (0..4 a row) summed per module/key three to a float64: the same sums as a
    bincount per weight; a code with 2**16 / 4 rows or more takes one bincount per weight."""
    from controller.report.analysis.groups import packed_bincount

    rng = np.random.default_rng(2)
    codes = rng.integers(0, 50, size=rows) if rows < 5000 else np.zeros(rows, dtype=np.int64)
    weights = [rng.integers(0, 5, size=rows).astype(float) for _ in range(5)]
    want = np.column_stack([np.bincount(codes, weights=w, minlength=60) for w in weights])
    assert packed_bincount(codes, weights, 60, 4).tobytes() == want.tobytes()
