"""Frames in, a :class:`Report` out: the order of the analysis' steps (:func:`analyse`).

Outliers first (:mod:`.outliers`), left out of the fleet figures; then the fleet and each module
against the baseline and the previous run (:mod:`.compare`); one finding per cause and the
verdict (:mod:`.verdict`); the summary table and completeness notes (:mod:`.summary`). Only
aggregated results (cells, keys, modules) are iterated in Python; rows never are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd

from contract.vocab import Disagreement
from controller.report.analysis.compare import (
    PreviousMatch,
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
from controller.report.model import (
    ALL_METRICS,
    DERIVED,
    FLEET,
    Change,
    Outlier,
    Regression,
    Report,
    Thresholds,
)


@dataclass(frozen=True)
class Frames:
    """The run's rows and its references, the probe's rows split off (:func:`split_sources`) and prepared."""

    rows: pd.DataFrame  # the run's release rows, as stored
    probe: pd.DataFrame | None  # the rows the agent's probe measured
    cur: pd.DataFrame  # ``rows`` prepared (.frame.prepare)
    # the baseline's rows prepared, None without a row
    base: pd.DataFrame | None
    # the previous run's rows prepared, None without a row
    prev: pd.DataFrame | None
    # the baseline's figures per (key, profile) (.compare.reference)
    ref: pd.DataFrame | None
    previous_ids: tuple[str, ...]
    # release figures outside the probe's band
    disagreements: tuple[Disagreement, ...]
    # release rows with a probe row beside them
    probe_checked: int


@dataclass(frozen=True)
class Included:
    """The outliers found, and the rows left once they are set apart, with what the comparisons reuse."""

    names: Names
    cells_all: Groups  # every row's cells, sorted once
    # per cell the robust spread of each primary metric
    spread: pd.DataFrame
    outliers: tuple[Outlier, ...]
    deviation: pd.DataFrame  # module x key deviation from the fleet
    energy: tuple[Outlier, ...]
    excluded: np.ndarray  # per row of cur: an outlier's
    some_excluded: bool  # some rows left out, not all
    cells_inc: Groups
    # the included rows (only the columns the comparisons read)
    inc: pd.DataFrame
    mid: Middles | None


@dataclass(frozen=True)
class Noise:
    """Too few modules for an interval (``few``): the findings are weighed by the runs' own spread too (.noise),
    of ``judged`` (the included rows where some are left out), the ``out_of_line`` modules left out of it."""

    few: bool
    judged: pd.DataFrame
    out_of_line: set[str]


Findings = tuple[list[Change], list[Regression]]  # key-level changes, regressions


def prepare_frames(rows: pd.DataFrame, baseline: pd.DataFrame | None, previous: pd.DataFrame | None,
                   th: Thresholds) -> Frames:
    """The probe's rows split from each frame, the probe's disagreements taken, the frames prepared."""
    rows, probe = split_sources(rows)
    assert rows is not None
    baseline, previous = split_sources(baseline)[0], split_sources(previous)[0]
    disagreements, probe_checked = probe_disagreements(rows, probe, th.probe_tolerance)
    cur = prepare(rows)
    base = prepare(baseline) if baseline is not None and len(baseline) else None
    prev = prepare(previous) if previous is not None and len(previous) else None
    prev_ids = tuple(sorted(map(str, previous["run_id"].unique()))) if prev is not None and previous is not None \
        else ()
    return Frames(rows=rows, probe=probe, cur=cur, base=base, prev=prev,
                  ref=reference(base) if base is not None else None, previous_ids=prev_ids,
                  disagreements=disagreements, probe_checked=probe_checked)


def reference_notes(ref: pd.DataFrame | None, prev: pd.DataFrame | None, previous_label: str) -> list[str]:
    """What the run is compared with, where that is less than a baseline."""
    if ref is None and prev is None:
        return ["no baseline and no previous run: only the modules are compared with each other"]
    if ref is None and previous_label == "previous":
        return ["no baseline: only each module's previous run and the fleet itself are compared"]
    return []


def included_rows(cur: pd.DataFrame, ref: pd.DataFrame | None, excluded: np.ndarray, cells_all: Groups,
                  fleet_mid: dict[str, tuple[np.ndarray, np.ndarray]]
                  ) -> tuple[Groups, pd.DataFrame, Middles | None]:
    """The rows ``excluded`` leaves: their cells, the rows (the columns the comparisons read) and their middles
    (None where every row is left out)."""
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
    return cells_inc, inc, mid


def set_outliers_apart(cur: pd.DataFrame, ref: pd.DataFrame | None, th: Thresholds) -> Included:
    """The outlier modules and (module, key) pairs against the fleet, refined against the fleet without them, and
    the rows left (:func:`included_rows`)."""
    names = Names(cur)
    # sorted once, reused by every per-cell median
    cells_all = Groups(cur["cell"].to_numpy())
    devs, spread, fleet_mid = fleet_deviation(cur, th, cells_all)
    outliers, deviation = find_outliers(devs, names, th)
    energy = energy_outliers(cur, th)
    # refining takes the outlier modules' rows only: the rest goes before the included rows are taken
    devs = devs.only(np.flatnonzero(np.isin(devs.mod, [names.modules.get_loc(o.module) for o in outliers])))
    excluded = outlier_mask(cur, outliers)
    some_excluded = bool(excluded.any()) and bool((~excluded).any())
    cells_inc, inc, mid = included_rows(cur, ref, excluded, cells_all, fleet_mid)
    if some_excluded:
        outliers, deviation = refine_outliers(cur, devs, names, outliers, excluded, deviation, th, inc, mid)
    return Included(names=names, cells_all=cells_all, spread=spread, outliers=outliers, deviation=deviation,
                    energy=energy, excluded=excluded, some_excluded=some_excluded, cells_inc=cells_inc, inc=inc,
                    mid=mid)


def run_noise(cur: pd.DataFrame, inc: Included) -> Noise:
    """Whether the findings are weighed by the runs' noise too, and over which rows."""
    # not in the references' spread either
    out_of_line = {o.module for o in inc.outliers if o.model_key == FLEET}
    few = len(inc.names.modules) - len(out_of_line) < NOISE_BELOW
    return Noise(few=few, judged=cur[~inc.excluded] if few and inc.some_excluded else cur, out_of_line=out_of_line)


def against_baseline(f: Frames, inc: Included, noise: Noise, label: str, th: Thresholds) -> Findings:
    """The fleet against the baseline's figures: key-level changes, regressions, answers, metrics gone."""
    changes: list[Change] = []
    regs: list[Regression] = []
    ref = f.ref
    if ref is None:
        return changes, regs
    if len(inc.inc):
        d, ref_cells = diff_to_reference(inc.inc, ref)
        ch, rg, _ = fleet_compare(d, inc.names, label, th, ref_cells, inc.cells_inc, inc.mid)
        if noise.few and f.base is not None:
            rg, ch = weigh(rg, ch, RunNoise(noise.judged, f.base, th, noise.out_of_line), label)
        changes += ch
        regs += rg
        # the reference's answer per cell code
        right = np.full(int(ref_cells.index.max()) + 1, np.nan)
        right[ref_cells.index.to_numpy()] = ref_cells["correct"].to_numpy(dtype=float)
        regs += correctness(inc.inc, np.take(right, inc.inc["cell"].to_numpy()), label)
    regs += missing_metrics(f.cur, inc.names.cells, ref, inc.names.modkey, label)
    return changes, regs


def fleet_against_previous(cur: pd.DataFrame, prev: pd.DataFrame, match: PreviousMatch, inc: Included,
                           noise: Noise, label: str, th: Thresholds) -> tuple[list[Change], list[Regression],
                                                                              pd.DataFrame]:
    """The fleet (the included rows) against the same modules' previous run: changes, regressions, and the
    differences taken (the modules' comparison reuses them where they are every row's)."""
    # the fleet's comparison: the included rows' differences, taken from cur's rows (not all, then a copy);
    # where few of them have a previous figure (a previous run of a few of the modules), those rows only, the
    # others counted as rows of their cells without a figure
    inc_rows = np.flatnonzero(~inc.excluded) if inc.some_excluded else None
    live = np.flatnonzero(match[0][inc_rows] >= 0) if inc_rows is not None else np.flatnonzero(match[0] >= 0)
    if inc.cells_inc.order is None and len(live) * 4 < len(inc.cells_inc.codes):
        dp = diff_to_previous(cur, prev, live if inc_rows is None else inc_rows[live], match)
        ch, rg, _ = fleet_compare(dp, inc.names, label, th, among=(inc.cells_inc, live))
    else:
        dp = diff_to_previous(cur, prev, inc_rows, match)
        ch, rg, _ = fleet_compare(dp, inc.names, label, th, groups=inc.cells_inc)
    if noise.few:
        rg, ch = weigh(rg, ch, RunNoise(noise.judged, prev, th, noise.out_of_line), label)
    return ch, rg, dp


def modules_against_previous(cur: pd.DataFrame, prev: pd.DataFrame, match: PreviousMatch, inc: Included,
                             noise: Noise, label: str, th: Thresholds, fleet_wide: set[tuple[str, str]],
                             fleet_dp: pd.DataFrame) -> list[Regression]:
    """Each module against its previous run (``fleet_wide``: the (key, metric) findings of the fleet, not repeated
    per module), and each row's answer against the previous one. ``fleet_dp``: the fleet's differences."""
    # the rows with a previous figure only (one without adds nothing to a module's median or counts; a previous
    # run of a few of the modules leaves most rows without)
    found = np.flatnonzero(match[0] >= 0)
    dp = fleet_dp
    if inc.some_excluded or len(found) < len(cur):
        dp = diff_to_previous(cur, prev, found if len(found) < len(cur) else None, match)
    mine = module_compare(dp, inc.names, th, label, fleet_wide)
    regs = weigh(mine, [], RunNoise(noise.judged, prev, th, noise.out_of_line), label)[0] if noise.few else mine
    # the previous run's answer per row of cur
    answers = np.full(len(cur), np.nan)
    answers[found] = dp["ref_correct"].to_numpy(dtype=float)
    return regs + correctness(cur, answers, label)


def against_previous(f: Frames, inc: Included, noise: Noise, label: str, th: Thresholds,
                     earlier: list[Regression]) -> Findings:
    """The fleet, then each module, against the previous run (``earlier``: the findings against the baseline)."""
    if f.prev is None or not len(inc.inc):
        return [], []
    match = previous_match(f.cur, f.prev)
    changes, regs, dp = fleet_against_previous(f.cur, f.prev, match, inc, noise, label, th)
    fleet_wide = {(r.model_key, DERIVED.get(r.metric, r.metric)) for r in [*earlier, *regs]
                  if r.module == FLEET and r.profile == FLEET}
    regs += modules_against_previous(f.cur, f.prev, match, inc, noise, label, th, fleet_wide, dp)
    return changes, regs


def analyse(rows: pd.DataFrame, *, run_id: str = "", release: str = "", baseline: pd.DataFrame | None = None,
            baseline_id: str | None = None, baseline_label: str = "baseline", previous: pd.DataFrame | None = None,
            previous_label: str = "previous", state: str = "done", expected_modules: Iterable[str] = (),
            expected_keys: Iterable[str] = (), thresholds: Thresholds | None = None,
            module_keys: Mapping[str, Iterable[str]] | None = None, refused: Mapping[str, str] | None = None) -> Report:
    """Build a report from frames of result rows (one column per ``ResultRow`` field).

    Rows the agent's probe measured (``source == "probe"``) never enter the figures: they are
    only compared with the release's rows of the same module, key and profile. ``module_keys``: the modules
    asked for only some of ``expected_keys`` (``retry --failed-only``), and those keys. ``refused``: module -> why,
    the modules refused at dispatch (the run is judged on the others, and incomplete).

    The steps, each a function of its own: :func:`prepare_frames`, :func:`set_outliers_apart`, :func:`run_noise`,
    :func:`against_baseline`, :func:`against_previous`; then one finding per cause (:func:`.verdict.fold`), the
    notes and the verdict (:func:`.verdict.decide`)."""
    th = thresholds or Thresholds()
    f = prepare_frames(rows, baseline, previous, th)
    cur = f.cur
    notes = reference_notes(f.ref, f.prev, previous_label)
    inc = set_outliers_apart(cur, f.ref, th)
    noise = run_noise(cur, inc)
    changes, regs = against_baseline(f, inc, noise, baseline_label, th)
    prev_changes, prev_regs = against_previous(f, inc, noise, previous_label, th, regs)
    regressions = tuple(fold([*regs, *prev_regs], inc.outliers, inc.energy))
    refused = dict(refused or {})
    # before what is missing: an incomplete verdict's line names the last note
    notes += flagged_rows(f.rows)
    notes += completeness(cur, inc.names, f.ref, expected_modules, expected_keys, module_keys, refused)
    verdict = decide(state, len(cur), regressions, notes, expected_modules, expected_keys, refused)
    compared_previous = f.prev is not None and len(inc.inc) > 0
    return with_jit(Report(
        run_id=run_id, release=release, baseline_id=baseline_id,
        previous_ids=f.previous_ids if compared_previous else (), verdict=verdict,
        regressions=regressions, outliers=inc.outliers, changes=(*changes, *prev_changes), notes=tuple(notes),
        modules=tuple(sorted(map(str, cur["module"].unique()))), thresholds=th,
        summary=summarise(cur, f.rows, f.ref, ~inc.excluded, inc.spread, inc.cells_all, inc.mid), rows=f.rows,
        reference=f.ref, deviation=inc.deviation, disagreements=f.disagreements, probe_checked=f.probe_checked,
        capacities=capacities(f.probe), probe_intervals=probe_intervals(f.probe),
        energy_outliers=inc.energy, refused=tuple(refused.items()),
    ))
