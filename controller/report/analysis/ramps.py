"""The ramp that fits a stretch of a series best: a level, a straight line over several releases, a level.

Pure numpy/scipy, least squares from prefix sums, every (start, end) place at once; what a drift is made of
(:func:`controller.report.analysis.changepoints.drift_runs`, docs/adr/0039-change-points-without-holes-and-drifts.md).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


def weighted_ss(y: np.ndarray, w: np.ndarray) -> float:
    """The sum of squares about the mean of the values of weight 1."""
    n = float(w.sum())
    return float((w * (y - (w * y).sum() / n) ** 2).sum()) if n else 0.0


def ramp_beats_step(step_ss: float, ramp_ss: float, n: int, max_pvalue: float) -> bool:
    """A lone step is a drift only when the ramp's better fit is significant (F-test of its one more parameter,
    at ``max_pvalue``): a value that sits half-way at a step (a module warming up, an outlier next to it) is not a
    drift."""
    from scipy.special import fdtrc

    if ramp_ss <= 0:
        return step_ss > 0
    return float(fdtrc(1, n - 4, (step_ss - ramp_ss) / (ramp_ss / (n - 4)))) <= max_pvalue


@dataclass(frozen=True)
class Ramp:
    """A level ``level`` up to value ``a`` of a stretch, then a straight line to ``level + delta`` at value ``b``,
    that level after; ``ss``: the residual sum of squares, ``se``: the standard error of ``delta`` (the ramp's
    place taken as known), ``n``: the stretch's length."""

    level: float
    delta: float
    se: float
    a: int
    b: int
    ss: float
    n: int


# (start, end) pairs of a ramp tried as one array at most
RAMP_PLACES = 1 << 18


def _ramp_places(n: int, shortest: int, first: int, last: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Every ramp's (start ``a``, end ``b``) in a stretch of ``n`` that spans ``first`` .. ``last`` (``a < first``,
    ``b >= last``) and is ``shortest`` or longer, as arrays: in one pair when there are at most
    :data:`RAMP_PLACES`, else a pair per start (a long CSV series)."""
    starts, ends = np.arange(0, first), np.arange(last, n)
    if len(starts) * len(ends) <= RAMP_PLACES:
        a, b = (g.ravel() for g in np.meshgrid(starts, ends, indexing="ij"))
        keep = b - a >= shortest
        return [(a[keep], b[keep])]
    return [(np.full(len(e), a0), e) for a0 in starts.tolist() if len(e := ends[ends - a0 >= shortest])]


def best_ramp(y: np.ndarray, shortest: int, weights: np.ndarray | None = None, span: tuple[int, int] | None = None) \
        -> Ramp | None:
    """The ramp (:class:`Ramp`) of least squared error over ``y``, of ``shortest`` releases or more (``b - a``),
    by least squares on the ramp's shape for every (a, b): from prefix sums, every place at once (O(n^2)).
    ``weights``: 1 for a value, 0 for one left out (an outlier replaced by :func:`hampel`: its replacement, the
    mean of the levels either side, would sit half-way at a step and look like a ramp). ``span``: (first, last),
    the ramps that start before value ``first`` and end at ``last`` or after (the steps the ramp stands for)."""
    n = len(y)
    w = np.ones(n) if weights is None else weights
    m = float(w.sum())
    if n < shortest + 2 or m < 4:
        return None
    mean = float((w * y).sum() / m)
    yc = (y - mean) * w
    t = np.arange(n, dtype=float)

    def prefix(v: np.ndarray) -> np.ndarray:
        return np.concatenate(([0.0], np.cumsum(v)))

    c1, ct, w0, wt, wtt = prefix(yc), prefix(t * yc), prefix(w), prefix(w * t), prefix(w * t * t)
    syy = float(yc @ (y - mean))
    best: tuple[float, int, int, float, float, float] | None = None
    first, last = span if span is not None else (n, 0)
    for a, b in _ramp_places(n, shortest, first, last):
        if not len(a):
            continue
        length = b - a
        # the ramp's shape r: 0 up to a, (t - a) / length between, 1 from b on; its sums with the weights and
        # with the centred values
        s0, s1, s2 = w0[b] - w0[a + 1], wt[b] - wt[a + 1], wtt[b] - wtt[a + 1]
        after = w0[n] - w0[b]
        sr = (s1 - a * s0) / length + after
        srr = (s2 - 2 * a * s1 + a * a * s0) / (length * length) + after
        sry = ((ct[b] - ct[a + 1]) - a * (c1[b] - c1[a + 1])) / length + (c1[n] - c1[b])
        vrr = srr - sr * sr / m
        with np.errstate(divide="ignore", invalid="ignore"):
            ss = np.where(vrr > 1e-9, syy - sry * sry / vrr, np.inf)
        k = int(np.argmin(ss))
        if best is None or ss[k] < best[0]:
            best = (float(ss[k]), int(a[k]), int(b[k]), float(sry[k] / vrr[k]), float(sr[k] / m), float(vrr[k]))
    if best is None or not math.isfinite(best[0]):
        return None
    least, a0, b0, delta, rbar, vrr0 = best
    least = max(least, 0.0)
    se = math.sqrt(least / (m - 2) / vrr0)
    return Ramp(level=mean - delta * rbar, delta=delta, se=se, a=a0, b=b0, ss=least, n=int(m))
