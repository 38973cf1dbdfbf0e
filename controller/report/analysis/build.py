"""Frames in, a :class:`Report` out: the order of the analysis' steps (:func:`analyse`).

Outliers first (:mod:`.outliers`), left out of the fleet figures; then the fleet and each module
against the baseline and the previous run (:mod:`.compare`); one finding per cause and the
verdict (:mod:`.verdict`); the summary table and completeness notes (:mod:`.summary`). Only
aggregated results (cells, keys, modules) are iterated in Python; rows never are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import pandas as pd

from controller.report.analysis.compare import (
    correctness,
    diff_to_previous,
    diff_to_reference,
    fleet_compare,
    module_compare,
    previous_match,
    reference,
)
from controller.report.analysis.energy import energy_outliers
from controller.report.analysis.frame import Names, badness_columns, exact_metrics, prepare, take_rows
from controller.report.analysis.groups import Groups
from controller.report.analysis.middles import Middles, included_middles
from controller.report.analysis.noise import NOISE_BELOW, RunNoise, weigh
from controller.report.analysis.outliers import (
    find_outliers,
    fleet_deviation,
    outlier_mask,
    refine_outliers,
)
from controller.report.analysis.probe import capacities, probe_disagreements, probe_intervals, split_sources
from controller.report.analysis.summary import completeness, flagged_rows, summarise
from controller.report.analysis.verdict import decide, fold, missing_metrics
from controller.report.jit import with_jit
from controller.report.model import ALL_METRICS, DERIVED, FLEET, Change, Regression, Report, Thresholds


def analyse(rows: pd.DataFrame, *, run_id: str = "", release: str = "", baseline: pd.DataFrame | None = None,
            baseline_id: str | None = None, baseline_label: str = "baseline", previous: pd.DataFrame | None = None,
            previous_label: str = "previous", state: str = "done", expected_modules: Iterable[str] = (),
            expected_keys: Iterable[str] = (), thresholds: Thresholds | None = None,
            module_keys: Mapping[str, Iterable[str]] | None = None, refused: Mapping[str, str] | None = None) -> Report:
    """Build a report from frames of result rows (one column per ``ResultRow`` field).

    Rows the agent's probe measured (``source == "probe"``) never enter the figures: they are
    only compared with the release's rows of the same module, key and profile. ``module_keys``: the modules
    asked for only some of ``expected_keys`` (``retry --failed-only``), and those keys. ``refused``: module -> why,
    the modules refused at dispatch (the run is judged on the others, and incomplete)."""
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
    energy = energy_outliers(cur, th)
    # refining takes the outlier modules' rows only: the rest goes before the included rows are taken
    devs = devs.only(np.flatnonzero(np.isin(devs.mod, [names.modules.get_loc(o.module) for o in outliers])))
    excluded = outlier_mask(cur, outliers)
    some_excluded = bool(excluded.any()) and bool((~excluded).any())
    # the included rows without their figures (the comparisons take badness only); which
    # metrics have a figure <= 0 among them is taken first
    exact = exact_metrics(cur, ~excluded if some_excluded else None)
    cells_inc = Groups(cur["cell"].to_numpy()[~excluded]) if some_excluded else cells_all
    # the included rows' middles of the primary metrics, from the fleet's (nothing left out: the fleet's)
    known = included_middles(cur, cells_all, fleet_mid, excluded, cells_inc) if some_excluded else fleet_mid
    # without a baseline the included rows are only partitioned (the badness of the metrics whose middles are not
    # known yet): only those columns are taken (a baseline's comparison reads every badness, the ids, codes and
    # answers too)
    kept = ([c for c in cur.columns if c not in ALL_METRICS] if ref is not None else
            ["cell", *badness_columns(m for m in ALL_METRICS if m not in known)])
    inc = take_rows(cur, ~excluded, kept) if some_excluded else cur
    mid = Middles(inc, cells_inc, exact, known) if some_excluded or not excluded.any() else None
    if some_excluded:
        outliers, deviation = refine_outliers(cur, devs, names, outliers, excluded, deviation, th, inc, mid)
    del devs  # not needed past the outliers: its memory goes before the comparisons take theirs

    changes: list[Change] = []
    regs: list[Regression] = []
    # too few modules for an interval: the findings are weighed by the runs' own spread too (.noise)
    few = len(names.modules) - len({o.module for o in outliers if o.model_key == FLEET}) < NOISE_BELOW
    judged = cur[~excluded] if few and some_excluded else cur
    out_of_line = {o.module for o in outliers if o.model_key == FLEET}  # not in the references' spread either
    if ref is not None and len(inc):
        d, ref_cells = diff_to_reference(inc, ref)
        ch, rg, _ = fleet_compare(d, names, baseline_label, th, ref_cells, cells_inc, mid)
        if few and base is not None:
            rg, ch = weigh(rg, ch, RunNoise(judged, base, th, out_of_line), baseline_label)
        changes += ch
        regs += rg
        right = np.full(int(ref_cells.index.max()) + 1, np.nan)  # the reference's answer per cell code
        right[ref_cells.index.to_numpy()] = ref_cells["correct"].to_numpy(dtype=float)
        regs += correctness(inc, np.take(right, inc["cell"].to_numpy()), baseline_label)
    if ref is not None:
        regs += missing_metrics(cur, names.cells, ref, names.modkey, baseline_label)
    prev_ids: tuple[str, ...] = ()
    if prev is not None and len(inc):
        prev_ids = tuple(sorted(map(str, previous["run_id"].unique()))) if previous is not None else ()
        match = previous_match(cur, prev)
        # the fleet's comparison: the included rows' differences, taken from cur's rows (not all, then a copy);
        # where few of them have a previous figure (a previous run of a few of the modules), those rows only, the
        # others counted as rows of their cells without a figure
        inc_rows = np.flatnonzero(~excluded) if some_excluded else None
        live = np.flatnonzero(match[0][inc_rows] >= 0) if inc_rows is not None else np.flatnonzero(match[0] >= 0)
        if cells_inc.order is None and len(live) * 4 < len(cells_inc.codes):
            dp = diff_to_previous(cur, prev, live if inc_rows is None else inc_rows[live], match)
            ch, rg, _ = fleet_compare(dp, names, previous_label, th, among=(cells_inc, live))
        else:
            dp = diff_to_previous(cur, prev, inc_rows, match)
            ch, rg, _ = fleet_compare(dp, names, previous_label, th, groups=cells_inc)
        if few:
            rg, ch = weigh(rg, ch, RunNoise(judged, prev, th, out_of_line), previous_label)
        changes += ch
        regs += rg
        fleet_wide = {(r.model_key, DERIVED.get(r.metric, r.metric)) for r in regs
                      if r.module == FLEET and r.profile == FLEET}
        # each module against its previous run: the rows with a previous figure only (one without adds nothing
        # to a module's median or counts; a previous run of a few of the modules leaves most rows without)
        found = np.flatnonzero(match[0] >= 0)
        if some_excluded or len(found) < len(cur):
            dp = diff_to_previous(cur, prev, found if len(found) < len(cur) else None, match)
        mine = module_compare(dp, names, th, previous_label, fleet_wide)
        regs += weigh(mine, [], RunNoise(judged, prev, th, out_of_line), previous_label)[0] if few else mine
        answers = np.full(len(cur), np.nan)  # the previous run's answer per row of cur
        answers[found] = dp["ref_correct"].to_numpy(dtype=float)
        regs += correctness(cur, answers, previous_label)
    regressions = tuple(fold(regs, outliers, energy))

    refused = dict(refused or {})
    notes += flagged_rows(rows)  # before what is missing: an incomplete verdict's line names the last note
    notes += completeness(cur, names, ref, expected_modules, expected_keys, module_keys, refused)
    verdict = decide(state, len(cur), regressions, notes, expected_modules, expected_keys, refused)
    return with_jit(Report(
        run_id=run_id, release=release, baseline_id=baseline_id, previous_ids=prev_ids, verdict=verdict,
        regressions=regressions, outliers=outliers, changes=tuple(changes), notes=tuple(notes),
        modules=tuple(sorted(map(str, cur["module"].unique()))), thresholds=th,
        summary=summarise(cur, rows, ref, ~excluded, spread, cells_all, mid), rows=rows, reference=ref,
        deviation=deviation, disagreements=disagreements, probe_checked=probe_checked, capacities=capacities(probe),
        probe_intervals=probe_intervals(probe),
        energy_outliers=energy, refused=tuple(refused.items()),
    ))
