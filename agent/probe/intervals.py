"""Confidence intervals of a figure over repeated runs (pure, standard library): Student's t.

A probe that repeats a profile N times (``--repeat N``) reports each figure's mean over the N runs with its
95 % t interval, mean +- t(0.975, N-1) s / sqrt(N). Chosen over a percentile bootstrap by measurement
(``bench/intervals.py``, docs/adr/0015-measurement-choices.md): with the few repeats a probe can afford
(3-10) the bootstrap's intervals are too narrow (about 0.73 coverage at N=3, 0.90 at N=10 for a nominal 0.95),
the t interval's hold their level.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from contract.records import Frozen

# t(0.975, df) for df 1..30; past 30 the Cornish-Fisher expansion of the normal quantile (error < 0.001)
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
         2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)
_Z975 = 1.959964
# t(0.9995, df) for df 1..30: the cross-check's band (two-sided 0.1 %, agent.probe.compare)
_T9995 = (636.619, 31.599, 12.924, 8.61, 6.869, 5.959, 5.408, 5.041, 4.781, 4.587, 4.437, 4.318, 4.221, 4.14, 4.073,
          4.015, 3.965, 3.922, 3.883, 3.85, 3.819, 3.792, 3.768, 3.745, 3.725, 3.707, 3.69, 3.674, 3.659, 3.646)
_Z9995 = 3.290527


def _t(table: tuple[float, ...], z: float, df: int) -> float:
    if df < 1:
        raise ValueError("t quantile needs at least one degree of freedom")
    if df <= len(table):
        return table[df - 1]
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def t975(df: int) -> float:
    """The 97.5 % quantile of Student's t with ``df`` degrees of freedom (df >= 1)."""
    return _t(_T975, _Z975, df)


def t9995(df: int) -> float:
    """The 99.95 % quantile of Student's t with ``df`` degrees of freedom (df >= 1)."""
    return _t(_T9995, _Z9995, df)


class Interval(Frozen):
    """A figure's mean over N repeats and its 95 % t interval."""

    n: int
    mean: float
    low: float
    high: float

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2


def t_interval(values: Sequence[float]) -> Interval | None:
    """The 95 % t interval of the mean of ``values`` (None for fewer than two)."""
    if len(values) < 2:
        return None
    mean = statistics.fmean(values)
    half = t975(len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return Interval(n=len(values), mean=mean, low=mean - half, high=mean + half)
