"""The analysis behind a report: pure pandas, frames in, a :class:`Report` out.

Design (what keeps false alarms out and still names a real regression):

* every figure becomes a *badness* in log units, ``b = ±log(value)`` signed so that larger is
  worse (tok/s: higher is better; ms: lower is better);
* **outliers first**: per (model key, profile, metric) each module's deviation from the fleet
  median and its robust z (median / MAD). A module whose *typical* deviation over all its
  figures exceeds the outlier tolerance and is one-sided by a sign test (scipy ``binom``) is
  named once, with its factor and worst cases; then the same per (module, model key);
* outlier modules are left out of the fleet figures, so a slow module is not a regression;
* **fleet vs baseline / previous run**: per (key, profile, metric) the fleet median of the
  difference to the reference; per (key, metric) the median over profiles with a Wilcoxon
  signed-rank test across profiles (scipy). A single profile must move beyond tolerance on
  (nearly) every module (sign test across modules);
* **per module vs its previous run**: median over profiles and a sign test; changes the fleet
  or the outlier list already explain are folded into those findings;
* MTP: accept rates are metrics like the others (higher is better); a prompt answered
  correctly by the reference and wrongly now is a regression.

Only aggregated results (cells, keys, modules) are iterated in Python; rows never are.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pandas as pd

from contract.records import METRICS
from contract.vocab import COMPARED, Disagreement
from controller.report.groups import Groups, run_medians, true_counts
from controller.report.model import (
    ALL_METRICS,
    DERIVED,
    FLEET,
    PRIMARY_METRICS,
    Change,
    Outlier,
    Regression,
    Report,
    ReportError,
    Status,
    Thresholds,
    Verdict,
    WorstCase,
)

K = ["model_key", "profile"]
SIGN: dict[str, float] = {m: (-1.0 if up else 1.0) for m, up in METRICS.items()}
B = {m: f"b_{m}" for m in ALL_METRICS}  # badness column per metric
_IDS = ("module", "model_key", "profile")
_SHAPE = ("table", "prefill_len", "input_tokens", "prefix_tokens")  # per profile, for plots


# -- preparation --------------------------------------------------------------------------------
def _category(col: pd.Series) -> pd.Categorical:
    if isinstance(col.dtype, pd.CategoricalDtype):
        return col.array
    if isinstance(col.dtype, pd.StringDtype) and not col.hasnans:  # one sorted factorisation
        codes, uniques = pd.factorize(col, sort=True)
        return pd.Categorical.from_codes(codes, dtype=pd.CategoricalDtype(uniques))
    if not (pd.api.types.is_string_dtype(col.dtype) and not col.hasnans):
        col = col.fillna("").astype(str)
    return pd.Categorical(col) if col.dtype == object else col.astype("category").array


def _numeric(col: pd.Series) -> np.ndarray:
    if pd.api.types.is_float_dtype(col.dtype):
        return col.to_numpy(dtype=float, na_value=np.nan)
    if col.dtype == object:  # e.g. ``correct``: True / False / None; np.asarray makes None NaN
        try:
            return np.asarray(col.to_numpy(), dtype=float)
        except (TypeError, ValueError):
            pass  # text in it: coerced below
    return pd.to_numeric(col, errors="coerce").astype(float).to_numpy()


def _in_order(v: Any, order: np.ndarray | None) -> Any:
    """A column (array or Categorical) with its rows in ``order`` (None: as it is)."""
    if order is None:
        return v
    if isinstance(v, pd.Categorical):
        return pd.Categorical.from_codes(np.take(v.codes, order), dtype=v.dtype)
    return np.take(v, order)  # ~20 % faster than ``v[order]``


def prepare(df: pd.DataFrame) -> pd.DataFrame:
    """Typed copy of a rows frame: categorical ids, integer codes (``mod``, ``key``, ``cell`` per
    (key, profile)), float metrics, invalid figures blanked, badness columns; rows sorted by cell
    (the index keeps each row's position in ``df``)."""
    missing = [c for c in ("module", "model_key", "profile") if c not in df.columns]
    if missing:
        raise ReportError(f"rows frame lacks column {missing[0]!r}")
    n = len(df)

    def col(c: str) -> pd.Series:
        return df[c].reset_index(drop=True) if c in df.columns else pd.Series([None] * n, dtype=object)

    ids = {c: _category(col(c)) for c in _IDS}
    nk = len(ids["model_key"].categories) + 1
    code = np.int32 if (len(ids["module"].categories) + 1) * nk < 2**31 else np.int64  # 4 bytes a row each
    mod = np.asarray(ids["module"].codes, dtype=code)
    key = np.asarray(ids["model_key"].codes, dtype=code)
    combo = key.astype(np.int64) * (len(ids["profile"].categories) + 1) + ids["profile"].codes
    cell: np.ndarray = pd.factorize(combo)[0].astype(code) if n else np.zeros(0, dtype=code)
    order: np.ndarray | None = None
    if n > 1 and not bool((cell[1:] >= cell[:-1]).all()):
        # rows in cell order (stable: a cell keeps its rows' order; the index keeps the row's
        # position in ``df``): every per-cell median is then a contiguous slice (see Groups).
        # Each column is put in order once, before the frame is built (no frame-wide take).
        order = np.argsort(cell.astype(np.int16 if cell.max() < 2**15 else np.int64), kind="stable")
    # what the cell determines (key, profile, the cell itself) is each cell's value repeated over
    # its rows in cell order (a sequential write), not a gather of every row
    sizes = np.bincount(cell) if n else np.zeros(0, dtype=np.int64)  # factorized: codes 0..k-1, all present
    firsts = None if order is None else order[np.concatenate(([0], np.cumsum(sizes)[:-1]))]

    def by_cell(v: Any) -> Any:
        if firsts is None:
            return v
        if isinstance(v, pd.Categorical):
            return pd.Categorical.from_codes(np.repeat(np.take(v.codes, firsts), sizes), dtype=v.dtype)
        return np.repeat(np.take(v, firsts), sizes)

    cols: dict[str, Any] = {c: by_cell(v) if c in K else _in_order(v, order) for c, v in ids.items()}
    cols["correct"] = _in_order(_numeric(col("correct")), order)
    invalid = _invalid(col("flags"))
    with np.errstate(invalid="ignore", divide="ignore"):
        for m in ALL_METRICS:
            v = _numeric(col(m)) if m in df.columns else np.full(n, np.nan)
            bad = invalid(m)
            if bad is not None:
                v = np.where(bad, np.nan, v)
            v = _in_order(v, order)
            cols[m] = v
            b = np.log(v)  # then the sign (an exact flip) and NaN where there is no badness, in place
            if SIGN[m] < 0:
                np.negative(b, out=b)
            b[~(v > 0)] = np.nan
            cols[B[m]] = b
    cols["mod"], cols["key"] = _in_order(mod, order), by_cell(key)
    cols["cell"] = by_cell(cell)
    cols["modkey"] = cols["mod"] * code(nk) + cols["key"]
    index = pd.RangeIndex(n) if order is None else pd.Index(order)
    return pd.DataFrame(cols, index=index, copy=False)


def _invalid(flags: pd.Series) -> Callable[[str], np.ndarray | None]:
    """Per metric, a mask of the rows whose flags mark its figure invalid (``<metric>_invalid``;
    None: no row). Few distinct texts: those are tested, not every row; a text column is first
    narrowed to the rows that name anything invalid (one vectorised substring test)."""
    n = len(flags)
    rows: np.ndarray | None = None
    if isinstance(flags.dtype, pd.StringDtype):
        rows = np.flatnonzero(flags.str.contains("_invalid", regex=False).to_numpy(dtype=bool, na_value=False))
        flags = flags.iloc[rows]
    cat = _category(flags)
    kinds = pd.Index(cat.categories).astype(str)

    def invalid(m: str) -> np.ndarray | None:
        bad_kinds = np.flatnonzero(kinds.str.contains(f"{m}_invalid", regex=False))
        if not len(bad_kinds):
            return None
        hit = np.isin(cat.codes, bad_kinds)
        if rows is None:
            return hit
        mask = np.zeros(n, dtype=bool)
        mask[rows[hit]] = True
        return mask

    return invalid


def _firsts(cell: np.ndarray) -> np.ndarray:
    """Position of the first row of each cell code (rows of a prepared frame are in cell order)."""
    if len(cell) > 1 and bool((cell[1:] >= cell[:-1]).all()):
        return np.flatnonzero(np.concatenate(([True], cell[1:] != cell[:-1])))
    return np.unique(cell, return_index=True)[1]


def cell_table(cur: pd.DataFrame) -> pd.DataFrame:
    """(key, profile) as text per cell code, indexed by the code."""
    at = _firsts(cur["cell"].to_numpy())
    t = pd.DataFrame({c: cur[c].iloc[at].to_numpy() for c in K},
                     index=pd.Index(cur["cell"].to_numpy()[at], name="cell"))
    return t.sort_index().astype(str)


def take_rows(frame: pd.DataFrame, keep: np.ndarray, columns: Iterable[str] | None = None) -> pd.DataFrame:
    """``frame[keep]`` (a boolean mask; only ``columns``, all by default) column by column: no copy
    of the whole frame into one block first. A few rows left out (an outlier module): the kept
    runs are copied as they lie (one slice each), not gathered row by row."""
    cols = list(frame.columns if columns is None else columns)
    drop = np.flatnonzero(~keep)
    if len(drop) * 64 < len(keep):
        runs = list(zip(np.concatenate(([0], drop + 1)).tolist(), [*drop.tolist(), len(keep)], strict=True))

        def cut(v: np.ndarray) -> np.ndarray:
            return np.concatenate([v[a:b] for a, b in runs])

        def column(c: str) -> Any:
            if isinstance(frame[c].dtype, pd.CategoricalDtype):
                return pd.Categorical.from_codes(cut(frame[c].array.codes), dtype=frame[c].dtype)
            return cut(frame[c].to_numpy())

        return pd.DataFrame({c: column(c) for c in cols}, index=pd.Index(cut(frame.index.to_numpy())), copy=False)
    at = np.flatnonzero(keep)
    return pd.DataFrame({c: frame[c].array.take(at) if isinstance(frame[c].dtype, pd.CategoricalDtype)
                         else frame[c].to_numpy()[at] for c in cols},
                        index=frame.index[at], copy=False)


def _exact(cur: pd.DataFrame, keep: np.ndarray | None) -> pd.Series:
    """Per metric: whether every figure of the kept rows has a badness (a figure <= 0 has none,
    see prepare); where one lacks it, its cell's figure median is taken directly (see summarise)."""
    with np.errstate(invalid="ignore"):
        return pd.Series([not bool(np.logical_and(cur[m].to_numpy() <= 0, True if keep is None else keep).any())
                          for m in ALL_METRICS], index=list(ALL_METRICS))


def _bcols(metrics: Iterable[str]) -> list[str]:
    return [B[m] for m in metrics]


def _has_value(df: pd.DataFrame, col: str) -> bool:
    """Whether a float column of a prepared frame has a figure (not NaN): its first rows are
    looked at first (a pandas ``notna().any()`` builds a Series of 1 M flags for each)."""
    v = df[col].to_numpy(dtype=float, na_value=np.nan)
    return not bool(np.isnan(v[:4096]).all()) or not bool(np.isnan(v).all())


def _present(df: pd.DataFrame, metrics: Iterable[str]) -> list[str]:
    return [m for m in metrics if _has_value(df, m)]


def _matrix(df: pd.DataFrame, cols: list[str]) -> np.ndarray:
    """Columns as one (rows, columns) float array, without pandas' block interleaving."""
    if not cols:
        return np.zeros((len(df), 0))
    return np.column_stack([df[c].to_numpy(dtype=float, na_value=np.nan) for c in cols])


def _columns(df: pd.DataFrame, cols: Iterable[str]) -> list[np.ndarray]:
    return [df[c].to_numpy(dtype=float, na_value=np.nan) for c in cols]


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
        lo_t, hi_t = groups.middles(_columns(inc, _bcols(todo)))
        lo, hi = np.empty((len(groups), len(ALL_METRICS))), np.empty((len(groups), len(ALL_METRICS)))
        for j, m in enumerate(ALL_METRICS):
            if m in known:
                lo[:, j], hi[:, j] = known[m]
            else:
                lo[:, j], hi[:, j] = lo_t[:, todo.index(m)], hi_t[:, todo.index(m)]
        self.groups = groups
        self.lo = pd.DataFrame(lo, index=groups.present, columns=list(ALL_METRICS))
        self.hi = pd.DataFrame(hi, index=groups.present, columns=list(ALL_METRICS))
        self.exact = _exact(inc, None) if exact is None else exact  # ``exact``: taken before inc lost its figures

    def badness(self, metrics: list[str]) -> np.ndarray:
        return np.asarray((self.lo[metrics].to_numpy() + self.hi[metrics].to_numpy()) / 2)

    def figure(self, m: str) -> np.ndarray:
        with np.errstate(over="ignore"):
            return np.asarray((np.exp(SIGN[m] * self.lo[m].to_numpy()) + np.exp(SIGN[m] * self.hi[m].to_numpy())) / 2)


def _included_middles(cur: pd.DataFrame, g: Groups, fleet: dict[str, tuple[np.ndarray, np.ndarray]],
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
            for i in np.flatnonzero(~fits & (n_inc > 0)).tolist():  # rows left out moved the middles far
                seg = b[g.starts[i]:g.ends[i]][ok_row[g.starts[i]:g.ends[i]]]
                part = np.partition(seg, (a[i], c[i]) if a[i] != c[i] else a[i])
                lo[i], hi[i] = part[a[i]], part[c[i]]
            out[m] = (lo[at], hi[at])
    return out


def _by_code(g: Groups, per_group: np.ndarray) -> np.ndarray:
    """Per-group results (present groups) spread to a table indexed by code (NaN where absent)."""
    size = int(g.present.max()) + 1 if len(g) else 0
    full = np.full((size, *per_group.shape[1:]), np.nan)
    full[g.present] = per_group
    return full


def _change(metric: str, d: Any) -> Any:
    """Badness difference (log units) -> relative change of the figure (value / reference - 1)."""
    return np.expm1(SIGN[metric] * d)


def _worse(metric: str, change: Any, tol: float) -> Any:
    return change <= -tol if METRICS[metric] else change >= tol


def _better(metric: str, change: Any, tol: float) -> Any:
    return change >= tol if METRICS[metric] else change <= -tol


def _sign_p(k: Any, n: Any) -> Any:
    """One-sided sign test: probability of >= k of n in one direction by chance (scipy binom)."""
    from scipy import stats  # heavy import: only when a report is built

    k = np.asarray(k, dtype=float)
    n = np.asarray(n, dtype=float)
    if k.ndim == 1 and k.shape == n.shape and len(k) > 1024 and bool((n >= 0).all()) and bool((k >= 0).all()):
        # many groups (one per module/key), few distinct (k, n): each pair's probability once
        # (scipy evaluates element by element: the same bits as over every group)
        width = int(n.max()) + 1
        if (int(k.max()) + 1) * width <= 2**18:  # a table of every (k, n) pair
            ki, ni = k.astype(np.int64), n.astype(np.int64)
            if np.array_equal(ki, k) and np.array_equal(ni, n):  # whole numbers (counts)
                code = ki * width + ni
                pairs = np.flatnonzero(np.bincount(code))
                table = np.zeros(int(pairs[-1]) + 1)
                kp, np_ = (pairs // width).astype(float), (pairs % width).astype(float)
                table[pairs] = np.where(np_ > 0, stats.binom.sf(kp - 1, np_, 0.5), 1.0)
                return np.take(table, code)
    return np.where(n > 0, stats.binom.sf(k - 1, n, 0.5), 1.0)


# -- outliers -----------------------------------------------------------------------------------
class Deviations:
    """Per (row, primary metric) of a prepared frame (rows in cell order, one column per present
    primary metric): the badness ``b``, its deviation ``dev`` from the cell's fleet median (log
    units; NaN where the row has no figure) and per cell code the robust scale (floored at
    ``z_floor``) that makes it a z. Kept as (rows, metrics) arrays: the long list of
    (row, metric) entries is only built for the few rows a finding names (:meth:`entries`)."""

    def __init__(self, metrics: list[str], b: list[np.ndarray], dev: np.ndarray, scale: np.ndarray,
                 codes: tuple[np.ndarray, np.ndarray, np.ndarray], nk: int, groups: Groups | None) -> None:
        self.metrics = metrics
        self.mi = np.array([PRIMARY_METRICS.index(m) for m in metrics], dtype=np.int8)  # column -> metric
        self.b = b  # the badness columns themselves (the prepared frame's, not a copy)
        self.dev, self.scale, self.groups = dev, scale, groups
        self.cell, self.mod, self.modkey = codes
        self.nk = nk  # modkey = mod * nk + key

    @classmethod
    def of(cls, cur: pd.DataFrame, metrics: list[str], dev: np.ndarray, scale: np.ndarray,
           groups: Groups) -> Deviations:
        codes = (cur["cell"].to_numpy(), cur["mod"].to_numpy(), cur["modkey"].to_numpy())
        return cls(metrics, [cur[B[m]].to_numpy() for m in metrics], dev, scale, codes,
                   len(cur["model_key"].cat.categories) + 1, groups)

    def only(self, rows: np.ndarray) -> Deviations:
        """The same deviations for some rows only (positions, in order): what refining the
        outliers needs, without holding every row's."""
        return Deviations(self.metrics, [b[rows] for b in self.b], self.dev[rows], self.scale,
                          (self.cell[rows], self.mod[rows], self.modkey[rows]), self.nk, None)

    @property
    def empty(self) -> bool:
        return not self.dev.size or bool(np.isnan(self.dev).all())

    def _z_counts(self) -> tuple[np.ndarray, np.ndarray]:
        """Per row: how many of its z (dev / the cell's scale) are above 3, below -3. Rows are in
        cell order: one cell's rows at a time, divided by that cell's scales (no rows x metrics
        array of scales)."""
        g = self.groups
        zpos, zneg = np.zeros(len(self.dev)), np.zeros(len(self.dev))
        if g is None or g.order is not None:  # not in cell order (not a prepared frame): one gather of the scales
            z = self.dev / np.take(self.scale, self.cell, axis=0)
            return _row_counts(z > 3.0), _row_counts(z < -3.0)
        for code, lo, hi in zip(g.present.tolist(), g.starts.tolist(), g.ends.tolist(), strict=True):
            z = self.dev[lo:hi] / self.scale[code]
            zpos[lo:hi] = _row_counts(z > 3.0)
            zneg[lo:hi] = _row_counts(z < -3.0)
        return zpos, zneg

    def stats(self) -> tuple[pd.DataFrame, pd.DataFrame | None]:
        """Outlier statistics per (module, key) and per module (None: fewer than 3 modules have a
        figure; a median of two says nothing about which one is out of line).

        Counts are taken per row and added up per module/key (one bincount each), a module's as
        the sum of its keys'. For the medians the entries are flattened with the rows in module
        order (each module's rows keep their cell order): every group is then one run of
        entries (see ``run_medians``); a median does not depend on the order of its values."""
        with np.errstate(invalid="ignore"):
            per_row = _row_counts(~np.isnan(self.dev))
            pos, neg = _row_counts(self.dev > 0.0), _row_counts(self.dev < 0.0)
            zpos, zneg = self._z_counts()
        size = int(self.modkey.max()) + 1
        counts = _packed_bincount(self.modkey, [per_row, pos, neg, zpos, zneg], size, len(self.metrics))
        by_mod = _by_module(self.mod)
        dev = self.dev if by_mod is None else np.take(self.dev, by_mod, axis=0)
        mod, modkey = ((self.mod, self.modkey) if by_mod is None else
                       (np.take(self.mod, by_mod), np.take(self.modkey, by_mod)))
        per_row = (per_row if by_mod is None else np.take(per_row, by_mod)).astype(np.intp)
        d = dev[~np.isnan(dev)]  # row-major: each row's metrics in turn
        del dev
        by_key = _outlier_stats(counts, _group_medians(d, np.repeat(modkey, per_row)))
        mods = np.zeros((-(-size // self.nk) * self.nk, counts.shape[1]))
        mods[:size] = counts
        mod_counts = mods.reshape(-1, self.nk, counts.shape[1]).sum(axis=1)  # whole numbers: exact
        if np.count_nonzero(mod_counts[:, 0]) < 3:
            return by_key, None
        return by_key, _outlier_stats(mod_counts, _group_medians(d, np.repeat(mod, per_row)))

    def entries(self, rows: np.ndarray, dev: np.ndarray | None = None) -> pd.DataFrame:
        """The (row, metric) entries with a deviation of the given rows (cell-order positions, in
        order), row-major: mod, modkey, cell, mi, b, dev, z, scale. ``dev``: other deviations of
        those rows (rows x metrics) in place of the fleet's (the entries stay those of the fleet's)."""
        own = self.dev[rows]
        r, c = np.nonzero(~np.isnan(own))
        at = rows[r]
        sc = self.scale[self.cell[at], c]
        d = (own if dev is None else dev)[r, c]
        b = np.empty(len(at))
        for j, col in enumerate(self.b):
            b[c == j] = col[at[c == j]]
        return pd.DataFrame({"mod": self.mod[at], "modkey": self.modkey[at], "cell": self.cell[at],
                             "mi": self.mi[c], "b": b, "dev": d, "z": d / sc, "scale": sc})


def fleet_deviation(cur: pd.DataFrame, th: Thresholds, groups: Groups | None = None
                    ) -> tuple[Deviations, pd.DataFrame, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Deviations of the primary metrics from the fleet median of their cell, per cell the robust
    spread (1.4826 MAD, log units ~ relative sd) of each primary metric, and per metric the two
    middle badness figures per cell (what :class:`Middles` reuses when no row is left out).

    ``dev``: badness minus the fleet median of the cell (log units); ``z``: dev / robust spread
    (floored at ``z_floor``).
    """
    metrics = _present(cur, PRIMARY_METRICS)
    cols = _bcols(metrics)
    if not cols:
        return Deviations.of(cur, [], np.zeros((len(cur), 0)), np.zeros((0, 0)),
                             groups or Groups(cur["cell"].to_numpy())), pd.DataFrame(), {}
    cell = cur["cell"].to_numpy()
    g = groups or Groups(cell)
    bs = _columns(cur, cols)  # contiguous columns: medians partition them without a copy first
    lo, hi = g.middles(bs)
    if g.order is None:  # rows in cell order: each cell's median repeated over its rows (no gather)
        devs = [b - np.repeat(med, g.ends - g.starts) for b, med in zip(bs, ((lo + hi) / 2).T, strict=True)]
    else:
        med = _by_code(g, (lo + hi) / 2)  # as Groups.median
        devs = [b - np.take(med[:, j], cell) for j, b in enumerate(bs)]
    spread_np = 1.4826 * g.median([np.abs(d) for d in devs])
    dev = np.column_stack(devs)
    del bs, devs
    spread = pd.DataFrame(spread_np, index=g.present, columns=cols)
    scale = np.maximum(_by_code(g, spread_np), th.z_floor)  # per (cell code, metric)
    return (Deviations.of(cur, metrics, dev, scale, g), spread.rename(columns={B[m]: m for m in metrics}),
            {m: (lo[:, j], hi[:, j]) for j, m in enumerate(metrics)})


def _packed_bincount(codes: np.ndarray, weights: list[np.ndarray], size: int, most: int) -> np.ndarray:
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
        for i in reversed(range(len(part))):  # highest field first
            field = np.floor(total / 2 ** (16 * i))
            total -= field * 2 ** (16 * i)
            cols.append((i + at, field))
    return np.column_stack([c for _, c in sorted(cols, key=lambda ic: ic[0])])


def _row_counts(mask: np.ndarray) -> np.ndarray:
    """How many true values in each row of a (rows, few columns) boolean array (a product with a
    column of ones: ``sum(axis=1)`` over a short axis costs ~6x as much)."""
    return (mask.view(np.uint8) @ np.ones(mask.shape[1], np.uint8)).astype(np.float64)  # bincount's weights


def _by_module(mod: np.ndarray) -> np.ndarray | None:
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


def _entry_counts(g: np.ndarray, dev: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Per group code ``g`` of each (row, metric) entry: entries, dev > 0, dev < 0, z > 3, z < -3
    (columns of one float array, indexed by code)."""
    size = int(g.max()) + 1 if len(g) else 0

    def below_above(v: np.ndarray, lo: float, hi: float) -> np.ndarray:
        """Per group: how many values below ``lo``, in between, above ``hi`` (one bincount)."""
        side = 1 + (v > hi).astype(np.int64) - (v < lo)
        return np.bincount(g * 3 + side, minlength=size * 3).reshape(size, 3).astype(float)

    sign, out = below_above(dev, 0.0, 0.0), below_above(z, -3.0, 3.0)
    return np.column_stack([sign.sum(axis=1), sign[:, 2], sign[:, 0], out[:, 2], out[:, 0]])


def _group_medians(dev: np.ndarray, g: np.ndarray) -> pd.Series:
    runs = run_medians(dev, g)  # entries laid out group by group (see Deviations.stats)
    if runs is not None:
        return pd.Series(runs[1], index=runs[0])
    return pd.Series(dev).groupby(g).median() + 0.0  # a zero median is +0.0, as run_medians gives it


def _outlier_stats(counts: np.ndarray, typ: pd.Series) -> pd.DataFrame:
    """Per group code (module or module/key), from its counts (:func:`_entry_counts`) and the
    median of its deviations: typical deviation, cells, sign test, share |z| > 3."""
    at = np.flatnonzero(counts[:, 0] > 0)  # the groups with an entry: arrays, one frame at the end
    cells, pos, neg, zpos, zneg = counts[at].T
    t = typ.to_numpy(dtype=float)
    if len(t) != len(at) or not np.array_equal(typ.index.to_numpy(), at):  # the medians' codes are those groups
        t = typ.reindex(at).to_numpy(dtype=float)
    up = t > 0
    p = np.minimum(1.0, 2 * _sign_p(np.where(up, pos, neg), pos + neg))
    return pd.DataFrame({"cells": cells, "pos": pos, "neg": neg, "zpos": zpos, "zneg": zneg, "typ": t, "p": p,
                         "share_out": np.where(up, zpos, zneg) / np.maximum(cells, 1),
                         "factor": np.exp(-t)},  # performance relative to the fleet median
                        index=pd.Index(at))


def _frame_stats(long: pd.DataFrame, by: str) -> pd.DataFrame:
    g, dev = long[by].to_numpy(), long["dev"].to_numpy()
    return _outlier_stats(_entry_counts(g, dev, long["z"].to_numpy()), _group_medians(dev, g))


class Names:
    """Text of the integer codes of one prepared frame."""

    def __init__(self, cur: pd.DataFrame) -> None:
        self.modules = cur["module"].cat.categories.astype(str)
        self.keys = cur["model_key"].cat.categories.astype(str)
        self.cells = cell_table(cur)
        self.nk = len(self.keys) + 1

    def module(self, code: int) -> str:
        return str(self.modules[code])

    def modkey(self, code: int) -> tuple[str, str]:
        return str(self.modules[code // self.nk]), str(self.keys[code % self.nk])


def find_outliers(dv: Deviations, names: Names, th: Thresholds) -> tuple[tuple[Outlier, ...], pd.DataFrame]:
    """Outlier modules, then outlier (module, key) pairs on the remaining modules; and the
    module x key deviation table (fraction of the fleet median; -0.12 = 12 % slower)."""
    if dv.empty:
        return (), pd.DataFrame()
    by_key, by_mod = dv.stats()
    deviation = _deviation(by_key, names)
    if by_mod is None:
        return (), deviation

    def hits(s: pd.DataFrame) -> pd.DataFrame:
        off = (s["factor"] - 1.0).abs() >= th.outlier_tolerance
        return s[off & (s["p"] < th.outlier_alpha)]

    mod_hits = hits(by_mod)
    key_hits = hits(by_key)
    key_hits = key_hits[~np.isin(key_hits.index.to_numpy() // names.nk, mod_hits.index.to_numpy())]
    found = [_outlier(dv.entries(np.flatnonzero(dv.mod == c)), names, "mod", int(c), r, th)
             for c, r in mod_hits.iterrows()]
    found += [_outlier(dv.entries(np.flatnonzero(dv.modkey == c)), names, "modkey", int(c), r, th)
              for c, r in key_hits.iterrows()]
    found.sort(key=lambda o: abs(math.log(o.factor)), reverse=True)
    return tuple(found), deviation


def _deviation(by_key: pd.DataFrame, names: Names) -> pd.DataFrame:
    """Module x key table of ``factor - 1``, labels sorted (as a pivot gives it), filled by code:
    codes number modules and keys in sorted order (prepare), so no text is hashed."""
    codes = by_key.index.to_numpy()
    mods, mrow = np.unique(codes // names.nk, return_inverse=True)
    keys, kcol = np.unique(codes % names.nk, return_inverse=True)
    table = np.full((len(mods), len(keys)), np.nan)
    table[mrow, kcol] = by_key["factor"].to_numpy() - 1.0
    t = pd.DataFrame(table, index=pd.Index(names.modules[mods], name="module"),
                     columns=pd.Index(names.keys[keys], name="model_key"))
    if not (t.index.is_monotonic_increasing and t.columns.is_monotonic_increasing):  # categories given unsorted
        t = t.sort_index(axis=0).sort_index(axis=1)
    return t


def refine_outliers(cur: pd.DataFrame, dv: Deviations, names: Names, outliers: tuple[Outlier, ...],
                    excluded: np.ndarray, deviation: pd.DataFrame, th: Thresholds,
                    inc: pd.DataFrame | None = None, mid: Middles | None = None
                    ) -> tuple[tuple[Outlier, ...], pd.DataFrame]:
    """The outliers' factors and worst cases against the fleet *without* them (the median of all
    modules is pulled a little toward the outliers)."""
    metrics = list(PRIMARY_METRICS)  # "mi" indexes these
    if mid is None:
        inc = take_rows(cur, ~excluded) if inc is None else inc
        mid = Middles(inc, Groups(inc["cell"].to_numpy()))
    med_np = np.full((int(cur["cell"].max()) + 1, len(metrics)), np.nan)
    med_np[mid.groups.present] = mid.badness(metrics)
    codes = [int(names.modules.get_loc(o.module)) for o in outliers]
    rows = np.flatnonzero(np.isin(dv.mod, codes))
    b = np.column_stack([col[rows] for col in dv.b]) if dv.b else np.zeros((len(rows), 0))
    mine = dv.entries(rows, b - med_np[dv.cell[rows]][:, dv.mi.astype(int)])
    by_mod, by_key = _frame_stats(mine, "mod"), _frame_stats(mine, "modkey")
    refined = []
    for o, code in zip(outliers, codes, strict=True):
        if o.model_key == FLEET:
            new = _outlier(mine, names, "mod", code, by_mod.loc[code], th)
        else:
            mk = code * names.nk + int(names.keys.get_loc(o.model_key))
            new = _outlier(mine, names, "modkey", mk, by_key.loc[mk], th)
        refined.append(new.model_copy(update={"p_value": o.p_value, "share_out": o.share_out}))
    upd = _deviation(by_key, names)
    dev_t = deviation.copy()
    dev_t.loc[upd.index, upd.columns] = upd
    return tuple(refined), dev_t


def _outlier(long: pd.DataFrame, names: Names, by: str, code: int, r: pd.Series, th: Thresholds) -> Outlier:
    sel = long[long[by].to_numpy() == code]
    direction = 1.0 if r["typ"] > 0 else -1.0
    worst = sel.assign(w=sel["dev"] * direction).nlargest(th.worst_cases, "w")
    metrics = PRIMARY_METRICS  # "mi" indexes these
    cases = []
    for w in worst.itertuples():  # the worst few
        m = metrics[int(w.mi)]
        value = math.exp(SIGN[m] * w.b)
        cases.append(WorstCase(model_key=str(names.cells.at[w.cell, "model_key"]),
                               profile=str(names.cells.at[w.cell, "profile"]), metric=m, value=value,
                               fleet_median=value * math.exp(-SIGN[m] * w.dev), z=float(w.z)))
    module, key = (names.module(code), FLEET) if by == "mod" else names.modkey(code)
    return Outlier(module=module, model_key=key, factor=float(r["factor"]), cells=int(r["cells"]),
                   share_out=float(r["share_out"]), p_value=float(r["p"]), worst=tuple(cases))


def outlier_mask(cur: pd.DataFrame, outliers: Iterable[Outlier]) -> np.ndarray:
    mask = np.zeros(len(cur), dtype=bool)
    for o in outliers:  # a few outliers; each a vectorised mask
        m = (cur["module"] == o.module).to_numpy()
        if o.model_key != FLEET:
            m = m & (cur["model_key"] == o.model_key).to_numpy()
        mask |= m
    return mask


# -- comparison with a reference ----------------------------------------------------------------
def reference(base: pd.DataFrame) -> pd.DataFrame:
    """Baseline figures per (key, profile) (text index): the median over the baseline's modules."""
    cols = [*ALL_METRICS, *_bcols(ALL_METRICS), "correct"]
    ref = base.groupby(K, observed=True)[cols].median().reset_index()
    ref[K] = ref[K].astype(str)
    return ref.set_index(K)


def diff_to_reference(cur: pd.DataFrame, ref: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per row of cur: ``d_<m>`` = badness minus the reference's (per key/profile); and per cell
    code the reference badness (``r_<m>``) and answer (``correct``)."""
    cells = cell_table(cur)
    r = ref[[*_bcols(ALL_METRICS), "correct"]].reindex(pd.MultiIndex.from_frame(cells[K]))
    r.index = cells.index
    r.columns = [*(f"r_{m}" for m in ALL_METRICS), "correct"]
    cell = cur["cell"].to_numpy()
    if len(cell) > 1 and bool((cell[1:] >= cell[:-1]).all()):  # rows in cell order (a prepared frame)
        sizes = np.bincount(cell)[cells.index.to_numpy()]

        def spread(per_cell: np.ndarray) -> np.ndarray:
            return np.repeat(per_cell, sizes)  # a sequential write, not a gather
    else:
        pos = np.full(int(cells.index.max()) + 1 if len(cells) else 0, -1)
        pos[cells.index.to_numpy()] = np.arange(len(cells))
        rows = np.take(pos, cell)

        def spread(per_cell: np.ndarray) -> np.ndarray:
            return np.take(per_cell, rows)
    out: dict[str, np.ndarray] = {c: cur[c].to_numpy() for c in ("mod", "key", "modkey", "cell")}
    for m in ALL_METRICS:
        out[f"d_{m}"] = cur[B[m]].to_numpy() - spread(r[f"r_{m}"].to_numpy())
    return pd.DataFrame(out, index=cur.index, copy=False), r


def _ident(df: pd.DataFrame, cats: dict[str, pd.Index]) -> np.ndarray:
    """One int64 per (module, key, profile), comparable between frames sharing ``cats``."""
    codes = [df[c].cat.set_categories(cats[c]).cat.codes.to_numpy().astype(np.int64) for c in ("module", *K)]
    ident = codes[0]
    for c, code in zip(K, codes[1:], strict=True):
        ident = ident * (len(cats[c]) + 1) + code
    return np.where(np.min(codes, axis=0) < 0, -1, ident)


def diff_to_previous(cur: pd.DataFrame, prev: pd.DataFrame) -> pd.DataFrame:
    """Per row of cur: ``d_<m>`` = badness minus the same module's previous figure (``r_<m>``)."""
    cats = {c: cur[c].cat.categories for c in ("module", *K)}
    mine, theirs = _ident(cur, cats), _ident(prev, cats)
    keep = theirs >= 0
    index = pd.Index(theirs[keep])
    pv = prev.loc[keep, [*_bcols(ALL_METRICS), "correct"]]
    if not index.is_unique:
        dup = index.duplicated(keep="last")
        index, pv = index[~dup], pv[~dup]
    pos = index.get_indexer(mine)
    found = pos >= 0
    take = np.where(found, pos, 0)  # a valid index everywhere; masked by ``found``

    def lookup(col: str) -> np.ndarray:
        values = pv[col].to_numpy(dtype=float, na_value=np.nan)
        if not len(values):  # no previous figure at all (e.g. the previous run failed before any row)
            return np.full(len(mine), np.nan)
        return np.where(found, values[take], np.nan)

    out: dict[str, np.ndarray] = {c: cur[c].to_numpy() for c in ("mod", "key", "modkey", "cell")}
    for m in ALL_METRICS:
        pb = lookup(B[m])
        out[f"d_{m}"] = cur[B[m]].to_numpy() - pb
        out[f"r_{m}"] = pb
    out["ref_correct"] = lookup("correct")
    return pd.DataFrame(out, index=cur.index, copy=False)


def _threshold(metric: str, tol: float) -> float:
    """Tolerance as a badness difference (log units)."""
    return -math.log(1 - tol) if METRICS[metric] else math.log(1 + tol)


def _cells(d: pd.DataFrame, metrics: list[str], names: Names, th: Thresholds,
           ref_cells: pd.DataFrame | None, groups: Groups | None = None, mid: Middles | None = None
           ) -> pd.DataFrame:
    """Per (key, profile, metric): fleet median of d, modules, modules worse *beyond tolerance*,
    reference (``ref_cells`` per cell code, else the geometric mean of the rows' ``r_<m>``);
    long and small."""
    dcols, rcols = [f"d_{m}" for m in metrics], [f"r_{m}" for m in metrics]
    cell = d["cell"].to_numpy()
    g = groups or Groups(cell)
    dv = _columns(d, dcols)
    if mid is not None and ref_cells is not None:  # d = badness - the cell's reference: shift the middles
        r = ref_cells[rcols].reindex(g.present).to_numpy()
        lo, hi = mid.lo[metrics].to_numpy() - r, mid.hi[metrics].to_numpy() - r
    else:
        lo, hi = g.middles(dv)
    # the lower median of the badness: with an even count the less bad of the middle two, so
    # that half of a small fleet is not a fleet-wide regression
    n_rows = g.ends - g.starts
    few = (n_rows < 12)[:, None]  # small fleets: the median of an even count matters
    med = pd.DataFrame(np.where(few, lo, (lo + hi) / 2), index=g.present, columns=dcols)
    if ref_cells is not None:
        med = med.join(ref_cells[rcols])
    else:
        total, count = g.sums(_columns(d, rcols))
        with np.errstate(invalid="ignore", divide="ignore"):
            med = med.join(pd.DataFrame(total / count, index=g.present, columns=rcols))
    thr = np.array([_threshold(m, th.tol(m)) for m in metrics])
    with np.errstate(invalid="ignore"):
        counts = g.counts([~np.isnan(v) for v in dv] + [v > t for v, t in zip(dv, thr, strict=True)])
    n = pd.DataFrame(counts[:, :len(dcols)], index=g.present, columns=dcols)
    pos = pd.DataFrame(counts[:, len(dcols):], index=g.present, columns=dcols)
    ids = names.cells.reindex(med.index)
    parts = [pd.DataFrame({"model_key": ids["model_key"], "profile": ids["profile"], "metric": m,
                           "d": med[f"d_{m}"], "n": n[f"d_{m}"], "worse": pos[f"d_{m}"],
                           "ref": np.exp(SIGN[m] * med[f"r_{m}"])})
             for m in metrics]
    cells = pd.concat(parts)
    cells.index.name = "cell"
    return cells[cells["n"] > 0].dropna(subset=["d"]).reset_index()


def _wilcoxon_groups(cells: pd.DataFrame, index: pd.MultiIndex) -> np.ndarray:
    """One-sided Wilcoxon signed-rank p (in the direction of the median) of each (key, metric)
    group's cell medians against 0 (groups: ``index``, sorted), one scipy call per group size
    (vectorised along the groups); each group's values in the order of ``cells``."""
    from scipy import stats

    at = index.get_indexer(pd.MultiIndex.from_arrays([cells["model_key"], cells["metric"]]))
    order = np.argsort(at, kind="stable")
    sizes = np.bincount(at, minlength=len(index))
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    d = cells["d"].to_numpy(dtype=float)[order]
    p = np.ones(len(index))
    for n in sorted(set(sizes.tolist())):  # a few distinct group sizes
        if n < 2:
            continue
        groups = np.flatnonzero(sizes == n)
        vals = d[starts[groups][:, None] + np.arange(n)]
        nonzero = np.abs(vals).max(axis=1) > 1e-12
        res = np.ones(len(vals))
        if nonzero.any():  # one-sided, in the direction of the group's median
            v = vals[nonzero]
            up = stats.wilcoxon(v, axis=1, zero_method="zsplit", alternative="greater").pvalue
            down = stats.wilcoxon(v, axis=1, zero_method="zsplit", alternative="less").pvalue
            res[nonzero] = np.where(np.median(v, axis=1) >= 0, up, down)
        p[groups] = res
    return p


def fleet_compare(d: pd.DataFrame, names: Names, against: str, th: Thresholds,
                  ref_cells: pd.DataFrame | None = None, groups: Groups | None = None, mid: Middles | None = None
                  ) -> tuple[list[Change], list[Regression], pd.DataFrame]:
    """Key-level changes (all of them) and the regressions among them, plus single-profile ones."""
    metrics = [m for m in ALL_METRICS if _has_value(d, f"d_{m}")]
    if not metrics:
        return [], [], pd.DataFrame()
    cells = _cells(d, metrics, names, th, ref_cells, groups, mid)
    changes: list[Change] = []
    regs: list[Regression] = []
    key_regressed: set[tuple[str, str]] = set()
    pairs = pd.MultiIndex.from_arrays([cells["model_key"], cells["metric"]])
    index = pairs.unique().sort_values()  # the (key, metric) groups, sorted as a groupby sorts them
    at = index.get_indexer(pairs)
    key_d, key_ref = Groups(at).median([cells["d"].to_numpy(dtype=float), cells["ref"].to_numpy(dtype=float)]).T
    key_n, key_p = np.bincount(at, minlength=len(index)), _wilcoxon_groups(cells, index)
    for i, (key, m) in enumerate(index):  # keys x metrics
        ch, p, base, n = float(_change(m, key_d[i])), float(key_p[i]), float(key_ref[i]), int(key_n[i])
        tol = th.tol(m)
        status: Status
        if _worse(m, ch, tol):
            status = "regressed" if p < th.alpha else "not significant"
        elif _better(m, ch, tol):
            status = "improved" if p < th.alpha else "not significant"
        else:
            status = "within tolerance"
        changes.append(Change(model_key=str(key), metric=m, against=against, baseline=base, value=base * (1 + ch),
                              change=ch, p_value=p, n=n, status=status))
        if status == "regressed":
            key_regressed.add((str(key), m))
            regs.append(Regression(module=FLEET, model_key=str(key), profile=FLEET, metric=m, baseline=base,
                                   value=base * (1 + ch), change=ch, against=against, p_value=p, n=n,
                                   detail=f"median over {n} profiles of the fleet median"))
    # one profile that moved beyond tolerance on (nearly) every module (sign test across modules)
    cells["change"] = _change_vec(cells)
    cells["tol"] = cells["metric"].map(th.tol)
    up = cells["metric"].map(METRICS).astype(bool)
    worse = np.where(up, cells["change"] <= -cells["tol"], cells["change"] >= cells["tol"])
    cells["p"] = _sign_p(cells["worse"], cells["n"])
    tested = cells["n"] >= th.min_modules_for_test
    # too few modules for a test: only a gross change (3x tolerance) of one profile is named
    gross = np.where(up, cells["change"] <= -3 * cells["tol"], cells["change"] >= 3 * cells["tol"])
    hit = worse & np.where(tested, cells["p"] < th.alpha_profile, gross)
    for r in cells[hit].itertuples():  # findings only
        if (str(r.model_key), str(r.metric)) in key_regressed:
            continue
        regs.append(Regression(module=FLEET, model_key=str(r.model_key), profile=str(r.profile), metric=str(r.metric),
                               baseline=float(r.ref), value=float(r.ref * (1 + r.change)), change=float(r.change),
                               against=against, p_value=float(r.p) if tested[r.Index] else None, n=int(r.n),
                               detail=f"{int(r.worse)} of {int(r.n)} modules worse than tolerance"))
    return changes, regs, cells


def _change_vec(cells: pd.DataFrame) -> np.ndarray:
    sign = cells["metric"].map(SIGN).to_numpy(dtype=float)
    return np.expm1(sign * cells["d"].to_numpy(dtype=float))


def module_compare(d: pd.DataFrame, names: Names, th: Thresholds, against: str = "previous",
                   explained: Iterable[tuple[str, str]] = ()) -> list[Regression]:
    """Per (module, key, metric) against that module's previous run: median over profiles + sign test.

    ``explained``: (key, metric) pairs a fleet-wide finding already covers; not repeated per module.
    """
    metrics = [m for m in ALL_METRICS if _has_value(d, f"d_{m}")]
    if not metrics:
        return []
    dcols = [f"d_{m}" for m in metrics]
    g = d["modkey"].to_numpy()
    med = d[dcols].groupby(g).median()
    pos = (d[dcols] > 0).groupby(g).sum()
    neg = (d[dcols] < 0).groupby(g).sum()
    regs: list[Regression] = []
    for m in metrics:
        dm = med[f"d_{m}"]
        ch = np.expm1(SIGN[m] * dm)
        k = np.where(dm > 0, pos[f"d_{m}"], neg[f"d_{m}"])
        n = pos[f"d_{m}"] + neg[f"d_{m}"]
        p = pd.Series(_sign_p(k, n), index=med.index)
        hit = _worse(m, ch, th.tol(m)) & (p < th.alpha)
        covered = [k for k, em in explained if em == DERIVED.get(m, m)]
        if covered:
            hit &= ~np.isin(med.index.to_numpy() % names.nk, names.keys.get_indexer(covered))
        codes = med.index[hit.to_numpy()]
        if not len(codes):
            continue
        sel = np.isin(g, codes)
        refs = np.exp(SIGN[m] * d.loc[sel, f"r_{m}"].groupby(g[sel]).median())
        for code in codes:  # findings only
            module, key = names.modkey(int(code))
            base = float(refs.loc[code])
            c = float(ch.loc[code])
            regs.append(Regression(module=module, model_key=key, profile=FLEET, metric=m, baseline=base,
                                   value=base * (1 + c), change=c, against=against, p_value=float(p.loc[code]),
                                   n=int(n.loc[code]), modules=(module,),
                                   detail=f"median over profiles vs this module's {against} run"))
    return regs


def correctness(cur: pd.DataFrame, ref_correct: np.ndarray, label: str) -> list[Regression]:
    """MTP prompts right in the reference (``ref_correct`` per row of cur: baseline per key/profile,
    or the same module's previous run) and wrong now."""
    flip = (cur["correct"].to_numpy() == 0.0) & (np.nan_to_num(ref_correct, nan=0.0) >= 0.5)
    if not flip.any():
        return []
    flips = pd.DataFrame({c: cur[c].to_numpy()[flip].astype(str) for c in ("module", *K)})
    answered = cur[cur["correct"].notna()].groupby("cell")["module"].nunique()
    cells = cur["cell"].to_numpy()[flip]
    flips["answered"] = answered.reindex(cells).to_numpy()
    regs: list[Regression] = []
    for (key, prof), grp in flips.groupby(K):  # flipped prompts only
        mods = tuple(sorted(grp["module"]))
        every = len(mods) == int(grp["answered"].iloc[0]) and len(mods) > 1
        for module in [FLEET] if every else mods:
            regs.append(Regression(module=module, model_key=key, profile=prof, metric="correct", baseline=1.0,
                                   value=0.0, change=None, against=label, n=len(mods),
                                   modules=() if every else (module,),
                                   detail=f"wrong on {len(mods)} module(s), right in {label}"))
    return regs


# -- folding ------------------------------------------------------------------------------------
def fold(regs: list[Regression], outliers: tuple[Outlier, ...]) -> list[Regression]:
    """One finding per cause: derived metrics into their primary, previous into baseline, module
    findings into fleet findings or the module's outlier entry."""
    fleet_kpm = {(r.model_key, r.profile, DERIVED.get(r.metric, r.metric)) for r in regs if r.module == FLEET}
    out_mods = {o.module for o in outliers if o.model_key == FLEET}
    out_mk = {(o.module, o.model_key) for o in outliers}

    def explained(r: Regression) -> bool:
        metric = DERIVED.get(r.metric, r.metric)
        by_fleet = (r.model_key, FLEET, metric) in fleet_kpm or (r.model_key, r.profile, metric) in fleet_kpm
        return by_fleet or r.module in out_mods or (r.module, r.model_key) in out_mk

    kept = [r for r in regs if r.module == FLEET or not explained(r)]
    # same finding against both references -> one entry
    merged: dict[tuple[str, str, str, str], Regression] = {}
    for r in kept:
        ident = (r.module, r.model_key, r.profile, r.metric)
        if ident in merged:
            a = merged[ident]
            extra = f"; vs {r.against}: {r.change:+.1%}" if r.change is not None else f"; also vs {r.against}"
            merged[ident] = a.model_copy(update={"against": f"{a.against}+{r.against}", "detail": a.detail + extra})
        else:
            merged[ident] = r
    # derived metric moved with its primary -> related
    result: dict[tuple[str, str, str, str], Regression] = {}
    for ident, r in merged.items():
        prim = DERIVED.get(r.metric)
        pid = (r.module, r.model_key, r.profile, prim) if prim else None
        if pid and pid in merged:
            continue
        result[ident] = r
    for r in merged.values():
        prim = DERIVED.get(r.metric)
        pid = (r.module, r.model_key, r.profile, prim) if prim else None
        if pid and pid in result and r.change is not None:
            p = result[pid]
            result[pid] = p.model_copy(update={"related": (*p.related, f"{r.metric} {r.change:+.1%}")})
    order = {"correct": 1}
    return sorted(result.values(), key=lambda r: (r.module != FLEET, r.model_key, order.get(r.metric, 0),
                                                  r.profile, r.metric, r.module))


# -- summary and completeness -------------------------------------------------------------------
def summarise(cur: pd.DataFrame, rows: pd.DataFrame, ref: pd.DataFrame | None, included: np.ndarray,
              spread: pd.DataFrame, groups: Groups | None = None, mid: Middles | None = None
              ) -> pd.DataFrame:
    """Per (key, profile, metric): fleet median (``fleet``: without outlier modules), robust spread
    (1.4826 MAD of log figures ~ relative sd), min, max, count, baseline and change."""
    metrics = _present(cur, ALL_METRICS)
    if not metrics:
        return pd.DataFrame()
    cell = cur["cell"].to_numpy()
    g = groups or Groups(cell)
    vals = _columns(cur, metrics)
    mn, mx = g.extremes(vals)
    count = g.counts([~np.isnan(v) for v in vals])
    agg = {"min": pd.DataFrame(mn, index=g.present, columns=metrics),
           "max": pd.DataFrame(mx, index=g.present, columns=metrics),
           "count": pd.DataFrame(count.astype(np.int64), index=g.present, columns=metrics)}
    gi = mid.groups if mid is not None else Groups(cell[included])
    inc = pd.DataFrame(index=gi.present)
    for m, v in zip(metrics, vals, strict=True):
        inc[m] = mid.figure(m) if mid is not None and mid.exact[m] else gi.median([v[included]])[:, 0]
    ids = cell_table(cur)
    at = _firsts(cell)  # each cell's first row: its position in ``rows`` is the prepared frame's index
    first = rows.iloc[cur.index.to_numpy()[at]].reindex(columns=list(_SHAPE)).set_axis(cell[at])
    refv = ref.reindex(pd.MultiIndex.from_frame(ids[K])) if ref is not None else None
    parts = []
    for m in metrics:
        sp = DERIVED.get(m, m)
        part = pd.DataFrame({"model_key": ids["model_key"], "profile": ids["profile"], "metric": m,
                             "fleet": inc[m],
                             "spread": spread[sp] if sp in spread.columns else np.nan,
                             "min": agg["min"][m], "max": agg["max"][m], "count": agg["count"][m]})
        if refv is not None:
            part["baseline"] = refv[m].to_numpy()
            part["change"] = part["fleet"] / part["baseline"] - 1
        parts.append(part)
    s = pd.concat(parts).join(first).reset_index(drop=True)  # one join of each cell's shape, not one per metric
    s["table"] = s["table"].astype(str)
    return s[s["count"] > 0].reset_index(drop=True)


def completeness(cur: pd.DataFrame, names: Names, ref: pd.DataFrame | None, expected_modules: Iterable[str],
                 expected_keys: Iterable[str]) -> list[str]:
    notes: list[str] = []
    mk = cur["modkey"].to_numpy()
    # one count per module/key code, whether or not the last codes have rows (a module that lacks the last key)
    counts = np.bincount(mk, minlength=len(names.modules) * names.nk)
    codes = np.flatnonzero(counts)  # module/key pairs with rows (names only for the few a note shows)
    mods, keys = list(expected_modules), list(expected_keys)
    missing: list[tuple[str, str]] = []
    if mods and keys:
        mc = names.modules.get_indexer(mods)
        kc = names.keys.get_indexer(keys)
        want = (np.repeat(mc, len(kc)) * names.nk + np.tile(kc, len(mc)))
        have = (np.repeat(mc, len(kc)) >= 0) & (np.tile(kc, len(mc)) >= 0)
        have[have] = counts[want[have]] > 0
        missing = [(mods[i // len(keys)], keys[i % len(keys)]) for i in np.flatnonzero(~have)]
    if missing:
        shown = ", ".join(f"{m}/{k}" for m, k in missing[:8])
        more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
        notes.append(f"no results for {len(missing)} module/key pair(s): {shown}{more}")
    if ref is not None and len(cur):
        want = ref.reset_index().groupby("model_key")["profile"].nunique()
        wants = want.reindex(names.keys).to_numpy(dtype=float)[codes % names.nk]  # per key code, not per text
        short = np.flatnonzero(counts[codes] < np.nan_to_num(wants, nan=0.0))
        for i in short[:8].tolist():
            module, key = names.modkey(int(codes[i]))
            notes.append(f"{module}/{key}: {counts[codes[i]]} of {int(wants[i])} profiles")
        if len(short) > 8:
            notes.append(f"... {len(short) - 8} more module/key pairs with missing profiles")
    return notes


# -- the release's benchmark against the agent's probe -----------------------------------------
def split_sources(df: pd.DataFrame | None) -> tuple[pd.DataFrame | None, pd.DataFrame | None]:
    """(rows the release's benchmark measured, rows the agent's probe measured); frames without a
    ``source`` column are all the release's."""
    if df is None or "source" not in df.columns:
        return df, None
    probe = (df["source"] == "probe").to_numpy(dtype=bool, na_value=False)  # a missing source: the release's
    if not probe.any():
        return df, None
    return df[~probe].reset_index(drop=True), df[probe].reset_index(drop=True)


def probe_disagreements(rows: pd.DataFrame, probe: pd.DataFrame | None,
                        tol: float) -> tuple[tuple[Disagreement, ...], int]:
    """Figures of release rows farther than ``tol`` (relative) from the probe row of the same
    (module, key, profile); and how many release rows have a probe row."""
    ids = list(_IDS)
    if probe is None or not len(probe) or not len(rows):
        return (), 0
    metrics = [m for m in COMPARED if m in rows.columns and m in probe.columns]
    both = rows[ids + metrics].astype({c: str for c in ids}).merge(
        probe[ids + metrics].astype({c: str for c in ids}).drop_duplicates(ids), on=ids, suffixes=("", "__probe"))
    found: list[Disagreement] = []
    for m in metrics:
        a = pd.to_numeric(both[m], errors="coerce").to_numpy(dtype=float)
        b = pd.to_numeric(both[f"{m}__probe"], errors="coerce").to_numpy(dtype=float)
        with np.errstate(invalid="ignore", divide="ignore"):
            change = a / b - 1
            hit = (a > 0) & (b > 0) & (np.abs(change) > tol)
        for i in np.flatnonzero(hit):  # findings only
            found.append(Disagreement(module=str(both["module"].iat[i]), model_key=str(both["model_key"].iat[i]),
                                      profile=str(both["profile"].iat[i]), metric=m, release=float(a[i]),
                                      probe=float(b[i]), change=float(change[i])))
    order = {m: i for i, m in enumerate(COMPARED)}
    found.sort(key=lambda d: (d.model_key, d.module, d.profile, order[d.metric]))
    return tuple(found), len(both)


# -- the whole report ---------------------------------------------------------------------------
def analyse(rows: pd.DataFrame, *, run_id: str = "", release: str = "", baseline: pd.DataFrame | None = None,
            baseline_id: str | None = None, baseline_label: str = "baseline", previous: pd.DataFrame | None = None,
            previous_label: str = "previous", state: str = "done", expected_modules: Iterable[str] = (),
            expected_keys: Iterable[str] = (), thresholds: Thresholds | None = None) -> Report:
    """Build a report from frames of result rows (one column per ``ResultRow`` field).

    Rows the agent's probe measured (``source == "probe"``) never enter the figures: they are
    only compared with the release's rows of the same module, key and profile."""
    th = thresholds or Thresholds()
    rows, probe = split_sources(rows)
    assert rows is not None
    baseline, previous = split_sources(baseline)[0], split_sources(previous)[0]
    disagreements, probe_checked = probe_disagreements(rows, probe, th.probe_tolerance)
    cur = prepare(rows)
    base = prepare(baseline) if baseline is not None and len(baseline) else None
    prev = prepare(previous) if previous is not None and len(previous) else None
    notes: list[str] = []
    ref = reference(base) if base is not None else None
    if ref is None and prev is None:
        notes.append("no baseline and no previous run: only the modules are compared with each other")
    elif ref is None and previous_label == "previous":
        notes.append("no baseline: only each module's previous run and the fleet itself are compared")

    names = Names(cur)
    cells_all = Groups(cur["cell"].to_numpy())  # sorted once, reused by every per-cell median
    devs, spread, fleet_mid = fleet_deviation(cur, th, cells_all)
    outliers, deviation = find_outliers(devs, names, th)
    # refining takes the outlier modules' rows only: the rest goes before the included rows are taken
    devs = devs.only(np.flatnonzero(np.isin(devs.mod, [names.modules.get_loc(o.module) for o in outliers])))
    excluded = outlier_mask(cur, outliers)
    some_excluded = bool(excluded.any()) and bool((~excluded).any())
    # the included rows without their figures (the comparisons take badness only); which
    # metrics have a figure <= 0 among them is taken first
    exact = _exact(cur, ~excluded if some_excluded else None)
    inc = take_rows(cur, ~excluded, [c for c in cur.columns if c not in ALL_METRICS]) if some_excluded else cur
    cells_inc = Groups(inc["cell"].to_numpy()) if some_excluded else cells_all
    # nothing left out: the fleet's middles of the primary metrics are those of the included rows
    mid = (Middles(inc, cells_inc, exact, _included_middles(cur, cells_all, fleet_mid, excluded, cells_inc))
           if some_excluded else
           Middles(inc, cells_inc, exact, fleet_mid) if not excluded.any() else None)
    if some_excluded:
        outliers, deviation = refine_outliers(cur, devs, names, outliers, excluded, deviation, th, inc, mid)
    del devs  # not needed past the outliers: its memory goes before the comparisons take theirs

    changes: list[Change] = []
    regs: list[Regression] = []
    if ref is not None and len(inc):
        d, ref_cells = diff_to_reference(inc, ref)
        ch, rg, _ = fleet_compare(d, names, baseline_label, th, ref_cells, cells_inc, mid)
        changes += ch
        regs += rg
        right = np.full(int(ref_cells.index.max()) + 1, np.nan)  # the reference's answer per cell code
        right[ref_cells.index.to_numpy()] = ref_cells["correct"].to_numpy(dtype=float)
        regs += correctness(inc, np.take(right, inc["cell"].to_numpy()), baseline_label)
    prev_ids: tuple[str, ...] = ()
    if prev is not None and len(inc):
        prev_ids = tuple(sorted(map(str, previous["run_id"].unique()))) if previous is not None else ()
        dp = diff_to_previous(cur, prev)
        ch, rg, _ = fleet_compare(take_rows(dp, ~excluded) if some_excluded else dp, names, previous_label, th,
                                  groups=cells_inc)
        changes += ch
        regs += rg
        fleet_wide = {(r.model_key, DERIVED.get(r.metric, r.metric)) for r in regs
                      if r.module == FLEET and r.profile == FLEET}
        regs += module_compare(dp, names, th, previous_label, fleet_wide)
        regs += correctness(cur, dp["ref_correct"].to_numpy(dtype=float), previous_label)
    regressions = tuple(fold(regs, outliers))

    notes += completeness(cur, names, ref, expected_modules, expected_keys)
    verdict = decide(state, len(cur), regressions, notes, expected_modules, expected_keys)
    return Report(
        run_id=run_id, release=release, baseline_id=baseline_id, previous_ids=prev_ids, verdict=verdict,
        regressions=regressions, outliers=outliers, changes=tuple(changes), notes=tuple(notes),
        modules=tuple(sorted(map(str, cur["module"].unique()))), thresholds=th,
        summary=summarise(cur, rows, ref, ~excluded, spread, cells_all, mid), rows=rows, reference=ref,
        deviation=deviation, disagreements=disagreements, probe_checked=probe_checked,
    )


def decide(state: str, n_rows: int, regressions: tuple[Regression, ...], notes: list[str],
           expected_modules: Iterable[str], expected_keys: Iterable[str]) -> Verdict:
    if state == "failed" or n_rows == 0:
        return "failed"
    if regressions:
        return "regressed"
    incomplete = state in ("running", "cancelled") or any(
        n.startswith("no results") or " of " in n and "profiles" in n for n in notes)
    return "incomplete" if incomplete else "pass"


