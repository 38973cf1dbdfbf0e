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
  fails is dropped and the rest judged again, until every one passes: ``p <= max_pvalue`` by
  :func:`stretch_p` (the split's pooled t-test, exact under normal noise, times the number of splits the stretch
  has: a bound on "any split of a stretch without a change does as well", with no resolution limit and no random
  draws; docs/adr/0039-change-points-without-holes-and-drifts.md), and ``|size| >= min_magnitude``. A level
  shift is therefore one change point, whatever follows it;
* **drifts**: consecutive steps in one direction that one ramp (a level, a straight line over several
  releases, a level) fits better, by the Bayesian information criterion, are one drift (:func:`drift_runs`): a
  steady drift is not a staircase; a lone step becomes a drift only if the ramp fits significantly better;
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

from controller.report.analysis.ramps import Ramp, best_ramp, ramp_beats_step, weighted_ss
from controller.report.model import ReportError

DEFAULT_MIN_MAGNITUDE = 0.03
DEFAULT_MAX_PVALUE = 0.002
DEFAULT_MIN_SEGMENT = 3
DEFAULT_OUTLIER_SIGMAS = 3.0
HAMPEL_HALF_WINDOW = 3  # an outlier: far from the medians of 3 before, 3 after
# the spread of a value's residual from the mean of those two medians, in noise units: sqrt(1 + var(median of 3) / 2)
RESIDUAL_SPREAD = math.sqrt(1 + 0.4487 / 2)


Values = Union[Sequence[float], "np.ndarray"]


class SeriesError(ReportError, ValueError):
    """A series the detector cannot take (non-finite values, a bad setting)."""


@dataclass(frozen=True)
class DetectorSettings:
    """``min_magnitude``: the smallest relative change of level reported (0.05 = 5 %); ``max_pvalue``: the
    largest p-value of a change point (:func:`stretch_p`: any value in (0, 1], honoured exactly); ``min_segment``:
    the fewest values on either side of one."""

    min_magnitude: float = DEFAULT_MIN_MAGNITUDE
    max_pvalue: float = DEFAULT_MAX_PVALUE
    min_segment: int = DEFAULT_MIN_SEGMENT
    outlier_sigmas: float = DEFAULT_OUTLIER_SIGMAS  # 0: no value taken as an outlier

    def __post_init__(self) -> None:
        if not 0 <= self.min_magnitude < 1:
            raise SeriesError(f"min_magnitude must be a fraction in [0, 1), got {self.min_magnitude}")
        if not 0 < self.max_pvalue <= 1:
            raise SeriesError(f"max_pvalue must be in (0, 1], got {self.max_pvalue}")
        if self.min_segment < 2:
            raise SeriesError(f"min_segment must be at least 2, got {self.min_segment}")
        if self.outlier_sigmas < 0:
            raise SeriesError(f"outlier_sigmas must be 0 (off) or positive, got {self.outlier_sigmas}")


@dataclass(frozen=True)
class ChangePoint:
    """One change of level: a step (``kind`` ``"step"``) or a drift (``"drift"``: the level moved steadily over
    several releases). ``index``: the first value after a step (the first release of the new level), or the first
    value a drift moved; ``end``: the first value at the new level (a step: ``index``); ``size``: relative change of
    the level after vs before, ``ci_low``/``ci_high`` its 95 % interval; ``p_value``: the test of the stretch
    between the change points around it (:func:`stretch_p`; a drift: the largest of the steps it was found as);
    ``in_force``: the series still ends at the new level. A drift's ``slope``: its relative change per release
    (``size`` over ``end - index + 1`` releases), ``slope_low``/``slope_high`` its 95 % interval (a step: 0)."""

    index: int
    size: float
    ci_low: float
    ci_high: float
    p_value: float
    before: float
    after: float
    n_before: int
    n_after: int
    in_force: bool
    kind: str = "step"
    end: int = -1  # a step: index (set by __post_init__)
    slope: float = 0.0
    slope_low: float = 0.0
    slope_high: float = 0.0

    def __post_init__(self) -> None:
        if self.end < 0:
            object.__setattr__(self, "end", self.index)


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
    # Student's t straight from scipy.special: what scipy.stats.t's sf and ppf compute, without the distribution
    # object's argument checks in each of the thousands of calls pruning makes over a long history; imported once
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
    before = c[..., m - 1:n - m]  # sums before each split k - 1 = m - 1 .. n - m - 1
    gain = before / k
    right = c[..., -1:] - before
    right /= n - k
    gain -= right
    np.square(gain, out=gain)
    gain *= k * (n - k) / n  # in place: rounds as k (n - k) / n * (l - r) ** 2
    return gain


def _best_split(x: np.ndarray, m: int) -> int | None:
    """The split of ``x`` (at least ``m`` values a side) that most reduces the squared error."""
    if len(x) < 2 * m:
        return None
    return m + int(np.argmax(_gains(x, m)))


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
        """The test of the split at ``k`` of ``lo .. hi`` (:func:`stretch_p`) and its size, from the sums (the
        interval is :func:`_judge`'s)."""
        (ma, va), (mb, vb) = self.mean_var(lo, k), self.mean_var(k, hi)
        if min(k - lo, hi - k) < s.min_segment:
            size = mb / ma - 1 if ma else 0.0
            return _Test(size=size, ci_low=size, ci_high=size, p_value=1.0, before=ma, after=mb)
        p, size = stretch_p(ma, va, k - lo, mb, vb, hi - k, hi - lo - 2 * s.min_segment + 1)
        return _Test(size=size, ci_low=math.nan, ci_high=math.nan, p_value=p, before=ma, after=mb)


def stretch_p(ma: float, va: float, na: int, mb: float, vb: float, nb: int, splits: int) -> tuple[float, float]:
    """The p-value of "no change in the stretch" from its split into ``na`` values (mean ``ma``, variance ``va``,
    ddof 1) and ``nb`` (``mb``, ``vb``), one of the stretch's ``splits`` possible splits; and the size.

    Under independent normal noise of one variance, the squared-error reduction of any one split over the stretch's
    sum of squares is Beta(1/2, (n - 2)/2): the split's pooled two-sample t-test (n - 2 degrees of freedom) is
    exact. The stretch was split where it reduced most, so the p-value is that t-test's times the number of splits
    it could have been (Bonferroni: the probability that any split of a stretch without a change does as well is at
    most their sum). No resolution and no random draws: the p-value is a continuous, decreasing function of the
    step's size over the noise, and of the values on either side (the t-test's; the factor is the stretch's length).
    Squares are products (``x * x``, correctly rounded; ``x ** 2`` of a float is the C library's ``pow``):
    :mod:`controller.report.analysis.changepoints_batch` computes the same over many series at once with numpy's
    elementwise arithmetic and must come to the same bits."""
    stdtr, _ = student_t()
    diff = mb - ma
    scale = abs(ma) if ma else 1.0
    tiny = 1e-12 * scale
    df = na + nb - 2
    se2 = ((na - 1) * va + (nb - 1) * vb) / df * (1 / na + 1 / nb)
    if se2 <= tiny * tiny:  # both sides constant
        p = 0.0 if abs(diff) > tiny else 1.0
    else:
        p = min(1.0, splits * float(2 * stdtr(df, -abs(diff / math.sqrt(se2)))))
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


def prune(values: Values, candidates: Sequence[int], settings: DetectorSettings | None = None,
          outliers: Sequence[int] = ()) -> tuple[ChangePoint, ...]:
    """The candidates that pass against their neighbours (the weakest failing one dropped at a time; when none is
    left, the series' best split, judged over the whole series: the order of the drops must not lose a change that
    one split shows, as in a steady drift cut into candidates that each fail against their neighbours), then
    :func:`reported` (``outliers``: the values :func:`hampel` replaced, left out of a drift's fit)."""
    s = settings or DetectorSettings()
    x = as_series(values)
    cps = sorted(set(candidates))
    if not cps:
        return ()
    # each test depends on its stretch only (the change point and its neighbours): a drop changes two of them, so
    # the others are kept, not computed again (a long series has dozens of candidates)
    sums = Sums(x)

    def test(i: int) -> _Test:
        lo, hi = stretch_bounds(len(x), cps, i)
        return sums.judge(lo, cps[i], hi, s)

    tests = [test(i) for i in range(len(cps))]
    while cps:
        weakest = weakest_failing(tests, s)
        if weakest is None:
            break
        del cps[weakest], tests[weakest]
        for j in (weakest - 1, weakest):
            if 0 <= j < len(cps):
                tests[j] = test(j)
    # every candidate dropped: the series' best split alone, judged over the whole series
    if not cps:
        cps = [k for k in (_best_split(x, s.min_segment),) if k is not None]
        tests = [sums.judge(0, k, len(x), s) for k in cps]
        if weakest_failing(tests, s) is not None:
            return ()
    return reported(x, cps, [t.p_value for t in tests], s, outliers)


def reported(x: np.ndarray, cps: list[int], p_values: Sequence[float], s: DetectorSettings,
             outliers: Sequence[int] = ()) -> tuple[ChangePoint, ...]:
    """The change points ``cps`` that passed, with their p-values: each one's size, interval and levels from the
    values (the sums only screen), steps in one direction that a drift fits better as one drift
    (:func:`drift_runs`), and whether each is still in force."""
    if not cps:
        return ()
    steps = []
    for i, p in enumerate(p_values):
        t = replace(_judge(x, cps, i, s), p_value=p)
        lo, hi = stretch_bounds(len(x), cps, i)
        steps.append(ChangePoint(index=cps[i], size=t.size, ci_low=t.ci_low, ci_high=t.ci_high, p_value=t.p_value,
                                 before=t.before, after=t.after, n_before=cps[i] - lo, n_after=hi - cps[i],
                                 in_force=False))
    out: list[ChangePoint] = []
    drifts = dict(drift_runs(x, cps, steps, s, outliers))
    i = 0
    while i < len(steps):
        if i in drifts:
            out.append(drifts[i][1])
            i = drifts[i][0]
        else:
            out.append(steps[i])
            i += 1
    last = out[-1].after if out[-1].kind == "drift" else float(x[out[-1].index:].mean())
    return tuple(replace(c, in_force=_in_force(c, last, s)) for c in out)


def _in_force(c: ChangePoint, last: float, s: DetectorSettings) -> bool:
    end = last / c.before - 1 if c.before else 0.0
    return math.copysign(1, end) == math.copysign(1, c.size) and abs(end) >= s.min_magnitude


def drift_runs(x: np.ndarray, cps: list[int], steps: Sequence[ChangePoint], s: DetectorSettings,
               outliers: Sequence[int] = ()) -> list[tuple[int, tuple[int, ChangePoint]]]:
    """The runs of consecutive steps in one direction (one step or more) that one drift fits better: (the run's
    first step, (the step after the run, the drift)). Over the stretch from the change point before the run to the
    one after it, the best ramp (:func:`best_ramp`: a level, a straight line over at least ``min_segment``
    releases, a level) against the run's staircase, by the Bayesian information criterion (the ramp: 4
    parameters, two levels and where it starts and ends; the staircase of k steps: 2k + 1). A lone step is a step
    unless a ramp fits it that much better; a steady drift, which the search cuts into a staircase, is one drift."""
    n, out, i = len(x), [], 0
    keep = np.ones(n)
    keep[list(outliers)] = 0.0
    while i < len(steps):
        j = i + 1
        while j < len(steps) and (steps[j].size > 0) == (steps[i].size > 0):
            j += 1
        lo = cps[i - 1] if i > 0 else 0
        hi = cps[j] if j < len(cps) else n
        y, w = x[lo:hi], keep[lo:hi]
        ramp = best_ramp(y, s.min_segment + 1, w, (cps[i] - lo, cps[j - 1] - lo))
        if ramp is not None:
            bounds = [0, *(c - lo for c in cps[i:j]), hi - lo]
            staircase = sum(weighted_ss(y[a:b], w[a:b]) for a, b in zip(bounds, bounds[1:], strict=False))
            m = ramp.n
            # a noiseless series: the criterion's logarithm stays finite
            floor = 1e-24 * m * float(np.mean(y * y))
            bic_steps = m * math.log(max(staircase, floor) / m) + (2 * (j - i) + 1) * math.log(m)
            bic_ramp = m * math.log(max(ramp.ss, floor) / m) + 4 * math.log(m)
            if bic_ramp < bic_steps and (ramp.delta > 0) == (steps[i].size > 0) and \
                    (j - i > 1 or ramp_beats_step(staircase, ramp.ss, m, s.max_pvalue)):
                out.append((i, (j, ramp_change(ramp, lo, max(st.p_value for st in steps[i:j])))))
        i = j
    return out


def ramp_change(ramp: Ramp, lo: int, p_value: float) -> ChangePoint:
    """A ramp (:class:`~controller.report.analysis.ramps.Ramp`) as a drift of a series whose stretch starts at
    ``lo``."""
    _, stdtrit = student_t()
    half = float(stdtrit(ramp.n - 2, 0.975)) * ramp.se
    scale = abs(ramp.level) if ramp.level else 1.0
    size, releases = ramp.delta / scale, ramp.b - ramp.a
    low, high = (ramp.delta - half) / scale, (ramp.delta + half) / scale
    return ChangePoint(index=lo + ramp.a + 1, end=lo + ramp.b, size=size, ci_low=low, ci_high=high,
                       p_value=p_value, before=ramp.level, after=ramp.level + ramp.delta, n_before=ramp.a + 1,
                       n_after=ramp.n - ramp.b, in_force=False, kind="drift", slope=size / releases,
                       slope_low=low / releases, slope_high=high / releases)


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
    outlier), and from the mean of the two (a value of a steady drift is near it: not an outlier); it is replaced
    by the mean of those two medians. The scale: 1.4826 times the median absolute
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
    # far from both sides (the first value of a new level is near the side after it) and from the line between them
    # (a value in a steady drift is near the mean of the two)
    far = (np.abs(mid - before) > sigmas * scale) & (np.abs(mid - after) > sigmas * scale) & \
        (np.abs(mid - (before + after) / 2) > sigmas * scale)
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
    return Detection(change_points=prune(clean, locate(clean, s), s, outliers), outliers=outliers)


def detect(values: Values, settings: DetectorSettings | None = None) -> tuple[ChangePoint, ...]:
    """The change points of ``values`` (in release order), oldest first; () for a series too short for one."""
    return analyse_series(values, settings).change_points


@dataclass(frozen=True)
class Reach:
    """What a series of ``n`` values with relative noise ``noise`` lets the test name (:func:`reach`): the smallest
    relative step in its middle (``middle``) and with ``min_segment`` values after it (``fresh``: a step at the
    end of the history); None where the series is too short for any (fewer than twice ``min_segment``)."""

    n: int
    noise: float
    middle: float | None
    fresh: float | None


def smallest_step(n: int, after: int, noise: float, settings: DetectorSettings | None = None) -> float | None:
    """The smallest relative step, ``after`` values from the end of a series of ``n`` with relative noise ``noise``,
    that :func:`stretch_p` passes when the values sit on their two levels' means with that noise (at least
    ``min_magnitude``); None when ``after`` or ``n - after`` is under ``min_segment``."""
    s = settings or DetectorSettings()
    before, m = n - after, s.min_segment
    if min(before, after) < m:
        return None
    _, stdtrit = student_t()
    splits = n - 2 * m + 1
    t = float(stdtrit(n - 2, 1 - s.max_pvalue / (2 * splits)))
    return max(s.min_magnitude, t * noise * math.sqrt(1 / before + 1 / after))


def relative_noise(values: Values) -> float:
    """The series' noise relative to its level: the robust spread of neighbours' differences (a step moves one of
    them), over the square root of 2, over the median absolute value (outliers replaced first: :func:`hampel`)."""
    x = hampel(values)[0]
    if len(x) < 3:
        return math.nan
    level = float(np.median(np.abs(x))) or 1.0
    return 1.4826 * float(np.median(np.abs(np.diff(x)))) / math.sqrt(2) / level


def reach(values: Values, settings: DetectorSettings | None = None) -> Reach:
    """:class:`Reach` of a series at its own noise (:func:`relative_noise`)."""
    s = settings or DetectorSettings()
    n, noise = len(as_series(values)), relative_noise(values)
    return Reach(n=n, noise=noise, middle=smallest_step(n, n // 2, noise, s),
                 fresh=smallest_step(n, s.min_segment, noise, s))
