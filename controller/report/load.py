"""The report's one I/O seam with the run history: its reads into pandas frames.

A run's rows come column-wise (:meth:`controller.history.History.row_frame`: the run's column file, or
SQLite while the run is running), text as categoricals (a module name stored once, each row a small code),
numbers as numbers; no Python object per row (``bench/report.py --history``, ADR 0028).
:func:`as_read` gives a frame built in memory (a synthetic fleet) the same form.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd
from pandas.api.types import union_categoricals

from contract.fingerprint import EnvFingerprint
from contract.records import METRICS, ResultRow
from controller.command import fleetctl
from controller.fleet.kernel_logs import failed_parts
from controller.fleet.power import cycle_lines
from controller.fleet.runs import refused_parts
from controller.history import GOLDEN_NOTE, ROW_FIELDS, History, HistoryError, RunInfo
from controller.history.frames import frame_bytes
from controller.history.waits import run_waits, run_waits_line
from controller.report.analysis import analyse
from controller.report.environment import digests_of, kernel_cache_note, refuse_unless_same, with_environment
from controller.report.model import FailedPart, Report, ReportError, Thresholds
from controller.report.telemetry import with_telemetry
from controller.report.trend import TrendQuery, history_section

# how far back to look for each module's previous run
PRIOR_RUNS = 20


def _is_number(annotation: object) -> bool:
    return any(a in (int, float, bool) for a in (typing.get_args(annotation) or (annotation,)))


NUMBER_FIELDS = frozenset(f for f, info in ResultRow.model_fields.items() if _is_number(info.annotation))


# one chunk: numpy arrays and Categoricals by column name
Columns = dict[str, Any]


def _compact(chunk: pd.DataFrame) -> Columns:
    """One chunk as read: text columns as categoricals, numbers as arrays of their own (a number
    column the chunk has no value of, SQLite NULLs read as None, as float NaN); the chunk as read
    can go as soon as this returns."""
    out: Columns = {}
    for c in chunk.columns:
        col = chunk[c]
        if c in NUMBER_FIELDS:
            out[c] = col.to_numpy(dtype=float) if col.dtype == object and not col.notna().any() else \
                col.to_numpy(copy=True)
        else:
            cat = col.astype("category").array
            # all NULL: categories of text still, so chunks unite
            if not len(cat.categories):
                cat = cat.set_categories(pd.Index([], dtype=object).astype(str))
            out[c] = cat
    return out


def concat_compact(chunks: Iterable[Columns], columns: Sequence[str]) -> pd.DataFrame:
    """Chunks from :func:`_compact` as one frame: categories united (sorted: the analysis numbers
    modules in category order), numbers joined as pandas would (int and float chunks give float,
    as one read of every row would). Column by column, each taken out of the chunks as it is
    joined: the chunks and the frame are not both held whole."""
    parts = list(chunks)
    if not parts:
        return pd.DataFrame(columns=list(columns))
    cols: dict[str, Any] = {}
    for c in list(parts[0]):
        pieces = [p.pop(c) for p in parts]
        if isinstance(pieces[0], pd.Categorical):
            joined = union_categoricals(pieces, sort_categories=True) if len(pieces) > 1 else pieces[0]
            if not joined.categories.is_monotonic_increasing:
                joined = joined.reorder_categories(joined.categories.sort_values())
            cols[c] = joined
        else:
            cols[c] = np.concatenate(pieces) if len(pieces) > 1 else pieces[0]
        del pieces
    return pd.DataFrame(cols, copy=False)


def as_read(frame: pd.DataFrame) -> pd.DataFrame:
    """A rows frame (e.g. a synthetic fleet) in the form :func:`read_rows` gives: text as categoricals."""
    return concat_compact([_compact(frame)], list(frame.columns))


def read_rows(history: History, run_ids: Sequence[str], *, model_keys: Sequence[str] | None = None,
              only: Sequence[str] | None = None, modules: Sequence[str] | None = None) -> pd.DataFrame:
    """Every stored row of the given runs (of ``model_keys`` only, when given; of ``modules`` only, when given;
    one column per ResultRow field, or per field of ``only``; text as categoricals)."""
    if not run_ids or (model_keys is not None and not model_keys):
        return pd.DataFrame(columns=list(ROW_FIELDS if only is None else only))
    return history.row_frame(run_ids, model_keys, only, modules)


# what a trend's series are built on
SERIES_FIELDS = ("run_id", "module", "model_key", "profile", "source")


def history_frames(history: History, model_keys: Sequence[str] | None = None, *,
                   metrics: Sequence[str] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """What the change points over the history are computed from (:mod:`controller.report.trend`): the rows of
    every run (of ``model_keys`` only, when given), their series fields and ``metrics`` only (default: every
    metric; ``fleetctl trend --metric``: 6 columns read of 48, the others never decompressed), and the runs'
    (run_id, release, created_at)."""
    runs = history.runs(limit=1_000_000)
    frame = pd.DataFrame([{"run_id": r.run_id, "release": r.release, "created_at": r.created_at} for r in runs],
                         columns=["run_id", "release", "created_at"])
    only = [*SERIES_FIELDS, *(m for m in (METRICS if metrics is None else metrics) if m not in SERIES_FIELDS)]
    return read_rows(history, list(frame["run_id"]), model_keys=model_keys, only=only), frame


def trend_frames(history: History, query: TrendQuery) -> tuple[pd.DataFrame, pd.DataFrame]:
    """What :func:`controller.report.trend.trend_records` reads for ``query`` (``fleetctl trend``, ``GET /trend``):
    the rows of its model keys, the series' fields and its metric (every metric, without one) only."""
    return history_frames(history, query.models, metrics=[query.metric] if query.metric else None)


def distinct_sorted(col: pd.Series) -> list[Any]:
    """``sorted(set(col))``; of a categorical without missing values, from its codes (the categories with rows: no
    value made per row, 0.08 s of a 1 M-row report)."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        codes = np.asarray(col.array.codes)
        cats = col.cat.categories
        if len(codes) and int(codes.min()) >= 0:
            return sorted(cats[np.bincount(codes, minlength=len(cats)) > 0].tolist())
    return sorted(set(col))


def run_keys(run: RunInfo, rows: pd.DataFrame) -> list[str]:
    """The model keys of a run: those of its rows, else those it was asked for."""
    return sorted({str(k) for k in distinct_sorted(rows["model_key"])}) if len(rows) else list(run.models)


def previous_pick(history: History, run: RunInfo, modules: Sequence[str]) -> pd.DataFrame | None:
    """(run_id, module): for each module, the newest earlier run (kind 'run') with rows of it (None: none). A golden
    check is never another run's previous run (a nightly is compared with yesterday's nightly, not with the golden
    release a scheduled check last ran there); a golden check's is the module's earlier check of its release."""
    golden = run.note if run.note.startswith(GOLDEN_NOTE + " ") else None
    prior = history.runs_before(run.created_at, run.run_id, PRIOR_RUNS, note=golden)
    if prior.empty or not modules:
        return None
    have = history.modules_of_rows(list(prior["run_id"]))
    # as objects: pandas' text column tests membership value by value in python (0.05 s for 10 k modules)
    have = have[have["module"].astype(object).isin(list(modules))].merge(prior, on="run_id")
    return have.sort_values("created_at", ascending=False).drop_duplicates("module")[["run_id", "module"]]


def previous_rows(history: History, pick: pd.DataFrame | None) -> pd.DataFrame:
    """The rows of each module's previous run (:func:`previous_pick`; None: no rows)."""
    if pick is None:
        return pd.DataFrame(columns=list(ROW_FIELDS))
    # the picked modules' rows only: a run of 100 modules whose previous run was fleet-wide reads 100 modules' rows
    rows = read_rows(history, sorted(set(pick["run_id"])), modules=sorted({str(m) for m in pick["module"]}))
    return rows.merge(pick, on=["run_id", "module"])


def resolve_baseline(history: History, spec: str | None, release: str) -> str | None:
    """``spec`` ('1.4.1', '1.4.1@v2', a run id) or, without one, the newest baseline of the run's
    release, else the newest baseline of any release."""
    if spec:
        found = history.baseline_run_id(spec)
        if not found:
            raise ReportError(f"no baseline {spec!r} in {history.path} (see: {fleetctl('baseline', 'list')})")
        return found
    return history.baseline_run_id(None, release=release or None) or history.baseline_run_id()


def with_fingerprints(history: History, rep: Report, rows: pd.DataFrame, references: Mapping[str, pd.DataFrame | None],
                      *, require_same: str | None = None) -> Report:
    """The report with the environments its rows were measured in (:mod:`controller.report.environment`): modules
    off the fleet's, and a warning per reference (label -> its rows) measured in another one. ``require_same``:
    the label of the baseline whose environment every module must share (else :class:`EnvironmentRefused`)."""
    return _with_digests(history, rep, digests_of(rows), {label: digests_of(f) for label, f in references.items()},
                         require_same=require_same)


def _with_digests(history: History, rep: Report, current: Mapping[str, str], refs: Mapping[str, Mapping[str, str]],
                  *, require_same: str | None = None) -> Report:
    """:func:`with_fingerprints` of the rows' environment digests (:func:`digests_of`)."""
    prints = history.fingerprints_by_digest({*current.values(), *(d for r in refs.values() for d in r.values())})
    if require_same is not None:
        refuse_unless_same(current, refs.get(require_same, {}), prints, require_same)

    def records(digests: Mapping[str, str]) -> dict[str, EnvFingerprint]:
        return {m: prints[d] for m, d in digests.items() if d in prints}

    return with_environment(rep, records(current), {label: records(d) for label, d in refs.items()})


def build_report(history: History, run_id: str, baseline: str | None = None, *,
                 thresholds: Thresholds | None = None, previous: bool = True, with_history: bool = False,
                 same_environment: bool = False) -> Report:
    """The report of one run: against its baseline, each module's previous run and the fleet; with
    ``with_history``, the change points of its model keys across the release history (the HTML report's
    "History" section: the series built once, for the run's keys only). ``same_environment``: refuse a
    baseline measured in another environment (``ControllerSettings.baseline_same_environment``).

    A history with kept frames (``fleetctl serve``) keeps the analysis too, under :func:`_analysis_key`: what it
    is a function of (the run's record, the column files of its rows, its baseline's and its modules' previous
    runs', the thresholds). The rest (notes, telemetry, environments, the History section) is read each time."""
    try:
        run = history.find_run(run_id)
    except HistoryError as exc:
        raise ReportError(str(exc)) from exc
    base_id = resolve_baseline(history, baseline, run.release)
    th = thresholds or Thresholds()
    progress = history.progress(run.run_id)
    refused = refused_parts(progress)
    cache = history.frames
    key, pick = _analysis_key(history, run, base_id, previous, th, refused) if cache is not None else (None, None)
    made = cache.recall(key) if cache is not None and key is not None else None
    if not isinstance(made, _Analysed):
        def plain_pick(rows: pd.DataFrame) -> pd.DataFrame | None:
            return previous_pick(history, run, distinct_sorted(rows["module"]) if len(rows) else list(run.modules))

        made = _analyse_run(history, run, base_id, th, previous, plain_pick if key is None else lambda _: pick,
                            refused)
        if cache is not None and key is not None:
            # rows that changed while they were read were read under another record than the key's: that record
            # is no longer current, so no later key names it, and what is kept under it is never recalled
            cache.remember(key, made, made.size)
    rep = made.report
    # a module refused at dispatch has no figures here (bad by its drift, say): its refusal says why already
    drifted = [(m, d) for m in run.modules if m not in refused and (d := history.golden_drift(m))]
    # the module drifted, not (necessarily) the release: said before any finding is read
    if drifted:
        rep = replace(rep, notes=(*rep.notes, *(f"module {m} failed its golden check since its last reset ({d}): "
                                               "its figures say more about the module than about the release"
                                               for m, d in drifted)))
    if with_history:
        rep = replace(rep, history=history_section(*history_frames(history, made.keys), run.release))
    waited = run_waits_line(run_waits(history, run.run_id), "waited on the module queues (dispatch to start)")
    # first: the verdict line of an incomplete run names the last note
    if waited:
        rep = replace(rep, notes=(waited, *rep.notes))
    rep = with_telemetry(rep, history.telemetry(run.run_id))
    shared = kernel_cache_note(progress)
    # first: a failed or incomplete run's one-line summary takes the last note
    if shared:
        rep = replace(rep, notes=(shared, *rep.notes))
    # hung modules power-cycled (first, as the note above)
    events = history.events(run.run_id)
    cycles = cycle_lines(events)
    if cycles:
        rep = replace(rep, notes=(*cycles, *rep.notes))
    # the logs kept of each failed part: beside the failure (the summary's "not measured", the data files)
    rep = replace(rep, failed_parts=tuple(FailedPart(module=m, why=why, logs=logs, command=cmd)
                                          for m, why, logs, cmd in failed_parts(events, run.run_id)))
    return _with_digests(history, rep, made.current, made.references,
                         require_same=base_id if same_environment and base_id else None)


@dataclass(frozen=True)
class _Analysed:
    """What a report makes of the rows alone (the run's, its baseline's, its modules' previous runs'): the
    analysis, the run's model keys, and the environment digests of the run's rows and of each reference's."""

    report: Report
    keys: list[str]
    current: dict[str, str]
    references: dict[str, dict[str, str]]

    @property
    def size(self) -> int:
        """The bytes of its frames (counted whole, though the run's rows may be a kept frame's)."""
        r = self.report
        return sum(frame_bytes(f) for f in (r.rows, r.summary, r.reference, r.deviation))


def _analyse_run(history: History, run: RunInfo, base_id: str | None, thresholds: Thresholds, previous: bool,
                 pick: Callable[[pd.DataFrame], pd.DataFrame | None], refused: Mapping[str, str]) -> _Analysed:
    """Read the rows and analyse them; with ``previous``, against each module's previous run, which ``pick`` gives
    of the run's rows (:func:`previous_pick`); ``refused``: the modules refused at dispatch, and why."""
    rows = read_rows(history, [run.run_id])
    base = read_rows(history, [base_id]) if base_id else None
    prev = previous_rows(history, pick(rows)) if previous else None
    rep = analyse(rows, run_id=run.run_id, release=run.release, baseline=base, baseline_id=base_id,
                  previous=prev, state=run.state, expected_modules=run.modules, expected_keys=run.models,
                  thresholds=thresholds, module_keys=run.module_models, refused=refused)
    refs = {base_id or "the baseline": base, "each module's previous run": prev}
    return _Analysed(rep, run_keys(run, rows), digests_of(rows), {label: digests_of(f) for label, f in refs.items()})


def _analysis_key(history: History, run: RunInfo, base_id: str | None, previous: bool,
                  thresholds: Thresholds, refused: Mapping[str, str]) -> tuple[Hashable | None, pd.DataFrame | None]:
    """What a run's analysis is a function of, when every input is in a current column file (None otherwise: a
    running run, rows not yet in a file): the run's record (state, modules, model keys), the files of its rows,
    of its baseline's and of each module's previous run, which run that is for each module, the thresholds and
    the modules refused at dispatch.
    With it, that pick of previous runs (None: none), for :func:`_analyse_run` to read."""
    own = history.frame_key([run.run_id])
    base = history.frame_key([base_id]) if base_id else ()
    if own is None or base is None:
        return None, None
    pick, prev = None, None
    if previous:
        modules = sorted(set(history.modules_of_rows([run.run_id])["module"])) or list(run.modules)
        pick = previous_pick(history, run, modules)
        if pick is not None:
            files = history.frame_key(sorted(set(pick["run_id"])))
            if files is None:
                return None, None
            prev = (files, tuple(sorted(zip(pick["run_id"], pick["module"], strict=True))))
    return ("analysis", repr(run), base_id, own, base, prev, thresholds.model_dump_json(),
            tuple(sorted(refused.items()))), pick


def compare_runs(history: History, run_a: str, run_b: str, *, thresholds: Thresholds | None = None) -> Report:
    """Run B against run A: module by module where they share modules, else fleet medians."""
    try:
        a, b = history.find_run(run_a), history.find_run(run_b)
    except HistoryError as exc:
        raise ReportError(str(exc)) from exc
    rows_a, rows_b = read_rows(history, [a.run_id]), read_rows(history, [b.run_id])
    if rows_a.empty:
        raise ReportError(f"run {a.run_id} has no result rows")
    shared = set(rows_a["module"]) & set(rows_b["module"])
    paired = len(shared) >= max(1, len(set(rows_b["module"])) // 2)
    rep = analyse(rows_b, run_id=b.run_id, release=b.release, baseline=None if paired else rows_a,
                  baseline_id=a.run_id, baseline_label=a.run_id, previous=rows_a if paired else None,
                  previous_label=a.run_id, state=b.state, expected_modules=b.modules, expected_keys=b.models,
                  thresholds=thresholds, module_keys=b.module_models, refused=refused_parts(history.progress(b.run_id)))
    return with_fingerprints(history, with_telemetry(rep, history.telemetry(b.run_id)), rows_b, {a.run_id: rows_a})
