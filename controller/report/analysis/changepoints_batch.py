"""Change points of many series at once: :func:`analyse_many`, the same Detections as
:func:`~controller.report.analysis.changepoints.analyse_series` of each, to the bit, in a fraction of the time.

A trend over a history analyses one series per (model key, profile, metric, scope): 1,210 series of 100 releases
for one model and metric over 100 runs of 10,000 rows. One at a time, the detector's Python steps (a Hampel
median, a split, a test) dominate: ~85,000 tests and ~32,000 splits. Here the series of one length are one 2-D array
and each step runs on all of them together:

* **outliers**: the Hampel filter of every row at once (numpy's medians along an axis: each row's medians);
* **search**: binary segmentation level by level, the segments (of any series) of lengths within a factor of two
  one zero-padded array;
* **pruning**: the tests of every series in lock step, one drop per series a round (the weakest failing test, then
  its two neighbours tested again, every series' tests one array). A series whose tests all pass (a few) is
  reported by the per-series code (sizes, intervals, drifts).

The arithmetic that decides (means, prefix sums, the tests' p, the gains, the medians) is the per-series code's,
operation by operation: numpy's elementwise float operations round as Python's do, and the tests' squares are
products in both (``changepoints.stretch_p``). ``tests/report/test_changepoints_batch.py`` holds the two equal, to
the bit, on random series.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from controller.report.analysis.changepoints import (
    HAMPEL_HALF_WINDOW,
    RESIDUAL_SPREAD,
    ChangePoint,
    Detection,
    DetectorSettings,
    Values,
    as_series,
    reported,
    student_t,
)


def analyse_many(series: Sequence[Values], settings: DetectorSettings | None = None) -> list[Detection]:
    """:func:`~controller.report.analysis.changepoints.analyse_series` of each series, in order (a bad series:
    the same :class:`~controller.report.analysis.changepoints.SeriesError`, the first in order)."""
    s = settings or DetectorSettings()
    xs = [as_series(v) for v in series]
    out: list[Detection | None] = [None] * len(xs)
    by_length: dict[int, list[int]] = {}
    for i, x in enumerate(xs):
        by_length.setdefault(len(x), []).append(i)
    for n, same_length in by_length.items():
        # a bounded array at a time (a history of every metric: 10^5 series)
        for at in range(0, len(same_length), ROWS):
            idx = same_length[at:at + ROWS]
            x = np.array([xs[i] for i in idx], dtype=float).reshape(len(idx), n)
            for i, d in zip(idx, _analyse_rows(x, s), strict=True):
                out[i] = d
    return [d for d in out if d is not None]


# series of one length analysed as one array at most
ROWS = 4096


def _analyse_rows(x: np.ndarray, s: DetectorSettings) -> list[Detection]:
    clean, outliers = hampel_rows(x, s.outlier_sigmas)
    cps = prune_rows(clean, locate_rows(clean, s.min_segment), s, outliers)
    return [Detection(change_points=c, outliers=o) for c, o in zip(cps, outliers, strict=True)]


# --------------------------------------------------------------------------- outliers
def hampel_rows(x: np.ndarray, sigmas: float) -> tuple[np.ndarray, list[tuple[int, ...]]]:
    """:func:`~controller.report.analysis.changepoints.hampel` of each row of ``x``."""
    rows, n = x.shape
    h = HAMPEL_HALF_WINDOW
    if sigmas <= 0 or n < 2 * h + 1:
        return x, [()] * rows
    full = np.median(np.lib.stride_tricks.sliding_window_view(x, h, axis=1), axis=2)
    before = np.empty((rows, n - 2))
    after = np.empty((rows, n - 2))
    before[:, h - 1:] = full[:, :n - 1 - h]
    after[:, :n - 1 - h] = full[:, 2:n - h + 1]
    for i in range(1, h):
        before[:, i - 1] = np.median(x[:, :i], axis=1)
    for i in range(n - h, n - 1):
        after[:, i - 1] = np.median(x[:, i + 1:], axis=1)
    mid = x[:, 1:n - 1]
    scale = 1.4826 * np.median(np.abs(mid - (before + after) / 2), axis=1) / RESIDUAL_SPREAD
    floor = 1e-9 * np.median(np.abs(x), axis=1)
    # max(scale, floor, 1e-300): the first of equals, as max() takes
    scale = np.where(floor > scale, floor, scale)
    scale = np.where(scale < 1e-300, 1e-300, scale)[:, None]
    # far from both sides (the first value of a new level is near the side after it) and from the line between them
    # (a value in a steady drift is near the mean of the two)
    far = (np.abs(mid - before) > sigmas * scale) & (np.abs(mid - after) > sigmas * scale) & \
        (np.abs(mid - (before + after) / 2) > sigmas * scale)
    clean = x.copy()
    r, c = np.nonzero(far)
    clean[r, c + 1] = (before[r, c] + after[r, c]) / 2
    outliers: list[tuple[int, ...]] = [()] * rows
    for row in np.flatnonzero(far.any(axis=1)).tolist():
        outliers[row] = tuple(int(i) + 1 for i in np.flatnonzero(far[row]))
    return clean, outliers


# --------------------------------------------------------------------------- search
def locate_rows(x: np.ndarray, m: int) -> list[list[int]]:
    """:func:`~controller.report.analysis.changepoints.locate` of each row of ``x``: every split of the binary
    segmentation, sorted."""
    rows, n = x.shape
    found: list[list[int]] = [[] for _ in range(rows)]
    seg_row = np.arange(rows)
    seg_lo = np.zeros(rows, dtype=np.intp)
    seg_hi = np.full(rows, n, dtype=np.intp)
    while True:
        keep = seg_hi - seg_lo >= 2 * m
        seg_row, seg_lo, seg_hi = seg_row[keep], seg_lo[keep], seg_hi[keep]
        if not len(seg_row):
            break
        at = seg_lo + m + _best_splits(x, seg_row, seg_lo, seg_hi, m)
        for r, k in zip(seg_row.tolist(), at.tolist(), strict=True):
            found[r].append(k)
        seg_row = np.concatenate((seg_row, seg_row))
        seg_lo, seg_hi = np.concatenate((seg_lo, at)), np.concatenate((at, seg_hi))
    return [sorted(f) for f in found]


def _best_splits(x: np.ndarray, row: np.ndarray, lo: np.ndarray, hi: np.ndarray, m: int) -> np.ndarray:
    """For each segment ``x[row, lo:hi]``: the offset from ``m`` of its best split (``_best_split`` - m). The
    segments of lengths within a factor of two are one array, each a row zero-padded to the longest: a row's
    cumulative sums are its segment's own, and each row's gains are masked to its own splits."""
    length = hi - lo
    out = np.empty(len(row), dtype=np.intp)
    band = np.log2(length).astype(int)
    for b in np.unique(band).tolist():
        sel = np.flatnonzero(band == b)
        n = length[sel, None]
        width = int(n.max())
        at = lo[sel, None] + np.arange(width)
        seg = np.where(at < hi[sel, None], x[row[sel, None], np.minimum(at, x.shape[1] - 1)], 0.0)
        k = np.arange(m, width - m + 1)
        c = np.cumsum(seg, axis=1)
        before = c[:, m - 1:width - m]
        with np.errstate(divide="ignore", invalid="ignore"):
            gain = before / k
            gain -= (np.take_along_axis(c, n - 1, axis=1) - before) / (n - k)
            np.square(gain, out=gain)
            gain = k * (n - k) / n * gain
        gain[k > n - m] = -np.inf
        out[sel] = np.argmax(gain, axis=1)
    return out


# --------------------------------------------------------------------------- pruning
def prune_rows(x: np.ndarray, candidates: list[list[int]], s: DetectorSettings,
               outliers: Sequence[Sequence[int]] | None = None) -> list[tuple[ChangePoint, ...]]:
    """:func:`~controller.report.analysis.changepoints.prune` of each row of ``x`` with its candidates (distinct,
    sorted: :func:`locate_rows`') and its outliers: the tests of every series in lock step, one drop per series
    and round; a series whose tests all pass is reported (``changepoints.reported``, per series)."""
    rows, n = x.shape
    out: list[tuple[ChangePoint, ...]] = [()] * rows
    width = max((len(c) for c in candidates), default=0) + 2
    if width == 2:
        return out
    # column 0: the series' start, 1 .. K: its candidates, K + 1: its end (K: its number of candidates); a
    # candidate dropped is taken out of the links (prev / nxt: the neighbouring columns still in)
    pos = np.full((rows, width), n, dtype=np.intp)
    pos[:, 0] = 0
    alive = np.zeros((rows, width), dtype=bool)
    for r, c in enumerate(candidates):
        pos[r, 1:len(c) + 1] = c
        alive[r, 1:len(c) + 1] = True
    cols = np.arange(width)
    prev = np.broadcast_to(cols - 1, (rows, width)).copy()
    nxt = np.broadcast_to(cols + 1, (rows, width)).copy()
    sums = _RowSums(x)
    p = np.full((rows, width), np.nan)
    size = np.full((rows, width), np.nan)
    r0, c0 = np.nonzero(alive)
    p[r0, c0], size[r0, c0] = sums.screen(r0, pos[r0, prev[r0, c0]], pos[r0, c0], pos[r0, nxt[r0, c0]], s)
    active = np.flatnonzero(alive.any(axis=1))
    while len(active):
        passes = (p[active] <= s.max_pvalue) & (np.abs(size[active]) >= s.min_magnitude)
        fail = alive[active] & ~passes
        has = fail.any(axis=1)
        for r in active[~has].tolist():
            out[r] = reported(x[r], pos[r, alive[r]].tolist(), p[r, alive[r]].tolist(), s,
                              outliers[r] if outliers is not None else ())
        active, fail = active[has], fail[has]
        if not len(active):
            break
        # the weakest failing screen of each series: the largest p, then the smallest size, the first of equals
        fp = np.where(fail, p[active], -np.inf)
        top = fail & (fp == fp.max(axis=1, keepdims=True))
        fz = np.where(top, -np.abs(size[active]), -np.inf)
        top &= fz == fz.max(axis=1, keepdims=True)
        r1, c1 = active, np.argmax(top, axis=1)
        _drop(r1, c1, alive, prev, nxt)
        again = np.concatenate((np.stack((r1, prev[r1, c1])), np.stack((r1, nxt[r1, c1]))), axis=1)
        r2, c2 = again[:, alive[again[0], again[1]]]
        if len(r2):
            p[r2, c2], size[r2, c2] = sums.screen(r2, pos[r2, prev[r2, c2]], pos[r2, c2], pos[r2, nxt[r2, c2]], s)
        active = active[alive[active].any(axis=1)]
    # every candidate dropped: the series' best split alone, judged over the whole series (changepoints.prune)
    emptied = np.array([r for r, c in enumerate(candidates) if c and not out[r]], dtype=np.intp)
    if len(emptied):
        k = _best_splits(x, emptied, np.zeros(len(emptied), dtype=np.intp), np.full(len(emptied), n, dtype=np.intp),
                         s.min_segment) + s.min_segment
        p1, size1 = sums.screen(emptied, np.zeros(len(emptied), dtype=np.intp), k, np.full(len(emptied), n), s)
        passes = (p1 <= s.max_pvalue) & (np.abs(size1) >= s.min_magnitude)
        for r, at, pv in zip(emptied[passes].tolist(), k[passes].tolist(), p1[passes].tolist(), strict=True):
            out[r] = reported(x[r], [at], [pv], s, outliers[r] if outliers is not None else ())
    return out


def _drop(r: np.ndarray, c: np.ndarray, alive: np.ndarray, prev: np.ndarray, nxt: np.ndarray) -> None:
    """Take candidate ``c`` of each row ``r`` (one a row) out of the links."""
    alive[r, c] = False
    before, after = prev[r, c], nxt[r, c]
    nxt[r, before] = after
    prev[r, after] = before


class _RowSums:
    """``changepoints.Sums`` of each row: the centred prefix sums, and the screens from them."""

    def __init__(self, x: np.ndarray) -> None:
        rows, n = x.shape
        # a 1-D mean each: numpy's pairwise sum of a row
        self.shift = np.array([float(row.mean()) for row in x])
        c = x - self.shift[:, None]
        self.s1 = np.zeros((rows, n + 1))
        self.s2 = np.zeros((rows, n + 1))
        np.cumsum(c, axis=1, out=self.s1[:, 1:])
        np.cumsum(c * c, axis=1, out=self.s2[:, 1:])

    def mean_var(self, r: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n = hi - lo
        a = self.s1[r, hi] - self.s1[r, lo]
        q = self.s2[r, hi] - self.s2[r, lo]
        v = (q - a * a / n) / (n - 1)
        return self.shift[r] + a / n, np.where(n > 1, np.where(v > 0.0, v, 0.0), 0.0)

    def screen(self, r: np.ndarray, lo: np.ndarray, k: np.ndarray, hi: np.ndarray,
               s: DetectorSettings) -> tuple[np.ndarray, np.ndarray]:
        """The test's (p, size) of the split at ``k`` of ``lo .. hi`` of each row ``r``: ``Sums.judge``
        (``changepoints.stretch_p``, operation by operation)."""
        stdtr, _ = student_t()
        with np.errstate(all="ignore"):
            (ma, va), (mb, vb) = self.mean_var(r, lo, k), self.mean_var(r, k, hi)
            na, nb = k - lo, hi - k
            diff = mb - ma
            scale = np.where(ma != 0, np.abs(ma), 1.0)
            tiny = 1e-12 * scale
            df = na + nb - 2
            se2 = ((na - 1) * va + (nb - 1) * vb) / df * (1 / na + 1 / nb)
            splits = hi - lo - 2 * s.min_segment + 1
            pooled = np.minimum(1.0, splits * (2 * stdtr(df, -np.abs(diff / np.sqrt(se2)))))
            p = np.where(se2 <= tiny * tiny, np.where(np.abs(diff) > tiny, 0.0, 1.0), pooled)
            size = diff / scale
            short = np.minimum(na, nb) < s.min_segment
            if short.any():
                p = np.where(short, 1.0, p)
                size = np.where(short, np.where(ma != 0, mb / ma - 1, 0.0), size)
        return p, size
