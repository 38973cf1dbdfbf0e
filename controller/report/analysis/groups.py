"""Reductions of rows grouped by a few dense integer codes (the report's cells), sorted once.

``pandas.DataFrame.groupby(codes).median()`` hashes the codes, interleaves the columns and
sorts the groups again on every call; a report takes a dozen such medians of the same
grouping. :class:`Groups` sorts the rows by code once (a radix sort of small integers) and
answers each reduction with one ``np.partition`` per (group, column): the two middle order
statistics give the median, the lower median, and the median of any monotone transform of
the column (the badness ``±log`` of a figure) without another pass.

Semantics follow pandas: NaN is skipped; a group whose column is all NaN gives NaN; only
groups present in the codes are returned, in increasing code order.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

Columns = Sequence[np.ndarray] | np.ndarray


# groups this large: the middles from a window around a sample's (below)
_WINDOW_FROM = 2048
_SAMPLE_STEP = 16


def _window_middles(seg: np.ndarray, a: int, b: int) -> tuple[float, float] | None:
    """The a-th and b-th smallest values of ``seg`` (no NaN) from a window around the middle of a
    sample: every 16th value, whose quantiles 3 standard errors either side of the middle bound
    the window. If at most ``a`` values are below its lower end and at most ``len - 1 - b`` above
    its upper end, both order statistics lie in the window (the few values there, sorted, counted
    from the number below); else None (the caller partitions). Exact either way; a partition of
    10,000 values that are not in cache costs ~120 us, this ~1/3 of it."""
    m = len(seg)
    sample = seg[::_SAMPLE_STEP].copy()
    k = len(sample)
    # 3 standard errors of the sample's middle, in places
    spread = 3.0 * 0.5 * math.sqrt(k) + 1.0
    kl, kh = max(0, int((k - 1) / 2 - spread)), min(k - 1, int(k / 2 + spread) + 1)
    sample.partition((kl, kh))
    low, high = sample[kl], sample[kh]
    below = int(np.count_nonzero(seg < low))
    above = int(np.count_nonzero(seg > high))
    if below > a or above > m - 1 - b:
        return None
    window = np.sort(seg[(seg >= low) & (seg <= high)])
    return float(window[a - below]), float(window[b - below])


def true_counts(mask: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """How many true values in each run ``mask[start:end]`` (runs in order, covering the mask):
    few long runs by ``count_nonzero`` each (1 M flags in 92 runs: ~0.3 ms; ``add.reduceat`` to
    int64 ~1.1 ms), many by one ``add.reduceat``."""
    if len(starts) > 4096:
        return np.add.reduceat(mask, starts, dtype=np.int64)
    return np.array([np.count_nonzero(mask[a:b]) for a, b in zip(starts.tolist(), ends.tolist(), strict=True)],
                    dtype=np.int64)


class Groups:
    """Rows grouped by ``codes`` (non-negative integers, few distinct values)."""

    def __init__(self, codes: np.ndarray) -> None:
        codes = np.asarray(codes)
        self.codes = codes
        if len(codes) < 2 or bool((codes[1:] >= codes[:-1]).all()):
            # already in group order (a prepared report frame)
            self.order: np.ndarray | None = None
        else:
            small = codes.astype(np.int16) if int(codes.max()) < 2**15 else codes
            self.order = np.argsort(small, kind="stable")  # radix sort for 16-bit codes
        counts = np.bincount(codes) if len(codes) else np.zeros(0, dtype=np.int64)
        self.present = np.flatnonzero(counts)
        bounds = np.concatenate(([0], np.cumsum(counts)))
        self.starts, self.ends = bounds[self.present], bounds[self.present + 1]

    def __len__(self) -> int:
        return len(self.present)

    def _sorted(self, values: Columns) -> list[np.ndarray]:
        """Each column in group order (views when the rows are already in group order)."""
        if isinstance(values, np.ndarray):
            v = values if values.ndim == 2 else values.reshape(-1, 1)
            cols = [v[:, j] for j in range(v.shape[1])]
        else:
            cols = list(values)
        cols = [np.asarray(c, dtype=float) for c in cols]
        return cols if self.order is None else [c[self.order] for c in cols]

    def _sorted_raw(self, cols: Sequence[np.ndarray]) -> list[np.ndarray]:
        return list(cols) if self.order is None else [c[self.order] for c in cols]

    def middles(self, values: Columns) -> tuple[np.ndarray, np.ndarray]:
        """Lower and upper middle order statistics per (group, column), NaN skipped."""
        x = self._sorted(values)
        k = len(x)
        lo = np.full((len(self), k), np.nan)
        hi = np.full((len(self), k), np.nan)
        if not len(self):
            return lo, hi
        for j in range(k):
            col = np.ascontiguousarray(x[j])
            # no figure: NaN (a metric not run)
            if bool(np.isnan(col[:4096]).all()) and bool(np.isnan(col).all()):
                continue
            nan = np.isnan(col)
            # per group: how many NaN (one pass); a group without any is partitioned as it is
            nans = true_counts(nan, self.starts, self.ends) if nan.any() else np.zeros(len(self), np.int64)
            for i, (s, e, skip) in enumerate(zip(self.starts.tolist(), self.ends.tolist(), nans.tolist(),
                                                 strict=True)):
                seg = col[s:e] if not skip else col[s:e][~nan[s:e]]
                m = len(seg)
                if not m:
                    continue
                a, b = (m - 1) // 2, m // 2
                got = _window_middles(seg, a, b) if m >= _WINDOW_FROM else None
                if got is None:
                    part = np.partition(seg, (a, b) if a != b else a)
                    got = part[a], part[b]
                lo[i, j], hi[i, j] = got
        return lo, hi

    def median(self, values: Columns) -> np.ndarray:
        lo, hi = self.middles(values)
        return (lo + hi) / 2

    def trimmed_means(self, values: Columns, lower_below: int, up_to: int, rows: np.ndarray | None = None,
                      split: np.ndarray | None = None) -> np.ndarray:
        """The trimmed mean per (group, column), NaN skipped: of a group's n values sorted, the mean of ranks
        t .. n-1-t (0-based), t = max(1, n // 4): the interquartile mean (3 of 5 values; the median of 3).
        Where n <= 2, or n is even and below ``lower_below``, the lower middle value alone (the lower median:
        half of a small fleet moves no fleet figure). ``split`` (per group and column, in the order of the
        groups): only where it is true does that lower median apply; elsewhere such a group takes the trimmed
        mean too (both values of 2; the middle two of 4). Groups of more than ``up_to`` rows: NaN (the caller takes
        their median; ``rows``: each group's rows counted for that, where the values are those of some of them, the
        others without a figure). One sort by (group, value) per column, of the rows of the groups it computes."""
        cols = list(values.T) if isinstance(values, np.ndarray) and values.ndim == 2 else list(values)
        out = np.full((len(self), len(cols)), np.nan)
        sizes = self.ends - self.starts
        small = np.flatnonzero((sizes if rows is None else rows) <= up_to)
        if not len(small):
            return out
        taken = np.zeros(len(self), dtype=bool)
        taken[small] = True
        mask = np.repeat(taken, sizes)  # the rows of those groups, in group order
        idx = np.flatnonzero(mask) if self.order is None else self.order[mask]
        gid = np.repeat(np.arange(len(small)), sizes[small])
        for j, col in enumerate(cols):
            v = np.asarray(col, dtype=float)[idx]
            ok = ~np.isnan(v)
            g = gid if ok.all() else gid[ok]
            v = v if ok.all() else v[ok]
            # then stably by group: a radix sort of small codes, faster than a lexsort
            by_value = np.argsort(v)
            codes = g[by_value].astype(np.int16) if len(small) < 2**15 else g[by_value]
            order = by_value[np.argsort(codes, kind="stable")]
            g, v = g[order], v[order]
            n = np.bincount(g, minlength=len(small))
            rank = np.arange(len(v)) - (np.cumsum(n) - n)[g]
            lower = (n <= 2) | ((n % 2 == 0) & (n < lower_below))
            if split is not None:
                lower &= np.asarray(split, dtype=bool).reshape(len(self), -1)[small, j]
            t = np.where(n <= 2, 0, np.maximum(1, n // 4))
            first = np.where(lower, (n - 1) // 2, t)
            last = np.where(lower, (n - 1) // 2, n - 1 - t)
            keep = (rank >= first[g]) & (rank <= last[g])
            total = np.bincount(g[keep], weights=v[keep], minlength=len(small))
            count = np.bincount(g[keep], minlength=len(small))
            with np.errstate(invalid="ignore", divide="ignore"):
                out[small, j] = np.where(count > 0, total / np.maximum(count, 1), np.nan)
        return out

    def counts(self, flags: Sequence[np.ndarray]) -> np.ndarray:
        """How many rows are true per (group, column) of boolean columns."""
        out = np.zeros((len(self), len(flags)), dtype=np.int64)
        if len(self):
            for j, f in enumerate(self._sorted_raw(flags)):
                out[:, j] = (true_counts(f, self.starts, self.ends) if f.dtype == bool else
                             np.add.reduceat(f, self.starts, dtype=np.int64))
        return out

    def sums(self, values: Columns) -> tuple[np.ndarray, np.ndarray]:
        """Sum and count of the non-NaN values per (group, column)."""
        x = self._sorted(values)
        s = np.zeros((len(self), len(x)))
        c = np.zeros((len(self), len(x)), dtype=np.int64)
        if len(self):
            for j, col in enumerate(x):
                ok = ~np.isnan(col)
                s[:, j] = np.add.reduceat(np.where(ok, col, 0.0), self.starts)
                c[:, j] = true_counts(ok, self.starts, self.ends)
        return s, c

    def extremes(self, values: Columns) -> tuple[np.ndarray, np.ndarray]:
        """Min and max per (group, column), NaN skipped (NaN where a group has none)."""
        x = self._sorted(values)
        mn = np.full((len(self), len(x)), np.nan)
        mx = np.full((len(self), len(x)), np.nan)
        if len(self):
            with np.errstate(invalid="ignore"):
                for j in range(len(x)):
                    col = np.ascontiguousarray(x[j])
                    mn[:, j] = np.fmin.reduceat(col, self.starts)
                    mx[:, j] = np.fmax.reduceat(col, self.starts)
        return mn, mx


def run_medians(values: np.ndarray, codes: np.ndarray, max_sizes: int = 64) -> tuple[np.ndarray, np.ndarray] | None:
    """Median of ``values`` per code when every code's values are one contiguous run (entries
    laid out group by group): (codes, medians) in increasing code order, as pandas'
    ``groupby(codes).median()`` gives them. Runs of one length are partitioned together as the
    rows of one (runs, length) array: no per-group Python and no hashing of the codes.

    None (the caller falls back to pandas) when a value is NaN, a code has several runs, or the
    runs have more than ``max_sizes`` distinct lengths. A zero median is +0.0: which of several equal
    zeros (0.0, -0.0) a selection lands on depends on the sort kernel the CPU runs (numpy's SIMD
    partition differs by instruction set), so the sign of a zero median is not a result."""
    n = len(codes)
    if not n or np.isnan(values).any():
        return None
    starts = np.concatenate(([0], np.flatnonzero(codes[1:] != codes[:-1]) + 1))
    ids = codes[starts]
    if len(ids) > 1 and int(np.bincount(ids).max()) > 1:  # codes >= 0
        return None
    return medians_of_runs(values, starts, ids, max_sizes)


def medians_of_runs(values: np.ndarray, starts: np.ndarray, ids: np.ndarray, max_sizes: int = 64
                    ) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`run_medians` of runs already found: ``values`` (no NaN) laid out run by run, each run
    ``values[starts[i]:starts[i + 1]]`` (not empty) the values of code ``ids[i]`` (each code once).
    None when the runs have more than ``max_sizes`` distinct lengths."""
    sizes = np.diff(np.append(starts, len(values)))
    distinct = np.unique(sizes)
    if len(distinct) > max_sizes:
        return None
    lo, hi = np.empty(len(starts)), np.empty(len(starts))
    for size in distinct.tolist():
        a, b = (size - 1) // 2, size // 2
        if len(distinct) == 1:
            block = values.reshape(-1, size)
            sel: np.ndarray | slice = slice(None)
        else:
            sel = np.flatnonzero(sizes == size)
            block = values[starts[sel][:, None] + np.arange(size)]
        # the lower middle, taken as the largest value left of the upper one, may be a zero of the other sign
        # than the partition's a-th: no matter, (lo + hi) / 2 + 0.0 is the same number either way
        if a == b:
            part = np.partition(block, a, axis=1)
            lo[sel] = part[:, a]
        else:
            # one kth, and the lower middle as the largest value left of it: faster than two kth along rows
            part = np.partition(block, b, axis=1)
            lo[sel] = part[:, :b].max(axis=1)
        hi[sel] = part[:, b]
    med = (lo + hi) / 2 + 0.0  # -0.0 + 0.0 == +0.0
    if len(ids) < 2 or bool((ids[1:] > ids[:-1]).all()):
        return ids, med
    order = np.argsort(ids, kind="stable")
    return ids[order], med[order]


# -- codes and counts the outlier statistics use ------------------------------------------------
def by_code(g: Groups, per_group: np.ndarray) -> np.ndarray:
    """Per-group results (present groups) spread to a table indexed by code (NaN where absent)."""
    size = int(g.present.max()) + 1 if len(g) else 0
    full = np.full((size, *per_group.shape[1:]), np.nan)
    full[g.present] = per_group
    return full


def packed_bincount(codes: np.ndarray, weights: list[np.ndarray], size: int, most: int) -> np.ndarray:
    """Per code, the sums of several whole-number weights (each 0..``most`` a row), as columns:
    three weights packed in one float64 (16 bits apart; exact while no code has 2**16 / most
    rows), so five need two bincounts, not five."""
    rows = len(codes)
    if rows * max(most, 1) >= 2**16 and int(np.bincount(codes).max()) * max(most, 1) >= 2**16:
        return np.column_stack([np.bincount(codes, weights=w, minlength=size) for w in weights])
    cols = []
    for at in range(0, len(weights), 3):
        part = weights[at:at + 3]
        packed = part[0].copy()
        for i, w in enumerate(part[1:], 1):
            packed += w * float(2 ** (16 * i))  # powers of two: exact
        total = np.bincount(codes, weights=packed, minlength=size)
        for i in reversed(range(len(part))):
            field = np.floor(total / 2 ** (16 * i))
            total -= field * 2 ** (16 * i)
            cols.append((i + at, field))
    return np.column_stack([c for _, c in sorted(cols, key=lambda ic: ic[0])])


_WORDS: dict[int, type[np.unsignedinteger[Any]]] = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def row_counts(mask: np.ndarray) -> np.ndarray:
    """How many true values in each row of a (rows, few columns) boolean array, as float (bincount's
    weights). Rows of 2, 4 or 8 flags: each row read as one unsigned word, whose product with
    0x0101... holds the sum of its bytes (each 0 or 1) in its top byte (~5x the speed of a product
    with a column of ones, itself ~6x that of ``sum(axis=1)``)."""
    rows, width = mask.shape
    word = _WORDS.get(width)
    if word is not None and mask.flags.c_contiguous:
        w = mask.view(np.uint8).view(word).reshape(rows)
        ones = np.asarray(int.from_bytes(b"\x01" * width, "little"), dtype=word)
        return np.right_shift(w * ones, np.asarray(8 * (width - 1), dtype=word)).astype(np.float64)
    if width == 1:
        return mask[:, 0].astype(np.float64)
    return (mask.view(np.uint8) @ np.ones(width, np.uint8)).astype(np.float64)


def by_module(mod: np.ndarray) -> np.ndarray | None:
    """Rows (in cell order) put in module order, stable: each module's rows keep their cell order
    (None when they already are). numpy sorts 16-bit keys by radix: past 32,767 modules, two
    stable passes, by the low 15 bits of the code and then by the rest."""
    if len(mod) < 2 or bool((mod[1:] >= mod[:-1]).all()):
        return None
    top = int(mod.max())
    if top < 2**15:
        return np.argsort(mod.astype(np.int16), kind="stable")
    if top >= 2**30:
        return np.argsort(mod, kind="stable")
    low = np.argsort((mod & 0x7FFF).astype(np.int16), kind="stable")
    return low[np.argsort(np.take(mod >> 15, low).astype(np.int16), kind="stable")]
