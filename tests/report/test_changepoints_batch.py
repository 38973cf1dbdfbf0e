"""analyse_many (every series at once) against analyse_series (one at a time): the same Detections, to the bit."""

from __future__ import annotations

import numpy as np
import pytest

from controller.report.analysis import changepoints_batch
from controller.report.analysis.changepoints import DetectorSettings, SeriesError, analyse_series
from controller.report.analysis.changepoints_batch import analyse_many


def _series(seed: int, n: int | None = None) -> np.ndarray:
    """A random series: noise only, one to three steps, outliers, steps and outliers, ties and a constant stretch,
    or a short one (fewer values than a split or a Hampel window needs)."""
    rng = np.random.default_rng(seed)
    kind = seed % 6
    if n is None:
        n = int(rng.choice([8, 12, 20, 30, 45, 60, 100])) if kind != 5 else int(rng.integers(1, 8))
    x = 100 * (1 + 0.02 * rng.standard_normal(n))
    if kind in (1, 2) and n > 6:
        for _ in range(int(rng.integers(1, 4))):
            x[int(rng.integers(1, n)):] *= 1 + rng.choice([-1, 1]) * rng.uniform(0.02, 0.2)
    if kind in (2, 3) and n > 2:
        idx = rng.choice(np.arange(1, n - 1), size=min(int(rng.integers(1, max(2, n // 8))), n - 2), replace=False)
        x[idx] *= 1 + rng.choice([-0.3, 0.3], size=len(idx))
    if kind == 4:
        x = np.round(x / 2) * 2  # ties
        if n > 10:
            x[n // 2:] = x[n // 2]  # a constant stretch
    return x


def _same(series: list[np.ndarray], s: DetectorSettings) -> list:
    many = analyse_many(series, s)
    one = [analyse_series(x, s) for x in series]
    assert len(many) == len(one)
    for i, (a, b) in enumerate(zip(many, one, strict=True)):
        assert a == b, (i, a, b)
    return one


def test_many_random_series_of_mixed_lengths_give_each_ones_detection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(changepoints_batch, "ROWS", 4)  # a length's series a few at a time too, as a long history's
    found = _same([_series(seed) for seed in range(70)], DetectorSettings())
    assert sum(len(d.change_points) for d in found) == 34
    assert sum(len(d.outliers) for d in found) == 170


def test_many_series_of_one_length_as_a_history_has_give_each_ones_detection() -> None:
    """100 releases each, mostly without a change (where the pruning ends with none): one 2-D array."""
    found = _same([_series(10_000 + seed, n=100) for seed in range(30)], DetectorSettings())
    assert [len(d.change_points) for d in found].count(0) == 18


@pytest.mark.parametrize("settings", [
    DetectorSettings(min_magnitude=0.0, max_pvalue=0.05),  # many tests pass
    DetectorSettings(outlier_sigmas=0.0, min_segment=2, max_pvalue=0.2),
    DetectorSettings(min_magnitude=0.1, max_pvalue=0.01, min_segment=4, outlier_sigmas=2.0),
    DetectorSettings(max_pvalue=1e-6),
])
def test_other_settings_give_each_ones_detection(settings: DetectorSettings) -> None:
    found = _same([_series(20_000 + seed) for seed in range(60)], settings)
    assert sum(len(d.change_points) for d in found) > 10


def test_constant_series_and_a_single_step_give_each_ones_detection() -> None:
    step = np.r_[np.full(20, 100.0), np.full(20, 90.0)]
    found = _same([np.full(30, 5.0), np.zeros(30), step, step + np.arange(40) % 2, np.array([1.0, 2.0])],
                  DetectorSettings())
    assert [len(d.change_points) for d in found] == [0, 0, 1, 1, 0]


def test_no_series_and_a_bad_series_are_as_one_at_a_time() -> None:
    assert analyse_many([]) == []
    with pytest.raises(SeriesError, match="value 2 of the series is not a finite number"):
        analyse_many([[1.0, 2.0, 3.0], [1.0, 2.0, float("nan")]])
    with pytest.raises(SeriesError, match="one-dimensional"):
        analyse_many([[[1.0, 2.0]]])  # type: ignore[list-item]  # a series of lists is the point


def test_drifts_give_each_ones_detection() -> None:
    """Steady drifts (one drift each), drifts between two levels, and steps in one direction (a staircase that may
    or may not be a drift): reported by the per-series code in both paths."""
    rng = np.random.default_rng(11)
    series = []
    for i in range(24):
        n = int(rng.choice([20, 40, 60]))
        t = np.arange(n)
        if i % 3 == 0:
            x = 100 * (1 + rng.uniform(0.003, 0.01) * t)
        elif i % 3 == 1:
            a, b = sorted(rng.choice(np.arange(3, n - 3), size=2, replace=False))
            x = 100 * (1 - 0.1 * np.clip((t - a) / max(b - a, 1), 0, 1))
        else:
            x = 100 * (1 + 0.06 * (t >= n // 3) + 0.06 * (t >= 2 * n // 3))
        series.append(x * (1 + 0.01 * rng.standard_normal(n)))
    found = _same(series, DetectorSettings())
    kinds = [c.kind for d in found for c in d.change_points]
    assert kinds.count("drift") >= 8 and kinds.count("step") >= 8
