"""analyse_many (every series at once) against analyse_series (one at a time): the same Detections, to the bit."""

from __future__ import annotations

import numpy as np
import pytest

from controller.report.analysis import changepoints_batch
from controller.report.analysis.changepoints import (
    PERMUTATION_SEED,
    DetectorSettings,
    SeriesError,
    Shuffles,
    _permutation_p,
    analyse_series,
    permutation_count,
)
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
    assert sum(len(d.change_points) for d in found) == 28
    assert sum(len(d.outliers) for d in found) == 185


def test_many_series_of_one_length_as_a_history_has_give_each_ones_detection() -> None:
    """100 releases each, mostly without a change (where the pruning ends with none): one 2-D array."""
    found = _same([_series(10_000 + seed, n=100) for seed in range(30)], DetectorSettings())
    assert [len(d.change_points) for d in found].count(0) == 20


@pytest.mark.parametrize("settings", [
    DetectorSettings(min_magnitude=0.0, max_pvalue=0.05, permutations=199),  # many tests pass, few stop early
    DetectorSettings(outlier_sigmas=0.0, min_segment=2, permutations=99, max_pvalue=0.2),
    DetectorSettings(min_magnitude=0.1, max_pvalue=0.01, min_segment=4, outlier_sigmas=2.0, permutations=499),
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
        analyse_many([[[1.0, 2.0]]])


def test_shuffles_drawn_in_pieces_are_the_generators_shuffles_of_the_values() -> None:
    """The permutation test's shuffles as indices, drawn as asked for, are what shuffling the values gave."""
    x = np.random.default_rng(3).standard_normal(37)
    old = np.random.default_rng(PERMUTATION_SEED).permuted(np.broadcast_to(x, (1999, 37)), axis=1)
    pieces = Shuffles(37, 1999)
    drawn = np.concatenate([pieces.rows(a, b) for a, b in ((0, 1), (1, 128), (128, 129), (129, 1999))])
    assert (x[drawn] == old).all()
    assert (x[Shuffles(37, 1999).rows(0, 1999)] == old).all()


def test_a_count_that_may_stop_stops_once_enough_shuffles_beat_the_split() -> None:
    x = np.random.default_rng(5).standard_normal(40)  # no change: most shuffles split as well
    whole = permutation_count(x, 20, 3, Shuffles(40, 1999))
    assert (1 + whole[0]) / 2000 == _permutation_p(x, 20, 3, 1999) and whole[1] == 1999
    beaten, looked = permutation_count(x, 20, 3, Shuffles(40, 1999), stop=4)
    assert beaten >= 4 and looked == 128
    assert permutation_count(x, 20, 3, Shuffles(40, 1999), beaten=beaten, done=looked) == whole
