"""The two middle badness figures of every metric per cell, taken once and reused by every median.

The median of a figure, of its badness, of its difference to a per-cell reference and the lower
median all follow from the two middle order statistics (``±log`` is monotone), so a report
partitions each cell once; rows left out (outlier modules) move them only a little
(:func:`included_middles`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from controller.report.analysis.frame import SIGN, B, badness_columns, exact_metrics, float_columns
from controller.report.analysis.groups import Groups, true_counts
from controller.report.model import ALL_METRICS


class Middles:
    """The two middle badness figures of every metric per cell of the included rows, taken once:
    the median of a figure, of its badness, of its difference to a per-cell reference and the
    lower median all follow from them (``±log`` is monotone)."""

    def __init__(self, inc: pd.DataFrame, groups: Groups, exact: pd.Series | None = None,
                 known: dict[str, tuple[np.ndarray, np.ndarray]] | None = None) -> None:
        """``known``: the middles of some metrics over the same rows and groups, already taken (the
        fleet's, when no row is left out): only the other metrics are partitioned."""
        known = known or {}
        todo = [m for m in ALL_METRICS if m not in known]
        lo_t, hi_t = groups.middles(float_columns(inc, badness_columns(todo)))
        lo, hi = np.empty((len(groups), len(ALL_METRICS))), np.empty((len(groups), len(ALL_METRICS)))
        for j, m in enumerate(ALL_METRICS):
            if m in known:
                lo[:, j], hi[:, j] = known[m]
            else:
                lo[:, j], hi[:, j] = lo_t[:, todo.index(m)], hi_t[:, todo.index(m)]
        self.groups = groups
        self.lo = pd.DataFrame(lo, index=groups.present, columns=list(ALL_METRICS))
        self.hi = pd.DataFrame(hi, index=groups.present, columns=list(ALL_METRICS))
        # ``exact``: taken before inc lost its figures
        self.exact = exact_metrics(inc, None) if exact is None else exact

    def badness(self, metrics: list[str]) -> np.ndarray:
        return np.asarray((self.lo[metrics].to_numpy() + self.hi[metrics].to_numpy()) / 2)

    def figure(self, m: str) -> np.ndarray:
        with np.errstate(over="ignore"):
            return np.asarray((np.exp(SIGN[m] * self.lo[m].to_numpy()) + np.exp(SIGN[m] * self.hi[m].to_numpy())) / 2)


def included_middles(cur: pd.DataFrame, g: Groups, fleet: dict[str, tuple[np.ndarray, np.ndarray]],
                      excluded: np.ndarray, gi: Groups) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The two middle badness figures per cell of the included rows (per ``gi.present``), from the
    fleet's (all rows, per ``g.present``) without a partition where the rows left out are few.

    Leaving e rows out moves each order statistic by at most e places, so in a cell of m included
    figures, if at most (m-1)//2 of them are below the fleet's lower middle and at most
    m-1-m//2 above its upper middle, both included middles lie between the fleet's two: they are
    found among the few figures in between (sorted), counted from the number below. Cells where
    that does not hold are partitioned as :class:`Groups` would."""
    if g.order is not None:
        return {}
    sizes = g.ends - g.starts
    at = np.searchsorted(g.present, gi.present)  # gi's cells among g's
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    keep = ~excluded
    with np.errstate(invalid="ignore"):
        for m, (lo_f, hi_f) in fleet.items():
            b = cur[B[m]].to_numpy()
            ok_row = keep & ~np.isnan(b)
            below = ok_row & (b < np.repeat(lo_f, sizes))
            above = ok_row & (b > np.repeat(hi_f, sizes))
            win = ok_row & ~below & ~above
            n_inc, n_below, n_above, n_win = (true_counts(x, g.starts, g.ends)
                                              for x in (ok_row, below, above, win))
            a, c = (n_inc - 1) // 2, n_inc // 2
            fits = (n_inc > 0) & (n_below <= a) & (n_above <= n_inc - 1 - c)
            vals = b[win]
            cellpos = np.repeat(np.arange(len(g)), n_win)
            vals = vals[np.lexsort((vals, cellpos))]  # each cell's window, sorted
            first = np.concatenate(([0], np.cumsum(n_win)[:-1]))
            lo, hi = np.full(len(g), np.nan), np.full(len(g), np.nan)
            lo[fits] = vals[(first + a - n_below)[fits]]
            hi[fits] = vals[(first + c - n_below)[fits]]
            # rows left out moved the middles far
            for i in np.flatnonzero(~fits & (n_inc > 0)).tolist():
                seg = b[g.starts[i]:g.ends[i]][ok_row[g.starts[i]:g.ends[i]]]
                part = np.partition(seg, (a[i], c[i]) if a[i] != c[i] else a[i])
                lo[i], hi[i] = part[a[i]], part[c[i]]
            out[m] = (lo[at], hi[at])
    return out
