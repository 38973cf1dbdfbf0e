"""The fleet summary table of a report and its completeness notes (what is missing from the run).

Per (key, profile, metric): fleet median without the outlier modules and the min and max of those
same modules, robust spread, min, max and count of all modules, baseline and change; notes name the
module/key pairs and profiles without results.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import pandas as pd

from controller.fleet.runs import refused_note
from controller.report.analysis.frame import SHAPE, K, Names, cell_table, first_rows, float_columns, present_metrics
from controller.report.analysis.groups import Groups
from controller.report.analysis.middles import Middles
from controller.report.model import ALL_METRICS, DERIVED


def summarise(cur: pd.DataFrame, rows: pd.DataFrame, ref: pd.DataFrame | None, included: np.ndarray,
              spread: pd.DataFrame, groups: Groups | None = None, mid: Middles | None = None
              ) -> pd.DataFrame:
    """Per (key, profile, metric): fleet median (``fleet``: without outlier modules), ``fleet_min`` and
    ``fleet_max`` (of the modules in ``fleet``), robust spread (1.4826 MAD of log figures ~ relative sd),
    min, max and count (all modules), baseline and change."""
    metrics = present_metrics(cur, ALL_METRICS)
    if not metrics:
        return pd.DataFrame()
    cell = cur["cell"].to_numpy()
    g = groups or Groups(cell)
    vals = float_columns(cur, metrics)
    mn, mx = g.extremes(vals)
    count = g.counts([~np.isnan(v) for v in vals])
    agg = {"min": pd.DataFrame(mn, index=g.present, columns=metrics),
           "max": pd.DataFrame(mx, index=g.present, columns=metrics),
           "count": pd.DataFrame(count.astype(np.int64), index=g.present, columns=metrics)}
    gi = mid.groups if mid is not None else Groups(cell[included])
    inc = pd.DataFrame(index=gi.present)
    for m, v in zip(metrics, vals, strict=True):
        inc[m] = mid.figure(m) if mid is not None and mid.exact[m] else gi.median([v[included]])[:, 0]
    inc_mn, inc_mx = included_extremes(g, gi, vals, (mn, mx), included)
    inc_min = pd.DataFrame(inc_mn, index=gi.present, columns=metrics)
    inc_max = pd.DataFrame(inc_mx, index=gi.present, columns=metrics)
    ids = cell_table(cur)
    # each cell's first row: its position in ``rows`` is the prepared frame's index
    at = first_rows(cell)
    first = rows.iloc[cur.index.to_numpy()[at]].reindex(columns=list(SHAPE)).set_axis(cell[at])
    refv = ref.reindex(pd.MultiIndex.from_frame(ids[K])) if ref is not None else None
    parts = []
    for m in metrics:
        sp = DERIVED.get(m, m)
        part = pd.DataFrame({"model_key": ids["model_key"], "profile": ids["profile"], "metric": m,
                             "fleet": inc[m], "fleet_min": inc_min[m], "fleet_max": inc_max[m],
                             "spread": spread[sp] if sp in spread.columns else np.nan,
                             "min": agg["min"][m], "max": agg["max"][m], "count": agg["count"][m]})
        if refv is not None:
            part["baseline"] = refv[m].to_numpy()
            part["change"] = part["fleet"] / part["baseline"] - 1
        parts.append(part)
    # one join of each cell's shape, not one per metric
    s = pd.concat(parts).join(first).reset_index(drop=True)
    s["table"] = s["table"].astype(str)
    return s[s["count"] > 0].reset_index(drop=True)


def included_extremes(g: Groups, gi: Groups, vals: list[np.ndarray], extremes: tuple[np.ndarray, np.ndarray],
                      included: np.ndarray, rows_per_cell: int = 8192) -> tuple[np.ndarray, np.ndarray]:
    """Min and max per (cell of ``gi``, column) of the included rows, from those of every row (``extremes``, per cell
    of ``g``) where few rows are left out (an outlier module): a cell's extreme is taken again only where a row left
    out equals it; no copy of the included rows. Where an extreme is zero (0.0 and -0.0 are equal but print apart),
    or the rows are not in cell order: taken over the included rows, as they are."""
    mn, mx = extremes
    drop = np.flatnonzero(~included)
    cells = np.unique(g.codes[drop])
    # a cell's columns looked at one by one cost more than a copy of a few rows: worth it only where the included
    # rows are many, at least ``rows_per_cell`` for each cell with rows left out
    if (g.order is not None or gi.order is not None or len(drop) * 64 >= len(included)
            or len(included) < rows_per_cell * len(cells) or bool((mn == 0).any()) or bool((mx == 0).any())):
        return gi.extremes([v[included] for v in vals])
    at = np.searchsorted(g.present, gi.present)  # gi's cells among g's
    lo, hi = mn[at], mx[at]
    for i, k in zip(np.searchsorted(g.present, cells).tolist(), np.searchsorted(gi.present, cells).tolist(),
                    strict=True):
        if k >= len(gi) or gi.present[k] != g.present[i]:
            continue
        s, e = int(g.starts[i]), int(g.ends[i])
        keep = included[s:e]
        for j, v in enumerate(vals):
            seg = v[s:e]
            gone = seg[~keep]
            if bool((gone == mn[i, j]).any()) or bool((gone == mx[i, j]).any()):
                rest = seg[keep]
                lo[k, j], hi[k, j] = np.fmin.reduce(rest), np.fmax.reduce(rest)
    if bool((lo == 0).any()) or bool((hi == 0).any()):
        return gi.extremes([v[included] for v in vals])
    return lo, hi


def completeness(cur: pd.DataFrame, names: Names, ref: pd.DataFrame | None, expected_modules: Iterable[str],
                 expected_keys: Iterable[str], module_keys: Mapping[str, Iterable[str]] | None = None,
                 refused: Mapping[str, str] | None = None) -> list[str]:
    """What is missing from the run: the modules refused at dispatch (``refused``: module -> why, one note naming
    them, last), module/key pairs without a row among the others (``module_keys``: modules asked for only some of
    ``expected_keys``, and those), and module/key pairs with fewer profiles than the reference."""
    notes: list[str] = []
    refused = refused or {}
    expected_modules = [m for m in expected_modules if m not in refused]
    mk = cur["modkey"].to_numpy()
    # one count per module/key code, whether or not the last codes have rows (a module that lacks the last key)
    counts = np.bincount(mk, minlength=len(names.modules) * names.nk)
    # module/key pairs with rows (names only for the few a note shows)
    codes = np.flatnonzero(counts)
    mods, keys = list(expected_modules), list(expected_keys)
    missing: list[tuple[str, str]] = []
    if mods and keys:
        mc = names.modules.get_indexer(mods)
        kc = names.keys.get_indexer(keys)
        want = (np.repeat(mc, len(kc)) * names.nk + np.tile(kc, len(mc)))
        have = (np.repeat(mc, len(kc)) >= 0) & (np.tile(kc, len(mc)) >= 0)
        have[have] = counts[want[have]] > 0
        missing = [(mods[i // len(keys)], keys[i % len(keys)]) for i in np.flatnonzero(~have)]
        if module_keys:
            asked = {m: set(ks) for m, ks in module_keys.items()}
            missing = [(m, k) for m, k in missing if m not in asked or k in asked[m]]
    if missing:
        shown = ", ".join(f"{m}/{k}" for m, k in missing[:8])
        more = f" and {len(missing) - 8} more" if len(missing) > 8 else ""
        notes.append(f"no results for {len(missing)} module/key pair(s): {shown}{more}")
    if ref is not None and len(cur):
        want = ref.reset_index().groupby("model_key")["profile"].nunique()
        # per key code, not per text
        wants = want.reindex(names.keys).to_numpy(dtype=float)[codes % names.nk]
        short = np.flatnonzero(counts[codes] < np.nan_to_num(wants, nan=0.0))
        for i in short[:8].tolist():
            module, key = names.modkey(int(codes[i]))
            notes.append(f"{module}/{key}: {counts[codes[i]]} of {int(wants[i])} profiles")
        if len(short) > 8:
            notes.append(f"... {len(short) - 8} more module/key pairs with missing profiles")
    if refused:
        notes.append(refused_note(refused, len(expected_modules)))
    return notes


def flag_names(text: str) -> list[str]:
    """The flags of one row as stored (``["a", "b"]`` JSON, ``['a']``, ``()``): their names."""
    return [f for f in (x.strip(" '\"") for x in text.strip("[]() ").split(",")) if f]


def flagged_rows(rows: pd.DataFrame, most: int = 8) -> list[str]:
    """A note naming the rows that carry flags (the parser's: a figure no benchmark measures, a profile twice, the
    seed's relations broken; the agent's: the probe disagrees), the first ``most`` of them with their flags.
    Distinct flag texts are few: they are read once each, not per row."""
    if "flags" not in rows.columns or not len(rows):
        return []
    col = rows["flags"]
    cat = col.array if isinstance(col.dtype, pd.CategoricalDtype) else pd.Categorical(col.map(str))
    names = [flag_names(str(t)) for t in cat.categories]
    codes = np.asarray(cat.codes)
    hit = np.flatnonzero(np.isin(codes, [i for i, n in enumerate(names) if n]))
    if not len(hit):
        return []
    shown = [f"{rows['module'].iloc[i]}/{rows['model_key'].iloc[i]} {rows['profile'].iloc[i]}: "
             f"{', '.join(names[codes[i]])}" for i in hit[:most].tolist()]
    more = f" and {len(hit) - most} more" if len(hit) > most else ""
    return [f"{len(hit)} flagged row(s): {'; '.join(shown)}{more}"]
