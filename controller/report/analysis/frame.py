"""The rows frame, encoded for the analysis: integer codes per cell, float figures, badness columns.

Every figure becomes a *badness* in log units, ``b = ±log(value)``, signed so that larger is
worse (tok/s: higher is better; ms: lower is better). :func:`prepare` types a frame of result
rows once (categorical ids, ``mod`` / ``key`` / ``cell`` codes, invalid figures blanked) and puts
its rows in cell order, so that every per-cell reduction beneath (:mod:`.groups`) is a slice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pandas as pd

from contract.records import METRICS
from controller.report.model import ALL_METRICS, ReportError

K = ["model_key", "profile"]


SIGN: dict[str, float] = {m: (-1.0 if up else 1.0) for m, up in METRICS.items()}


B = {m: f"b_{m}" for m in ALL_METRICS}


IDS = ("module", "model_key", "profile")


SHAPE = ("table", "prefill_len", "input_tokens", "prefix_tokens")


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
    # e.g. ``correct``: True / False / None; np.asarray makes None NaN
    if col.dtype == object:
        try:
            return np.asarray(col.to_numpy(), dtype=float)
        except (TypeError, ValueError):
            pass  # text in it: coerced below
    return pd.to_numeric(col, errors="coerce").astype(float).to_numpy()


def _reordering(order: np.ndarray | None, sizes: np.ndarray) -> Callable[[Any], Any]:
    """A column (array or Categorical) with its rows in ``order`` (None: as it is). Where every cell has
    as many rows and the rows came module by module, each with every cell in cell order (a run as
    the history stores it), ``order`` is the transpose of a (rows per cell, cells) grid: a copy of
    the transposed column (~2 ms a million floats), not a gather (~4 ms, itself ~20 % faster than
    ``np.take`` with numpy 2.4)."""
    if order is None:
        return lambda v: v
    cells = len(sizes)
    per = len(order) // cells if cells else 0
    grid = (cells > 1 and per * cells == len(order) and bool((sizes == per).all())
            and bool((order.reshape(cells, per) == np.arange(0, len(order), cells)
                      + np.arange(cells)[:, None]).all()))

    def rows(v: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(v.reshape(per, cells).T).reshape(-1) if grid else v[order]

    def reorder(v: Any) -> Any:
        if isinstance(v, pd.Categorical):
            return pd.Categorical.from_codes(rows(np.asarray(v.codes)), dtype=v.dtype)
        return rows(v)

    return reorder


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

    ids = {c: _category(col(c)) for c in IDS}
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
    # factorized: codes 0..k-1, all present
    sizes = np.bincount(cell) if n else np.zeros(0, dtype=np.int64)
    firsts = None if order is None else order[np.concatenate(([0], np.cumsum(sizes)[:-1]))]

    def by_cell(v: Any) -> Any:
        if firsts is None:
            return v
        if isinstance(v, pd.Categorical):
            return pd.Categorical.from_codes(np.repeat(np.take(v.codes, firsts), sizes), dtype=v.dtype)
        return np.repeat(np.take(v, firsts), sizes)

    in_order = _reordering(order, sizes)
    cols: dict[str, Any] = {c: by_cell(v) if c in K else in_order(v) for c, v in ids.items()}
    cols["correct"] = in_order(_numeric(col("correct")))
    invalid = _invalid(col("flags"))
    blank = no_figures(n)
    with np.errstate(invalid="ignore", divide="ignore"):
        for m in ALL_METRICS:
            v = _numeric(col(m)) if m in df.columns else blank
            # no figure (a metric the run does not measure): no badness either
            if v is blank or all_nan(v):
                cols[m] = cols[B[m]] = blank
                continue
            bad = invalid(m)
            if bad is not None:
                v = np.where(bad, np.nan, v)
            v = in_order(v)
            cols[m] = v
            # then the sign (an exact flip) and NaN where there is no badness, in place
            b = np.log(v)
            if SIGN[m] < 0:
                np.negative(b, out=b)
            b[~(v > 0)] = np.nan
            cols[B[m]] = b
    cols["mod"], cols["key"] = in_order(mod), by_cell(key)
    cols["cell"] = by_cell(cell)
    cols["modkey"] = cols["mod"] * code(nk) + cols["key"]
    index = pd.RangeIndex(n) if order is None else pd.Index(order)
    return pd.DataFrame(cols, index=index, copy=False)


def no_figures(n: int) -> np.ndarray:
    """An all-NaN float column of ``n`` rows, read-only: one array shared by every column without a figure (of a
    1 M-row run, 8 MB each: a run measures no energy, no start-up costs, often no vision, in 12 of 26 columns)."""
    blank = np.full(n, np.nan)
    blank.flags.writeable = False
    return blank


def all_nan(v: np.ndarray) -> bool:
    """Whether a float column has no figure (its first rows looked at first)."""
    return bool(np.isnan(v[:4096]).all()) and bool(np.isnan(v).all())


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


def first_rows(cell: np.ndarray) -> np.ndarray:
    """Position of the first row of each cell code (rows of a prepared frame are in cell order)."""
    if len(cell) > 1 and bool((cell[1:] >= cell[:-1]).all()):
        return np.flatnonzero(np.concatenate(([True], cell[1:] != cell[:-1])))
    return np.unique(cell, return_index=True)[1]


def cell_table(cur: pd.DataFrame) -> pd.DataFrame:
    """(key, profile) as text per cell code, indexed by the code."""
    at = first_rows(cur["cell"].to_numpy())
    t = pd.DataFrame({c: cur[c].iloc[at].to_numpy() for c in K},
                     index=pd.Index(cur["cell"].to_numpy()[at], name="cell"))
    return t.sort_index().astype(str)


def positions_taker(rows: np.ndarray | None, n: int) -> Callable[[np.ndarray], np.ndarray]:
    """``v[rows]`` of a column of ``n`` rows (``rows``: increasing positions; None: every row, ``v`` itself). Where
    only a few rows are missing (an outlier module's), the runs kept are copied as they lie (one slice each), not
    gathered row by row (as :func:`take_rows`)."""
    if rows is None:
        return lambda v: v
    # increasing positions, as many as rows: every row
    if len(rows) == n:
        return lambda v: v.copy()
    if (n - len(rows)) * 64 < n:
        gone = np.ones(n, dtype=bool)
        gone[rows] = False
        drop = np.flatnonzero(gone)
        runs = list(zip(np.concatenate(([0], drop + 1)).tolist(), [*drop.tolist(), n], strict=True))
        return lambda v: np.concatenate([v[a:b] for a, b in runs])
    return lambda v: v[rows]


def take_rows(frame: pd.DataFrame, keep: np.ndarray, columns: Iterable[str] | None = None) -> pd.DataFrame:
    """``frame[keep]`` (a boolean mask; only ``columns``, all by default) column by column: no copy
    of the whole frame into one block first. A few rows left out (an outlier module): the kept
    runs are copied as they lie (one slice each), not gathered row by row. Float columns without a
    figure give one shared all-NaN column (:func:`no_figures`), not a copy each."""
    cols = list(frame.columns if columns is None else columns)
    drop = np.flatnonzero(~keep)
    if len(drop) * 64 < len(keep):
        runs = list(zip(np.concatenate(([0], drop + 1)).tolist(), [*drop.tolist(), len(keep)], strict=True))

        def take(v: np.ndarray) -> np.ndarray:
            return np.concatenate([v[a:b] for a, b in runs])
    else:
        at = np.flatnonzero(keep)

        def take(v: np.ndarray) -> np.ndarray:
            return v[at]
    blank: list[np.ndarray] = []

    def column(c: str) -> Any:
        if isinstance(frame[c].dtype, pd.CategoricalDtype):
            return pd.Categorical.from_codes(take(frame[c].array.codes), dtype=frame[c].dtype)
        v = frame[c].to_numpy()
        if v.dtype.kind == "f" and all_nan(v):
            blank[:] = blank or [no_figures(len(keep) - len(drop))]
            return blank[0]
        return take(v)

    return pd.DataFrame({c: column(c) for c in cols}, index=pd.Index(take(frame.index.to_numpy())), copy=False)


def exact_metrics(cur: pd.DataFrame, keep: np.ndarray | None) -> pd.Series:
    """Per metric: whether every figure of the kept rows has a badness (a figure <= 0 has none,
    see prepare); where one lacks it, its cell's figure median is taken directly (see summarise)."""
    def exact(v: np.ndarray) -> bool:
        if all_nan(v):  # no figure (a metric not run): none <= 0
            return True
        with np.errstate(invalid="ignore"):
            return not bool(np.logical_and(v <= 0, True if keep is None else keep).any())

    return pd.Series([exact(cur[m].to_numpy()) for m in ALL_METRICS], index=list(ALL_METRICS))


def badness_columns(metrics: Iterable[str]) -> list[str]:
    return [B[m] for m in metrics]


def has_value(df: pd.DataFrame, col: str) -> bool:
    """Whether a float column of a prepared frame has a figure (not NaN): its first rows are
    looked at first (a pandas ``notna().any()`` builds a Series of 1 M flags for each)."""
    v = df[col].to_numpy(dtype=float, na_value=np.nan)
    return not bool(np.isnan(v[:4096]).all()) or not bool(np.isnan(v).all())


def present_metrics(df: pd.DataFrame, metrics: Iterable[str]) -> list[str]:
    return [m for m in metrics if has_value(df, m)]


def float_columns(df: pd.DataFrame, cols: Iterable[str]) -> list[np.ndarray]:
    return [df[c].to_numpy(dtype=float, na_value=np.nan) for c in cols]


def relative_change(metric: str, d: Any) -> Any:
    """Badness difference (log units) -> relative change of the figure (value / reference - 1)."""
    return np.expm1(SIGN[metric] * d)


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
