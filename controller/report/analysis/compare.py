"""The run against a reference: per row the difference to the baseline or the module's previous run.

Fleet level: per (key, profile, metric) the fleet median and the fleet trimmed mean of the difference; per
(key, metric) the Hodges-Lehmann centre over profiles of the trimmed means with a Wilcoxon signed-rank test
across profiles; per profile a sign test across modules (on the medians). Module level: each module against
its own previous run (median over profiles, sign test). MTP answers right in the reference and wrong now. What
of it counts as a regression is :mod:`.verdict`'s to say.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from contract.records import ENERGY_METRICS, WINDOW_METRICS
from controller.report.analysis.frame import (
    SIGN,
    B,
    K,
    Names,
    all_nan,
    badness_columns,
    cell_table,
    float_columns,
    has_value,
    no_figures,
    positions_taker,
    relative_change,
    take_rows,
)
from controller.report.analysis.groups import Groups
from controller.report.analysis.middles import Middles
from controller.report.analysis.stats import (
    hodges_lehmann_groups,
    median_intervals,
    sign_p,
    wilcoxon_groups,
    window_interval,
    window_t_p,
)
from controller.report.analysis.verdict import (
    LOWER_MEDIAN_BELOW,
    TRIM_UP_TO,
    answer_flipped,
    key_status,
    module_regressed,
    profile_regressed,
    threshold,
)
from controller.report.model import ALL_METRICS, DERIVED, FLEET, Change, Regression, Thresholds


def reference(base: pd.DataFrame) -> pd.DataFrame:
    """Baseline figures per (key, profile) (text index): the median over the baseline's modules."""
    cols = [*ALL_METRICS, *badness_columns(ALL_METRICS), "correct"]
    ref = base.groupby(K, observed=True)[cols].median().reset_index()
    ref[K] = ref[K].astype(str)
    return ref.set_index(K)


def diff_to_reference(cur: pd.DataFrame, ref: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per row of cur: ``d_<m>`` = badness minus the reference's (per key/profile); and per cell
    code the reference badness (``r_<m>``) and answer (``correct``)."""
    cells = cell_table(cur)
    r = ref[[*badness_columns(ALL_METRICS), "correct"]].reindex(pd.MultiIndex.from_frame(cells[K]))
    r.index = cells.index
    r.columns = [*(f"r_{m}" for m in ALL_METRICS), "correct"]
    cell = cur["cell"].to_numpy()
    # rows in cell order (a prepared frame)
    if len(cell) > 1 and bool((cell[1:] >= cell[:-1]).all()):
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
    # every difference without a figure on either side (see prepare)
    blank = no_figures(len(cell))
    for m in ALL_METRICS:
        b, ref_b = cur[B[m]].to_numpy(), r[f"r_{m}"].to_numpy()
        out[f"d_{m}"] = blank if all_nan(b) or bool(np.isnan(ref_b).all()) else b - spread(ref_b)
    return pd.DataFrame(out, index=cur.index, copy=False), r


def _ident(df: pd.DataFrame, cats: dict[str, pd.Index], rows: np.ndarray | None = None) -> np.ndarray:
    """One int64 per (module, key, profile) (of ``rows`` only, positions; None: every row), comparable between
    frames sharing ``cats``. A column whose categories already are ``cats`` (the run's own frame) keeps its codes:
    no recoding of a million rows."""

    def codes_of(c: str) -> np.ndarray:
        col = df[c]
        same = col.cat.categories.equals(cats[c])
        codes = (col if same else col.cat.set_categories(cats[c])).cat.codes.to_numpy()
        return (codes if rows is None else codes[rows]).astype(np.int64)

    codes = [codes_of(c) for c in ("module", *K)]
    ident = codes[0].copy()
    for c, code in zip(K, codes[1:], strict=True):
        ident *= len(cats[c]) + 1
        ident += code
    # a value outside ``cats``
    missing = [code < 0 for code in codes if len(code) and int(code.min()) < 0]
    if missing:
        ident[np.logical_or.reduce(missing)] = -1
    return ident


# per row of cur: its row among prev's figures (-1: none); and those figures
PreviousMatch = tuple[np.ndarray, pd.DataFrame]


def previous_match(cur: pd.DataFrame, prev: pd.DataFrame) -> PreviousMatch:
    """Each row of cur's row (position) among the same module's previous figures (badness and ``correct``, one row
    per module/key/profile: the last), -1 where the previous run has none; and those figures."""
    cats = {c: cur[c].cat.categories for c in ("module", *K)}
    theirs = _ident(prev, cats)
    keep = theirs >= 0
    index = pd.Index(theirs[keep])
    pv = prev.loc[keep, [*badness_columns(ALL_METRICS), "correct"]]
    if not index.is_unique:
        dup = index.duplicated(keep="last")
        index, pv = index[~dup], pv[~dup]
    # only cur's rows of a module the previous run has are looked up (a previous run of a few of the modules:
    # a few thousand rows, not a million); the others have no previous figure
    # ident = module code * span + ...
    span = (len(cats["model_key"]) + 1) * (len(cats["profile"]) + 1)
    has = np.zeros(len(cats["module"]) + 1, dtype=bool)
    has[np.unique(index.to_numpy() // span)] = True
    codes = cur["module"].cat.codes.to_numpy()
    rows = np.flatnonzero(has[np.where(codes >= 0, codes, len(cats["module"]))])
    out = np.full(len(cur), -1, dtype=np.intp)
    out[rows] = index.get_indexer(_ident(cur, cats, rows))
    return out, pv


def diff_to_previous(cur: pd.DataFrame, prev: pd.DataFrame, rows: np.ndarray | None = None,
                     match: PreviousMatch | None = None) -> pd.DataFrame:
    """Per row of cur (of ``rows``, positions in cur, in order; None: every row): ``d_<m>`` = badness minus the
    same module's previous figure (``r_<m>``). ``match``: :func:`previous_match` of the same frames, taken once."""
    pos, pv = match if match is not None else previous_match(cur, prev)
    take = positions_taker(rows, len(cur))
    pos = take(pos)
    found = pos >= 0
    every = bool(found.all())
    # the rows with a previous figure, where some lack one
    at = None if every else np.flatnonzero(found)

    # shared by every column without a figure (see prepare)
    blank = no_figures(len(pos))

    def lookup(col: str) -> np.ndarray:
        values = pv[col].to_numpy(dtype=float, na_value=np.nan)
        # no previous figure (of this metric) at all
        if not len(values) or bool(np.isnan(values).all()):
            return blank
        if at is None:
            return values[pos]
        # gathered only where found (a previous run of a few of the modules)
        out = np.full(len(pos), np.nan)
        out[at] = values[pos[at]]
        return out

    def mine(c: str) -> np.ndarray:
        return take(cur[c].to_numpy())

    out: dict[str, np.ndarray] = {c: mine(c) for c in ("mod", "key", "modkey", "cell")}
    for m in ALL_METRICS:
        pb = lookup(B[m])
        if pb is blank:
            d = blank
        elif at is None:
            d = mine(B[m]) - pb
        # a difference only where there is a previous figure: cur's badness there, not all of it
        else:
            d = np.full(len(pos), np.nan)
            b = cur[B[m]].to_numpy()
            d[at] = b[at if rows is None else rows[at]] - pb[at]
        out[f"d_{m}"] = d
        out[f"r_{m}"] = pb
    out["ref_correct"] = lookup("correct")
    return pd.DataFrame(out, index=cur.index if rows is None else cur.index[rows], copy=False)


# every row's groups (rows in cell order), and the positions among them of d's rows
Among = tuple[Groups, np.ndarray]


def _cells(d: pd.DataFrame, metrics: list[str], names: Names, th: Thresholds,
           ref_cells: pd.DataFrame | None, groups: Groups | None = None, mid: Middles | None = None,
           among: Among | None = None) -> pd.DataFrame:
    """Per (key, profile, metric): fleet median of d, modules, modules worse *beyond tolerance*,
    reference (``ref_cells`` per cell code, else the geometric mean of the rows' ``r_<m>``);
    long and small. ``among``: d holds only some rows of a cell's (those with a difference); the others count
    as rows of the cell (a small fleet's lower median, the trimmed mean up to TRIM_UP_TO rows) and as zeros in
    the sum of the references, added in the same order as over every row (a different order of additions can
    move the last bit)."""
    dcols, rcols = [f"d_{m}" for m in metrics], [f"r_{m}" for m in metrics]
    cell = d["cell"].to_numpy()
    g = groups or Groups(cell)
    # g's cells among every row's
    every = np.searchsorted(among[0].present, g.present) if among is not None else None
    dv = float_columns(d, dcols)
    # d = badness - the cell's reference: shift the middles
    if mid is not None and ref_cells is not None:
        r = ref_cells[rcols].reindex(g.present).to_numpy()
        lo, hi = mid.lo[metrics].to_numpy() - r, mid.hi[metrics].to_numpy() - r
    else:
        lo, hi = g.middles(dv)
    # the lower median of the badness: with an even count the less bad of the middle two, so
    # that half of a small fleet is not a fleet-wide regression
    n_rows = g.ends - g.starts if among is None or every is None else (among[0].ends - among[0].starts)[every]
    # small fleets: the median of an even count matters
    few = (n_rows < LOWER_MEDIAN_BELOW)[:, None]
    med = pd.DataFrame(np.where(few, lo, (lo + hi) / 2), index=g.present, columns=dcols)
    # the key-level figure's cells: the trimmed mean; a cell of more than TRIM_UP_TO modules keeps its median. A
    # small even cell takes its lower median only where its middle two modules differ by more than the tolerance
    # (a split fleet: half of it moves no key figure); where they agree, the trimmed mean: the lower median of a
    # fleet of 4 at 1 % noise read every change 0.3 % better than it was (a planted -6 % as -5.7 %), the same way
    # on every profile, which the interval over profiles cannot see (it held the change in 60-67 % of runs; ADR 0042)
    thr = np.array([threshold(m, th.tol(m)) for m in metrics])
    with np.errstate(invalid="ignore"):
        split = ~(hi - lo <= thr[None, :])
    trimmed = g.trimmed_means(dv, LOWER_MEDIAN_BELOW, TRIM_UP_TO, None if among is None else n_rows, split)
    trim = pd.DataFrame(np.where((n_rows > TRIM_UP_TO)[:, None], med.to_numpy(), trimmed), index=g.present,
                        columns=dcols)
    if ref_cells is not None:
        med = med.join(ref_cells[rcols])
    else:
        total, count = (g.sums(float_columns(d, rcols)) if among is None or every is None else
                        _sums_among(among, every, float_columns(d, rcols)))
        with np.errstate(invalid="ignore", divide="ignore"):
            med = med.join(pd.DataFrame(total / count, index=g.present, columns=rcols))
    with np.errstate(invalid="ignore"):
        counts = g.counts([~np.isnan(v) for v in dv] + [v > t for v, t in zip(dv, thr, strict=True)])
    n = pd.DataFrame(counts[:, :len(dcols)], index=g.present, columns=dcols)
    pos = pd.DataFrame(counts[:, len(dcols):], index=g.present, columns=dcols)
    ids = names.cells.reindex(med.index)
    parts = [pd.DataFrame({"model_key": ids["model_key"], "profile": ids["profile"], "metric": m,
                           "d": med[f"d_{m}"], "t": trim[f"d_{m}"], "n": n[f"d_{m}"], "worse": pos[f"d_{m}"],
                           "ref": np.exp(SIGN[m] * med[f"r_{m}"])})
             for m in metrics]
    cells = pd.concat(parts)
    cells.index.name = "cell"
    return cells[cells["n"] > 0].dropna(subset=["d"]).reset_index()


def _sums_among(among: Among, every: np.ndarray, cols: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """:meth:`Groups.sums` over every row of ``among`` (its rows in cell order), where only the rows at its
    positions have a value (the others NaN): per column, zeros with those values in place, added per cell as
    Groups.sums adds them (pairwise, in row order), and the count of values; per cell of ``every``."""
    full, at = among
    cell_of = np.repeat(np.arange(len(full)), full.ends - full.starts)[at]
    total = np.zeros((len(every), len(cols)))
    count = np.zeros((len(every), len(cols)), dtype=np.int64)
    if len(full):
        for j, v in enumerate(cols):
            ok = ~np.isnan(v)
            z = np.zeros(len(full.codes))
            z[at[ok]] = v[ok]
            total[:, j] = np.add.reduceat(z, full.starts)[every]
            count[:, j] = np.bincount(cell_of[ok], minlength=len(full))[every]
    return total, count


def fleet_compare(d: pd.DataFrame, names: Names, against: str, th: Thresholds,
                  ref_cells: pd.DataFrame | None = None, groups: Groups | None = None, mid: Middles | None = None,
                  among: Among | None = None) -> tuple[list[Change], list[Regression], pd.DataFrame]:
    """Key-level changes (all of them) and the regressions among them, plus single-profile ones. ``among``: d
    holds some of the rows only, those with a difference (see :func:`_cells`)."""
    metrics = [m for m in ALL_METRICS if has_value(d, f"d_{m}")]
    if not metrics:
        return [], [], pd.DataFrame()
    cells = _cells(d, metrics, names, th, ref_cells, groups, mid, among)
    changes: list[Change] = []
    regs: list[Regression] = []
    key_regressed: set[tuple[str, str]] = set()
    pairs = pd.MultiIndex.from_arrays([cells["model_key"], cells["metric"]])
    # the (key, metric) groups, sorted as a groupby sorts them
    index = pairs.unique().sort_values()
    at = index.get_indexer(pairs)
    # the key's figure: the Hodges-Lehmann centre over its profiles of the cells' trimmed means (see .verdict)
    key_d, d_lo, d_hi = hodges_lehmann_groups(cells["t"].to_numpy(dtype=float), at, len(index))
    (key_ref,) = Groups(at).median([cells["ref"].to_numpy(dtype=float)]).T
    key_n, key_p = np.bincount(at, minlength=len(index)), wilcoxon_groups(cells, index, "t")
    windows = _window_key_tests(d, [m for m in metrics if m in WINDOW_METRICS], names)
    for i, (key, m) in enumerate(index):
        ch, p, base, n = float(relative_change(m, key_d[i])), float(key_p[i]), float(key_ref[i]), int(key_n[i])
        lo, hi = _change_bounds(m, float(d_lo[i]), float(d_hi[i]))
        # one window (or start) per module: the mean change over the modules' windows, its t-test and t-interval
        # (none below MIN_WINDOWS_FOR_INTERVAL), not the profiles' (one figure repeated)
        if m in WINDOW_METRICS:
            w = windows.get((str(key), m))
            p, n = (w.p, w.n) if w is not None else (1.0, 0)
            if w is not None:
                ch = float(relative_change(m, w.mean))
            lo, hi = _change_bounds(m, *w.interval) if w is not None and w.interval else (None, None)
        status = key_status(m, ch, p, th, base)
        changes.append(Change(model_key=str(key), metric=m, against=against, baseline=base, value=base * (1 + ch),
                              change=ch, p_value=p, n=n, status=status, ci_low=lo, ci_high=hi))
        if status == "regressed":
            key_regressed.add((str(key), m))
            what = (f"t-test over {n} modules' benchmark windows (tolerance {th.tol(m):.0%})" if m in ENERGY_METRICS
                    else f"t-test over {n} modules' starts (tolerance {th.tol(m):.0%}, floor {th.startup_floor_s:g} s)"
                    if m in WINDOW_METRICS else f"centre over {n} profiles of the fleet trimmed mean")
            regs.append(Regression(module=FLEET, model_key=str(key), profile=FLEET, metric=m, baseline=base,
                                   value=base * (1 + ch), change=ch, against=against, p_value=p, n=n,
                                   detail=what, ci_low=lo, ci_high=hi))
    # one profile that moved beyond tolerance on (nearly) every module (sign test across modules)
    cells["change"] = _change_vec(cells)
    cells["p"] = sign_p(cells["worse"], cells["n"])
    hit, tested = profile_regressed(cells, th)
    # a profile has no energy or start figure of its own
    hit &= ~cells["metric"].isin(WINDOW_METRICS).to_numpy()
    found = cells[hit]
    found = found[[(str(k), str(m)) not in key_regressed for k, m in zip(found["model_key"], found["metric"],
                                                                          strict=True)]]
    lows, highs = _cell_intervals(d, found)
    for r, lo, hi in zip(found.itertuples(), lows, highs, strict=True):
        regs.append(Regression(module=FLEET, model_key=str(r.model_key), profile=str(r.profile), metric=str(r.metric),
                               baseline=float(r.ref), value=float(r.ref * (1 + r.change)), change=float(r.change),
                               against=against, p_value=float(r.p) if tested[r.Index] else None, n=int(r.n),
                               detail=f"{int(r.worse)} of {int(r.n)} modules worse than tolerance",
                               ci_low=lo, ci_high=hi))
    return changes, regs, cells


@dataclass(frozen=True)
class WindowTest:
    """A key's energy or start-up change over its modules' windows (log units): the one-sided t-test's p, how many
    windows, their mean change, its 95 % t-interval (None: too few windows, or none spread)."""

    p: float
    n: int
    mean: float
    interval: tuple[float, float] | None


def _window_key_tests(d: pd.DataFrame, metrics: list[str], names: Names) -> dict[tuple[str, str], WindowTest]:
    """Per (key, energy or start-up metric): a one-sample t-test over the modules' window changes (each module's
    median over its profiles: one window, one start, one figure), their mean and its interval. A key's dozen rows of
    one window are not a dozen figures: tested over its profiles, two runs of one release on identical simulated
    modules (5 % window noise) came out "regressed" on J/token 10 times in 10, and four modules' starts made a
    zero-width interval "+800.0 % [+800.0 %, +800.0 %]" (every profile carries the same start)."""
    out: dict[tuple[str, str], WindowTest] = {}
    g = d["modkey"].to_numpy()
    for m in metrics:
        # per (module, key): its window's change
        per = d[f"d_{m}"].groupby(g).median().dropna()
        for code, v in per.groupby(per.index.to_numpy() % names.nk):
            x = v.to_numpy(dtype=float)
            out[(str(names.keys[int(code)]), m)] = WindowTest(window_t_p(x), len(x), float(np.mean(x)),
                                                              window_interval(x))
    return out


def _change_bounds(metric: str, lo: float, hi: float) -> tuple[float | None, float | None]:
    """An interval of badness (log units) as an interval of the change (None, None where there is none)."""
    if np.isnan(lo) or np.isnan(hi):
        return None, None
    # a badness bound is a change bound
    a, b = sorted(float(relative_change(metric, x)) for x in (lo, hi))
    return a, b


def _cell_intervals(d: pd.DataFrame, found: pd.DataFrame) -> tuple[list[float | None], list[float | None]]:
    """Per finding (a row of the cells table: cell code, metric): the distribution-free 95 % interval of the
    fleet median of the change, from the order statistics of the cell's modules (none below 6 modules).
    Only the findings' cells are read: nothing is added to a report without them."""
    lows: list[float | None] = []
    highs: list[float | None] = []
    if not len(found):
        return lows, highs
    cell = d["cell"].to_numpy()
    codes = found["cell"].to_numpy()
    rows = np.flatnonzero(np.isin(cell, codes))
    for code, metric in zip(codes.tolist(), found["metric"].astype(str), strict=True):
        v = d[f"d_{metric}"].to_numpy(dtype=float)[rows[cell[rows] == code]]
        v = v[~np.isnan(v)]
        lo, hi = median_intervals(v, np.zeros(len(v), dtype=np.int64), 1)
        a, b = _change_bounds(metric, float(lo[0]), float(hi[0]))
        lows.append(a)
        highs.append(b)
    return lows, highs


def _change_vec(cells: pd.DataFrame) -> np.ndarray:
    sign = cells["metric"].map(SIGN).to_numpy(dtype=float)
    return np.expm1(sign * cells["d"].to_numpy(dtype=float))


def _with_figures(d: pd.DataFrame, cols: list[str]) -> pd.DataFrame:
    """The rows of ``d`` with a figure (not NaN) in any of ``cols``, with ``modkey`` and those columns: where a
    previous run had a few of the modules, most rows have none. A row without one adds nothing to a median or a
    count, and a module/key none of whose rows has one is no finding (n = 0: p = 1); the groupbys then run over
    those rows only, not the run's every row."""
    live = np.zeros(len(d), dtype=bool)
    for c in cols:
        live |= ~np.isnan(d[c].to_numpy(dtype=float, na_value=np.nan))
    if bool(live.all()):
        return d
    return take_rows(d, live, ["modkey", *cols])


def module_compare(d: pd.DataFrame, names: Names, th: Thresholds, against: str = "previous",
                   explained: Iterable[tuple[str, str]] = ()) -> list[Regression]:
    """Per (module, key, metric) against that module's previous run: median over profiles + sign test.

    ``explained``: (key, metric) pairs a fleet-wide finding already covers; not repeated per module.
    """
    # not energy nor start-up costs: one window (one start) against one is no test (a module's energy out of line
    # with the fleet's is an energy outlier; the fleet's change a key-level finding over the modules' windows)
    metrics = [m for m in ALL_METRICS if has_value(d, f"d_{m}") and m not in WINDOW_METRICS]
    if not metrics:
        return []
    dcols = [f"d_{m}" for m in metrics]
    d = _with_figures(d, [*dcols, *(f"r_{m}" for m in metrics)])
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
        p = pd.Series(sign_p(k, n), index=med.index)
        hit = module_regressed(m, ch, p, th)
        covered = [k for k, em in explained if em == DERIVED.get(m, m)]
        if covered:
            hit &= ~np.isin(med.index.to_numpy() % names.nk, names.keys.get_indexer(covered))
        codes = med.index[hit.to_numpy()]
        if not len(codes):
            continue
        sel = np.isin(g, codes)
        refs = np.exp(SIGN[m] * d.loc[sel, f"r_{m}"].groupby(g[sel]).median())
        # the median's distribution-free interval over the module's profiles (the sign test's order statistics)
        dm_sel, g_sel = d.loc[sel, f"d_{m}"].to_numpy(dtype=float), g[sel]
        has = ~np.isnan(dm_sel)
        at = np.searchsorted(codes.to_numpy(), g_sel[has])
        m_lo, m_hi = median_intervals(dm_sel[has], at, len(codes))
        for i, code in enumerate(codes):
            module, key = names.modkey(int(code))
            base = float(refs.loc[code])
            c = float(ch.loc[code])
            lo, hi = _change_bounds(m, float(m_lo[i]), float(m_hi[i]))
            regs.append(Regression(module=module, model_key=key, profile=FLEET, metric=m, baseline=base,
                                   value=base * (1 + c), change=c, against=against, p_value=float(p.loc[code]),
                                   n=int(n.loc[code]), modules=(module,),
                                   detail=f"median over profiles vs this module's {against} run", ci_low=lo,
                                   ci_high=hi))
    return regs


def correctness(cur: pd.DataFrame, ref_correct: np.ndarray, label: str) -> list[Regression]:
    """MTP prompts right in the reference (``ref_correct`` per row of cur: baseline per key/profile,
    or the same module's previous run) and wrong now."""
    flip = answer_flipped(cur["correct"].to_numpy(), ref_correct)
    if not flip.any():
        return []
    flips = pd.DataFrame({c: cur[c].to_numpy()[flip].astype(str) for c in ("module", *K)})
    answered = cur[cur["correct"].notna()].groupby("cell")["module"].nunique()
    cells = cur["cell"].to_numpy()[flip]
    flips["answered"] = answered.reindex(cells).to_numpy()
    regs: list[Regression] = []
    for (key, prof), grp in flips.groupby(K):
        mods = tuple(sorted(grp["module"]))
        every = len(mods) == int(grp["answered"].iloc[0]) and len(mods) > 1
        for module in [FLEET] if every else mods:
            regs.append(Regression(module=module, model_key=key, profile=prof, metric="correct", baseline=1.0,
                                   value=0.0, change=None, against=label, n=len(mods),
                                   modules=() if every else (module,),
                                   detail=f"wrong on {len(mods)} module(s), right in {label}"))
    return regs
