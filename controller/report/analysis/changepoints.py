"""Change points of one series (values in release order): where its level moved, by how much, how sure.

Pure numpy/scipy, no I/O; the series over the run history are built by :mod:`controller.report.trend`.
The method (docs/adr/0017-change-point-detector.md, measured by ``bench/changepoints.py``):

* **outliers**: a value further than ``outlier_sigmas`` robust standard deviations from both the median of
  the three releases before it and that of the three after it (:func:`hampel`) is replaced by their mean and
  named in the result: one bad run does not move a level, nor inflate the variance the size's interval
  divides by;
* **search**: binary segmentation on the squared-error cost, every split kept as a candidate (the split of
  a segment that most reduces the sum of squares about the two sides' means, each side at least
  ``min_segment`` values; then the same in each side, down to segments too short to split): no test
  stops the search, so a change that a later one hides from the first split (a regression fixed
  later) is still a candidate;
* **pruning**: each candidate is judged against its neighbours only (the values between the candidate
  before it and the one after it, as Apache Otava re-tests its change points), and the weakest one that
  fails is dropped and the rest judged again, until every one passes: first by Welch's t-test (cheap),
  then by a permutation test (``p <= max_pvalue``: how often a seeded shuffle of the stretch has a split
  anywhere that reduces the squared error as much, E-divisive's test on this cost), and ``|size| >=
  min_magnitude``. A level shift is therefore one change point, whatever follows it;
* **size**: ``mean(after) / mean(before) - 1`` of the two adjacent segments, with the 95 % Welch t
  interval of the difference of their means divided by ``mean(before)`` (the level before taken
  as known: the interval is a little narrow when the segment before is short);
* **in force**: the level of the series' last segment is still beyond ``min_magnitude`` from the
  level before the change point, in the change's direction (a regression since reverted is not).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cache
from typing import Any, Union

import numpy as np

from controller.report.model import ReportError

DEFAULT_MIN_MAGNITUDE = 0.03
DEFAULT_MAX_PVALUE = 0.002
DEFAULT_MIN_SEGMENT = 3
DEFAULT_OUTLIER_SIGMAS = 3.0
DEFAULT_PERMUTATIONS = 1999
PERMUTATION_SEED = 20260917  # the shuffles of the permutation test: fixed, so a series' p-value is reproducible
HAMPEL_HALF_WINDOW = 3  # an outlier is far from the median of the 3 values before it and of the 3 after it
# the spread of a value's residual from the mean of those two medians, in noise units: sqrt(1 + var(median of 3) / 2)
RESIDUAL_SPREAD = math.sqrt(1 + 0.4487 / 2)


Values = Union[Sequence[float], "np.ndarray"]  # a series: floats in release order


class SeriesError(ReportError, ValueError):
    """A series the detector cannot take (non-finite values, a bad setting)."""


@dataclass(frozen=True)
class DetectorSettings:
    """``min_magnitude``: the smallest relative change of level reported (0.05 = 5 %); ``max_pvalue``: the
    largest permutation p-value of a change point; ``min_segment``: the fewest values on
    either side of one."""

    min_magnitude: float = DEFAULT_MIN_MAGNITUDE
    max_pvalue: float = DEFAULT_MAX_PVALUE
    min_segment: int = DEFAULT_MIN_SEGMENT
    outlier_sigmas: float = DEFAULT_OUTLIER_SIGMAS  # 0: no value taken as an outlier
    permutations: int = DEFAULT_PERMUTATIONS  # shuffles of the permutation test (p-values from 1 / (1 + this))

    def __post_init__(self) -> None:
        if not 0 <= self.min_magnitude < 1:
            raise SeriesError(f"min_magnitude must be a fraction in [0, 1), got {self.min_magnitude}")
        if not 0 < self.max_pvalue <= 1:
            raise SeriesError(f"max_pvalue must be in (0, 1], got {self.max_pvalue}")
        if self.min_segment < 2:
            raise SeriesError(f"min_segment must be at least 2, got {self.min_segment}")
        if self.permutations < 19:
            raise SeriesError(f"permutations must be at least 19, got {self.permutations}")
        if self.outlier_sigmas < 0:
            raise SeriesError(f"outlier_sigmas must be 0 (off) or positive, got {self.outlier_sigmas}")


@dataclass(frozen=True)
class ChangePoint:
    """One change of level. ``index``: the first value after it (the first release of the new level);
    ``size``: relative change of the level after vs before, ``ci_low``/``ci_high`` its 95 % interval;
    ``p_value``: the permutation test of the stretch between the change points around it (how often a
    shuffle of it splits as well, anywhere); ``in_force``: the series still ends at the new level."""

    index: int
    size: float
    ci_low: float
    ci_high: float
    p_value: float
    before: float  # mean of the segment before
    after: float  # mean of the segment after
    n_before: int
    n_after: int
    in_force: bool


@dataclass(frozen=True)
class Detection:
    """The change points of one series, oldest first, and the values taken as outliers (their indices)."""

    change_points: tuple[ChangePoint, ...]
    outliers: tuple[int, ...]


@dataclass(frozen=True)
class _Test:
    size: float
    ci_low: float
    ci_high: float
    p_value: float
    before: float
    after: float


def _welch(a: np.ndarray, b: np.ndarray) -> _Test:
    return _welch_of(float(a.mean()), float(a.var(ddof=1)), len(a), float(b.mean()), float(b.var(ddof=1)), len(b))


@cache
def student_t() -> tuple[Any, Any]:
    """scipy.special's ``stdtr`` and ``stdtrit``: Student's t distribution function and its inverse."""
    # Student's t straight from scipy.special (what scipy.stats.t's sf and ppf compute, without the distribution
    # object's argument checks: ~100x faster a call, and pruning makes thousands of calls over a long history);
    # loaded at the first test, once (an import statement a call cost more than the test's arithmetic)
    from scipy.special import stdtr, stdtrit

    return stdtr, stdtrit


def _welch_of(ma: float, va: float, na: int, mb: float, vb: float, nb: int) -> _Test:
    """Welch's test from each side's mean, variance (ddof 1) and size, with the 95 % interval (the screening of
    candidates, which reads the p-value and the size only, is :func:`_screen_of`)."""
    stdtr, stdtrit = student_t()
    se2 = va / na + vb / nb
    diff = mb - ma
    scale = abs(ma) if ma else 1.0
    if se2 <= (1e-12 * scale) ** 2:  # both sides constant
        p = 0.0 if abs(diff) > 1e-12 * scale else 1.0
        half = 0.0
    else:
        df = se2**2 / ((va / na) ** 2 / (na - 1) + (vb / nb) ** 2 / (nb - 1))
        t = diff / math.sqrt(se2)
        p = float(2 * stdtr(df, -abs(t)))
        half = float(stdtrit(df, 0.975)) * math.sqrt(se2)
    size = diff / scale
    return _Test(size=size, ci_low=(diff - half) / scale, ci_high=(diff + half) / scale,
                 p_value=p, before=ma, after=mb)


def _gains(x: np.ndarray, m: int) -> np.ndarray:
    """The squared-error reduction of each split ``k = m .. n - m`` of each row of ``x`` (rows: series)."""
    n = x.shape[-1]
    k = np.arange(m, n - m + 1)
    c = np.cumsum(x, axis=-1)
    before = c[..., m - 1:n - m]  # the sums of the values before each split (k - 1 = m - 1 .. n - m - 1)
    gain = before / k  # the mean before
    right = c[..., -1:] - before
    right /= n - k  # the mean after
    gain -= right
    np.square(gain, out=gain)
    gain *= k * (n - k) / n  # (in place, as k (n - k) / n * (left - right) ** 2 rounds: a shuffle's 1,999 rows)
    return gain


def _best_split(x: np.ndarray, m: int) -> int | None:
    """The split of ``x`` (at least ``m`` values a side) that most reduces the squared error."""
    if len(x) < 2 * m:
        return None
    return m + int(np.argmax(_gains(x, m)))


def _permutation_p(x: np.ndarray, k: int, m: int, permutations: int) -> float:
    """How often a shuffle of ``x`` has a split (any, at least ``m`` a side) that reduces the squared error as
    much as the split at ``k`` does: the p-value of "no change in ``x``" (E-divisive's permutation test, on the
    squared-error cost). The shuffles are seeded: the same series gives the same p-value."""
    beaten, _ = permutation_count(x, k, m, Shuffles(len(x), permutations))
    return (1 + beaten) / (1 + permutations)


class Shuffles:
    """The seeded shuffles of the permutation test for stretches of ``n`` values, as indices (row ``i``: the
    ``i``-th shuffle), drawn as they are asked for: the generator's draws depend on the shape only, and it shuffles
    row after row, so ``x[rows(0, p)]`` is the shuffles of ``x`` itself, drawn in one piece or in several."""

    def __init__(self, n: int, permutations: int) -> None:
        self.n, self.permutations = n, permutations
        self._rng = np.random.default_rng(PERMUTATION_SEED)
        self._rows = np.empty((0, n), dtype=np.intp)

    def rows(self, start: int, stop: int) -> np.ndarray:
        if stop > len(self._rows):
            more = self._rng.permuted(np.broadcast_to(np.arange(self.n), (stop - len(self._rows), self.n)), axis=1)
            self._rows = np.concatenate((self._rows, more))
        return self._rows[start:stop]


FIRST_SHUFFLES = 128  # a count that may stop early looks at this many shuffles first, then at twice as many each time


def permutation_count(x: np.ndarray, k: int, m: int, shuffles: Shuffles, *, beaten: int = 0, done: int = 0,
                      stop: int | None = None, upto: int | None = None) -> tuple[int, int]:
    """Of the shuffles from ``done`` on (``beaten`` of the ones before beat the split): how many shuffles of ``x``
    beat the split at ``k`` (:func:`_permutation_p`), and how many were looked at: all, or, with ``stop``, as soon
    as ``stop`` beat it (looking at :data:`FIRST_SHUFFLES`, then at twice as many each round: the p-value is then
    known to be above ``stop / (1 + permutations)``, and a stretch without a change gets there in a few hundred);
    ``upto``: at most that many looked at."""
    observed = _gains(x, m)[k - m] * (1 - 1e-12)
    end = shuffles.permutations if upto is None else min(shuffles.permutations, upto)
    while done < end and (stop is None or beaten < stop):
        to = end if stop is None else min(end, max(FIRST_SHUFFLES, 2 * done))
        beaten += int((_gains(x[shuffles.rows(done, to)], m).max(axis=1) >= observed).sum())
        done = to
    return beaten, done


def _search(x: np.ndarray, lo: int, hi: int, s: DetectorSettings, found: list[int]) -> None:
    k = _best_split(x[lo:hi], s.min_segment)
    if k is None:
        return
    found.append(lo + k)
    _search(x, lo, lo + k, s, found)
    _search(x, lo + k, hi, s, found)


def stretch_bounds(n: int, cps: list[int], i: int) -> tuple[int, int]:
    """The stretch change point ``i`` of ``cps`` is judged over: from the one before it (else 0) to the one after
    it (else ``n``)."""
    return (cps[i - 1] if i > 0 else 0), (cps[i + 1] if i + 1 < len(cps) else n)


class Sums:
    """Prefix sums of a series (centred on its mean): the mean and variance of any stretch in O(1), for the
    screening of candidates (the tests reported are computed again from the values: :func:`_judge`)."""

    def __init__(self, x: np.ndarray) -> None:
        self.shift = float(x.mean())
        c = x - self.shift
        self.s1: list[float] = np.concatenate(([0.0], np.cumsum(c))).tolist()
        self.s2: list[float] = np.concatenate(([0.0], np.cumsum(c * c))).tolist()

    def mean_var(self, lo: int, hi: int) -> tuple[float, float]:
        n = hi - lo
        a, q = self.s1[hi] - self.s1[lo], self.s2[hi] - self.s2[lo]
        return self.shift + a / n, max(0.0, (q - a * a / n) / (n - 1)) if n > 1 else 0.0

    def judge(self, lo: int, k: int, hi: int, s: DetectorSettings) -> _Test:
        """:func:`_judge` of the split at ``k`` of ``lo .. hi``, from the sums."""
        (ma, va), (mb, vb) = self.mean_var(lo, k), self.mean_var(k, hi)
        if min(k - lo, hi - k) < s.min_segment:
            size = mb / ma - 1 if ma else 0.0
            return _Test(size=size, ci_low=size, ci_high=size, p_value=1.0, before=ma, after=mb)
        p, size = _screen_of(ma, va, k - lo, mb, vb, hi - k)
        return _Test(size=size, ci_low=math.nan, ci_high=math.nan, p_value=p, before=ma, after=mb)


def _screen_of(ma: float, va: float, na: int, mb: float, vb: float, nb: int) -> tuple[float, float]:
    """Welch's p and the size for the screening of candidates, as :func:`_welch_of` computes them but squares as
    products (``x * x``, correctly rounded; ``x ** 2`` of a float is the C library's ``pow``, which is not always):
    :mod:`controller.report.analysis.changepoints_batch` computes the same screens over many series at once with
    numpy's elementwise arithmetic and must come to the same bits."""
    stdtr, _ = student_t()
    se2 = va / na + vb / nb
    diff = mb - ma
    scale = abs(ma) if ma else 1.0
    tiny = 1e-12 * scale
    if se2 <= tiny * tiny:  # both sides constant
        p = 0.0 if abs(diff) > tiny else 1.0
    else:
        wa, wb = va / na, vb / nb
        df = se2 * se2 / (wa * wa / (na - 1) + wb * wb / (nb - 1))
        p = float(2 * stdtr(df, -abs(diff / math.sqrt(se2))))
    return p, diff / scale


def _judge(x: np.ndarray, cps: list[int], i: int, s: DetectorSettings) -> _Test:
    """Welch's test of change point ``i`` against its neighbours (a change point closer than ``min_segment``
    to a neighbour fails: p 1)."""
    lo, hi = stretch_bounds(len(x), cps, i)
    a, b = x[lo:cps[i]], x[cps[i]:hi]
    if min(len(a), len(b)) < s.min_segment:
        ma, mb = float(a.mean()), float(b.mean())
        size = mb / ma - 1 if ma else 0.0
        return _Test(size=size, ci_low=size, ci_high=size, p_value=1.0, before=ma, after=mb)
    return _welch(a, b)


def _passes(t: _Test, s: DetectorSettings) -> bool:
    return t.p_value <= s.max_pvalue and abs(t.size) >= s.min_magnitude


def weakest_failing(tests: list[_Test], s: DetectorSettings) -> int | None:
    """The failing test of the largest p (then the smallest size), the first of equals; None when all pass."""
    worst: tuple[float, float] | None = None
    at = None
    for i, t in enumerate(tests):
        if t.p_value <= s.max_pvalue and abs(t.size) >= s.min_magnitude:
            continue
        rank = (t.p_value, -abs(t.size))
        if worst is None or rank > worst:
            worst, at = rank, i
    return at


def locate(values: Values, settings: DetectorSettings | None = None) -> list[int]:
    """Candidate change points (indices of the first value after each) before pruning: the search alone
    (every split of the binary segmentation)."""
    s = settings or DetectorSettings()
    x = as_series(values)
    found: list[int] = []
    _search(x, 0, len(x), s, found)
    return sorted(found)


def prune(values: Values, candidates: Sequence[int], settings: DetectorSettings | None = None) -> \
        tuple[ChangePoint, ...]:
    """The candidates that pass against their neighbours (the weakest failing one dropped at a time)."""
    s = settings or DetectorSettings()
    x = as_series(values)
    cps = sorted(set(candidates))
    if not cps:
        return ()
    # each test depends on its stretch only (the change point and its neighbours): a drop changes two of them, so
    # the others are taken from here, not computed again (a long series has dozens of candidates)
    screened: dict[tuple[int, int, int], _Test] = {}
    permuted: dict[tuple[int, int, int], float] = {}
    sums = Sums(x)

    def stretch(i: int) -> tuple[int, int, int]:
        lo, hi = stretch_bounds(len(x), cps, i)
        return lo, cps[i], hi

    def screen(k: tuple[int, int, int]) -> _Test:
        return screened[k] if k in screened else screened.setdefault(k, sums.judge(*k, s))

    # screen: Welch's p of each against its neighbours (cheap, and never above the permutation test's); a drop
    # changes the stretches of its two neighbours only: those two are taken again, the rest kept
    keys = [stretch(i) for i in range(len(cps))]
    screens = [screen(k) for k in keys]

    def drop(i: int) -> None:
        del cps[i], keys[i], screens[i]
        for j in (i - 1, i):
            if 0 <= j < len(cps):
                keys[j] = stretch(j)
                screens[j] = screen(keys[j])

    while cps:
        tests = screens
        weakest = weakest_failing(tests, s)
        if weakest is not None:
            drop(weakest)
            continue
        # the test: the permutation p of each stretch (seeded shuffles)
        tests = [replace(t, p_value=permuted[k] if k in permuted else permuted.setdefault(
                     k, _permutation_p(x[k[0]:k[2]], k[1] - k[0], s.min_segment, s.permutations)))
                 for t, k in zip(tests, keys, strict=True)]
        weakest = weakest_failing(tests, s)
        if weakest is None:
            break
        drop(weakest)
    return reported(x, cps, [t.p_value for t in tests] if cps else [], s)


def reported(x: np.ndarray, cps: list[int], p_values: Sequence[float], s: DetectorSettings) -> \
        tuple[ChangePoint, ...]:
    """The change points ``cps`` that passed, with their permutation p-values: each one's size, interval and
    levels from the values (the sums only screen), and whether it is still in force."""
    if not cps:
        return ()
    last = float(x[cps[-1]:].mean())
    out = []
    for i, p in enumerate(p_values):
        t = replace(_judge(x, cps, i, s), p_value=p)
        end = last / t.before - 1 if t.before else 0.0
        in_force = math.copysign(1, end) == math.copysign(1, t.size) and abs(end) >= s.min_magnitude
        lo, hi = stretch_bounds(len(x), cps, i)
        out.append(ChangePoint(index=cps[i], size=t.size, ci_low=t.ci_low, ci_high=t.ci_high, p_value=t.p_value,
                               before=t.before, after=t.after, n_before=cps[i] - lo, n_after=hi - cps[i],
                               in_force=in_force))
    return tuple(out)


def as_series(values: Values) -> np.ndarray:
    """``values`` as a 1-D float array (not one-dimensional, or a value not finite: :class:`SeriesError`)."""
    x = np.asarray(values, dtype=float)
    if x.ndim != 1:
        raise SeriesError(f"a series is one-dimensional, got shape {x.shape}")
    if not np.isfinite(x).all():
        bad = int(np.flatnonzero(~np.isfinite(x))[0])
        raise SeriesError(f"value {bad} of the series is not a finite number ({x[bad]})")
    return x


def hampel(values: Values, sigmas: float = DEFAULT_OUTLIER_SIGMAS) -> tuple[np.ndarray, tuple[int, ...]]:
    """The series with its outliers replaced, and the outliers' indices. An outlier is a value further than
    ``sigmas`` robust standard deviations from both the median of the ``HAMPEL_HALF_WINDOW`` values before it
    and that of the ones after it (the first step of a new level is near the values after it: not an
    outlier); it is replaced by the mean of those two medians. The scale: 1.4826 times the median absolute
    residual of the values from those means, over :data:`RESIDUAL_SPREAD`. The first and last values are kept
    as they are (next to them, the values on their side, fewer than three, stand for the median)."""
    x = as_series(values)
    h = HAMPEL_HALF_WINDOW
    n = len(x)
    if sigmas <= 0 or n < 2 * h + 1:
        return x, ()
    before, after = _side_medians(x, h)
    mid = x[1:n - 1]
    scale = 1.4826 * float(np.median(np.abs(mid - (before + after) / 2))) / RESIDUAL_SPREAD
    scale = max(scale, 1e-9 * float(np.median(np.abs(x))), 1e-300)
    far = (np.abs(mid - before) > sigmas * scale) & (np.abs(mid - after) > sigmas * scale)
    out = np.flatnonzero(far) + 1
    clean = x.copy()
    clean[out] = (before[far] + after[far]) / 2
    return clean, tuple(int(i) for i in out)


def _side_medians(x: np.ndarray, h: int) -> tuple[np.ndarray, np.ndarray]:
    """For each inner value ``i`` (1 .. n-2): the median of the (up to) ``h`` values before it and of those after
    it; whole windows in one vectorised median, the few shorter ones at the ends one by one (``n >= 2h + 1``)."""
    n = len(x)
    full = np.median(np.lib.stride_tricks.sliding_window_view(x, h), axis=1)  # full[j]: median of x[j:j+h]
    before = np.empty(n - 2)
    after = np.empty(n - 2)
    before[h - 1:] = full[:n - 1 - h]  # i = h .. n-2: x[i-h:i]
    after[:n - 1 - h] = full[2:n - h + 1]  # i = 1 .. n-1-h: x[i+1:i+1+h]
    for i in range(1, h):
        before[i - 1] = np.median(x[:i])
    for i in range(n - h, n - 1):
        after[i - 1] = np.median(x[i + 1:])
    return before, after


def analyse_series(values: Values, settings: DetectorSettings | None = None) -> Detection:
    """Outliers set aside, then the change points of what is left (:func:`locate`, :func:`prune`)."""
    s = settings or DetectorSettings()
    clean, outliers = hampel(values, s.outlier_sigmas)
    return Detection(change_points=prune(clean, locate(clean, s), s), outliers=outliers)


def detect(values: Values, settings: DetectorSettings | None = None) -> tuple[ChangePoint, ...]:
    """The change points of ``values`` (in release order), oldest first; () for a series too short for one."""
    return analyse_series(values, settings).change_points
