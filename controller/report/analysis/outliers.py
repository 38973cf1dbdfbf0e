"""Outlier modules: each module's deviation from the fleet median, and which modules are out of line.

Per (model key, profile, metric) each module's deviation from the fleet median and its robust
z (median / MAD). A module whose *typical* deviation over all its figures is beyond the outlier
tolerance and one-sided by a sign test is named once, with its factor and worst cases; then the
same per (module, model key) on the other modules (the rule: :func:`verdict.outlier_hits`).
Outlier modules are then left out of the fleet figures, and their factors taken again against
the fleet without them (:func:`refine_outliers`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import numpy as np
import pandas as pd

from controller.report.analysis.frame import SIGN, B, Names, badness_columns, float_columns, present_metrics, take_rows
from controller.report.analysis.groups import (
    Groups,
    by_code,
    by_module,
    medians_of_runs,
    row_counts,
    run_medians,
)
from controller.report.analysis.middles import Middles
from controller.report.analysis.stats import median_intervals, sign_p
from controller.report.analysis.verdict import outlier_hits
from controller.report.model import (
    FLEET,
    PRIMARY_METRICS,
    SPEED_PRIMARY,
    Outlier,
    Thresholds,
    WorstCase,
)


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
        # the badness columns themselves (the prepared frame's, not a copy)
        self.b = b
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
        # not in cell order (not a prepared frame): one gather of the scales
        if g is None or g.order is not None:
            z = self.dev / np.take(self.scale, self.cell, axis=0)
            return row_counts(z > 3.0), row_counts(z < -3.0)
        for code, lo, hi in zip(g.present.tolist(), g.starts.tolist(), g.ends.tolist(), strict=True):
            z = self.dev[lo:hi] / self.scale[code]
            zpos[lo:hi] = row_counts(z > 3.0)
            zneg[lo:hi] = row_counts(z < -3.0)
        return zpos, zneg

    def stats(self) -> tuple[pd.DataFrame, pd.DataFrame | None]:
        """Outlier statistics per (module, key) and per module (None: fewer than 3 modules have a
        figure; a median of two says nothing about which one is out of line).

        The rows are put in (module, key) order once (stable: a module's rows keep their cell order):
        every module/key and every module is then one run of rows, and of entries once the rows'
        figures are flattened (row-major, NaN left out). Counts are per-row counts added up per run
        (whole numbers: exact), a module's as the sum of its keys'; medians partition each run (see
        :func:`medians_of_runs`); a median does not depend on the order of its values."""
        with np.errstate(invalid="ignore"):
            zpos, zneg = self._z_counts()
        reorder = self._module_key_order()
        dev, modkey = reorder(self.dev), reorder(self.modkey)
        with np.errstate(invalid="ignore"):
            ok = ~np.isnan(dev)
            per_row = row_counts(ok)
            cols = [per_row, row_counts(dev > 0.0), row_counts(dev < 0.0),
                    reorder(zpos), reorder(zneg)]
        # row-major: each row's metrics in turn, each module/key's rows together
        d = np.compress(ok.reshape(-1), dev.reshape(-1))
        # rows one run
        del dev, ok
        first = np.flatnonzero(np.concatenate(([True], modkey[1:] != modkey[:-1])))
        ids = modkey[first]
        # per module/key: whole numbers, exact
        runs = np.column_stack([np.add.reduceat(c, first) for c in cols])
        at = np.concatenate(([0], np.cumsum(per_row, dtype=np.int64)[:-1]))[first]  # its first entry
        size = int(ids[-1]) + 1
        counts = np.zeros((size, runs.shape[1]))
        counts[ids] = runs
        by_key = _outlier_stats(counts, _run_medians(d, at, ids, runs[:, 0]))
        mod_of = ids // self.nk
        mfirst = np.flatnonzero(np.concatenate(([True], mod_of[1:] != mod_of[:-1])))
        mruns = np.add.reduceat(runs, mfirst, axis=0)  # whole numbers: exact
        mod_counts = np.zeros((-(-size // self.nk), runs.shape[1]))
        mod_counts[mod_of[mfirst]] = mruns
        if np.count_nonzero(mod_counts[:, 0]) < 3:
            return by_key, None
        return by_key, _outlier_stats(mod_counts, _run_medians(d, at[mfirst], mod_of[mfirst], mruns[:, 0]))

    def _module_key_order(self) -> Callable[[np.ndarray], np.ndarray]:
        """Rows (in cell order) put in (module, key) order, stable: by module alone where the cells come in key
        order (each module's rows then do too), else by module/key code. Where every cell has the same modules in
        the same (increasing) order, a module's rows are every cell's row at its place: the transpose of a
        (cells, modules) grid, one copy, not a sort and a gather."""
        g, n = self.groups, len(self.mod)
        perm: np.ndarray | None
        if g is not None and g.order is None and len(g):
            # the key of each cell's run of rows
            keys = self.modkey[g.starts] % self.nk
            if len(keys) < 2 or bool((keys[1:] >= keys[:-1]).all()):
                cells, per = len(g), n // len(g)
                if cells > 1 and per > 1 and bool((g.ends - g.starts == per).all()):
                    grid = self.mod.reshape(cells, per)
                    if bool((grid[0, 1:] > grid[0, :-1]).all()) and bool((grid == grid[0]).all()):
                        return _grid_transpose(cells, per)
                perm = by_module(self.mod)
            else:
                perm = by_module(self.modkey)
        else:
            perm = by_module(self.modkey)
        if perm is None:
            return lambda v: v
        # numpy 2.4: v[perm] the faster
        return lambda v: v[perm] if v.ndim == 1 else np.take(v, perm, axis=0)


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


def _grid_transpose(rows: int, cols: int) -> Callable[[np.ndarray], np.ndarray]:
    """The rows of a (rows x cols) grid, laid out row by row, put column by column: a column by a transposed
    copy (~2 ms a million floats); rows of several values (a rows x metrics array) by a gather of whole rows
    (a transposed copy of rows of 4 floats moves 4 at a time: 4x slower)."""
    perm: list[np.ndarray] = []

    def reorder(v: np.ndarray) -> np.ndarray:
        if v.ndim == 1:
            return np.ascontiguousarray(v.reshape(rows, cols).T).reshape(-1)
        perm[:] = perm or [np.arange(rows * cols).reshape(rows, cols).T.reshape(-1)]
        return np.take(v, perm[0], axis=0)

    return reorder


def fleet_deviation(cur: pd.DataFrame, th: Thresholds, groups: Groups | None = None,
                    among: Iterable[str] = SPEED_PRIMARY
                    ) -> tuple[Deviations, pd.DataFrame, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """Deviations of the primary metrics from the fleet median of their cell, per cell the robust
    spread (1.4826 MAD, log units ~ relative sd) of each primary metric, and per metric the two
    middle badness figures per cell (what :class:`Middles` reuses when no row is left out).

    ``dev``: badness minus the fleet median of the cell (log units); ``z``: dev / robust spread
    (floored at ``z_floor``). ``among``: the primary metrics looked at (default: the speed metrics; the
    energy metrics make outliers of their own, :func:`energy_outliers`).
    """
    metrics = present_metrics(cur, among)
    cols = badness_columns(metrics)
    if not cols:
        return Deviations.of(cur, [], np.zeros((len(cur), 0)), np.zeros((0, 0)),
                             groups or Groups(cur["cell"].to_numpy())), pd.DataFrame(), {}
    cell = cur["cell"].to_numpy()
    g = groups or Groups(cell)
    # contiguous columns: medians partition them without a copy first
    bs = float_columns(cur, cols)
    lo, hi = g.middles(bs)
    mid = (lo + hi) / 2  # as Groups.median
    med = mid if g.order is None else by_code(g, mid)
    dev = np.empty((len(cell), len(bs)))
    spread_np = np.empty((len(g), len(bs)))
    # one metric at a time: its deviations, then their absolute values in place
    for j, b in enumerate(bs):
        # rows in cell order: each cell's median repeated over its rows (no gather)
        d = b - (np.repeat(med[:, j], g.ends - g.starts) if g.order is None else np.take(med[:, j], cell))
        dev[:, j] = d
        spread_np[:, j] = 1.4826 * g.median([np.abs(d, out=d)])[:, 0]
    del bs
    spread = pd.DataFrame(spread_np, index=g.present, columns=cols)
    scale = np.maximum(by_code(g, spread_np), th.z_floor)  # per (cell code, metric)
    return (Deviations.of(cur, metrics, dev, scale, g), spread.rename(columns={B[m]: m for m in metrics}),
            {m: (lo[:, j], hi[:, j]) for j, m in enumerate(metrics)})


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


def _run_medians(d: np.ndarray, at: np.ndarray, ids: np.ndarray, sizes: np.ndarray) -> pd.Series:
    """Median per code ``ids`` (increasing) of the entries ``d[at[i]:at[i] + sizes[i]]`` (no NaN; runs in
    order, covering ``d``); codes without an entry are left out."""
    has = sizes > 0
    at, ids = (at, ids) if bool(has.all()) else (at[has], ids[has])
    runs = medians_of_runs(d, at, ids) if len(d) else (ids, np.zeros(0))
    if runs is not None:
        return pd.Series(runs[1], index=runs[0])
    return _group_medians(d, np.repeat(ids, sizes[has].astype(np.int64)))


def _group_medians(dev: np.ndarray, g: np.ndarray) -> pd.Series:
    # entries laid out group by group (see Deviations.stats)
    runs = run_medians(dev, g)
    if runs is not None:
        return pd.Series(runs[1], index=runs[0])
    # a zero median is +0.0, as run_medians gives it
    return pd.Series(dev).groupby(g).median() + 0.0


def _outlier_stats(counts: np.ndarray, typ: pd.Series) -> pd.DataFrame:
    """Per group code (module or module/key), from its counts (:func:`_entry_counts`) and the
    median of its deviations: typical deviation, cells, sign test, share |z| > 3."""
    # the groups with an entry: arrays, one frame at the end
    at = np.flatnonzero(counts[:, 0] > 0)
    cells, pos, neg, zpos, zneg = counts[at].T
    t = typ.to_numpy(dtype=float)
    # the medians' codes are those groups
    if len(t) != len(at) or not np.array_equal(typ.index.to_numpy(), at):
        t = typ.reindex(at).to_numpy(dtype=float)
    up = t > 0
    p = np.minimum(1.0, 2 * sign_p(np.where(up, pos, neg), pos + neg))
    return pd.DataFrame({"cells": cells, "pos": pos, "neg": neg, "zpos": zpos, "zneg": zneg, "typ": t, "p": p,
                         "share_out": np.where(up, zpos, zneg) / np.maximum(cells, 1),
                         "factor": np.exp(-t)},  # relative to the fleet median
                        index=pd.Index(at))


def _frame_stats(long: pd.DataFrame, by: str) -> pd.DataFrame:
    g, dev = long[by].to_numpy(), long["dev"].to_numpy()
    return _outlier_stats(_entry_counts(g, dev, long["z"].to_numpy()), _group_medians(dev, g))


def find_outliers(dv: Deviations, names: Names, th: Thresholds) -> tuple[tuple[Outlier, ...], pd.DataFrame]:
    """Outlier modules, then outlier (module, key) pairs on the remaining modules; and the
    module x key deviation table (fraction of the fleet median; -0.12 = 12 % slower)."""
    if dv.empty:
        return (), pd.DataFrame()
    by_key, by_mod = dv.stats()
    deviation = _deviation(by_key, names)
    if by_mod is None:
        return (), deviation

    mod_hits = by_mod[outlier_hits(by_mod, th)]
    key_hits = by_key[outlier_hits(by_key, th)]
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
    # categories given unsorted
    if not (t.index.is_monotonic_increasing and t.columns.is_monotonic_increasing):
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
    for w in worst.itertuples():
        m = metrics[int(w.mi)]
        value = math.exp(SIGN[m] * w.b)
        cases.append(WorstCase(model_key=str(names.cells.at[w.cell, "model_key"]),
                               profile=str(names.cells.at[w.cell, "profile"]), metric=m, value=value,
                               fleet_median=value * math.exp(-SIGN[m] * w.dev), z=float(w.z)))
    module, key = (names.module(code), FLEET) if by == "mod" else names.modkey(code)
    # the factor's interval: the median's distribution-free 95 % interval over the same deviations
    dev = sel["dev"].to_numpy(dtype=float)
    dev = dev[~np.isnan(dev)]
    lo, hi = median_intervals(dev, np.zeros(len(dev), dtype=np.int64), 1)
    ci = (None, None) if np.isnan(lo[0]) else (math.exp(-float(hi[0])), math.exp(-float(lo[0])))
    return Outlier(module=module, model_key=key, factor=float(r["factor"]), cells=int(r["cells"]),
                   share_out=float(r["share_out"]), p_value=float(r["p"]), worst=tuple(cases), ci_low=ci[0],
                   ci_high=ci[1])


def outlier_mask(cur: pd.DataFrame, outliers: Iterable[Outlier]) -> np.ndarray:
    mask = np.zeros(len(cur), dtype=bool)
    # a few outliers; each a vectorised mask
    for o in outliers:
        m = (cur["module"] == o.module).to_numpy()
        if o.model_key != FLEET:
            m = m & (cur["model_key"] == o.model_key).to_numpy()
        mask |= m
    return mask
