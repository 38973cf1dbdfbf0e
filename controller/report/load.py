"""The report's one I/O seam with the run history: SQL reads into pandas, one query per frame."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from controller.history import ROW_FIELDS, History, HistoryError, RunInfo
from controller.report.analysis import analyse
from controller.report.model import Report, ReportError, Thresholds
from controller.report.telemetry import with_telemetry

PRIOR_RUNS = 20  # how far back to look for each module's previous run


def _cols() -> str:
    return ", ".join(f'"{f}"' for f in ROW_FIELDS)


def read_rows(history: History, run_ids: Sequence[str]) -> pd.DataFrame:
    """Every stored row of the given runs (one column per ResultRow field)."""
    if not run_ids:
        return pd.DataFrame(columns=list(ROW_FIELDS))
    marks = ",".join("?" * len(run_ids))
    return pd.read_sql_query(f"SELECT {_cols()} FROM rows WHERE run_id IN ({marks})", history.conn,
                             params=list(run_ids))


def previous_rows(history: History, run: RunInfo, modules: Sequence[str]) -> pd.DataFrame:
    """For each module, its rows from the newest earlier run (kind 'run') that has any."""
    prior = pd.read_sql_query(
        "SELECT run_id, created_at FROM runs WHERE kind='run' AND created_at < ? AND run_id != ?"
        " ORDER BY created_at DESC LIMIT ?", history.conn, params=[run.created_at, run.run_id, PRIOR_RUNS])
    if prior.empty or not modules:
        return pd.DataFrame(columns=list(ROW_FIELDS))
    marks = ",".join("?" * len(prior))
    have = pd.read_sql_query(f"SELECT run_id, module FROM rows WHERE run_id IN ({marks}) GROUP BY run_id, module",
                             history.conn, params=list(prior["run_id"]))
    have = have[have["module"].isin(list(modules))].merge(prior, on="run_id")
    newest = have.sort_values("created_at", ascending=False).drop_duplicates("module")
    rows = read_rows(history, sorted(set(newest["run_id"])))
    return rows.merge(newest[["run_id", "module"]], on=["run_id", "module"])


def resolve_baseline(history: History, spec: str | None, release: str) -> str | None:
    """``spec`` ('1.4.1', '1.4.1@v2', a run id) or, without one, the newest baseline of the run's
    release, else the newest baseline of any release."""
    if spec:
        found = history.baseline_run_id(spec)
        if not found:
            raise ReportError(f"no baseline {spec!r} in {history.path} (see: fleetctl baseline list)")
        return found
    return history.baseline_run_id(None, release=release or None) or history.baseline_run_id()


def build_report(history: History, run_id: str, baseline: str | None = None, *,
                 thresholds: Thresholds | None = None, previous: bool = True) -> Report:
    """The report of one run: against its baseline, each module's previous run and the fleet."""
    try:
        run = history.find_run(run_id)
    except HistoryError as exc:
        raise ReportError(str(exc)) from exc
    rows = read_rows(history, [run.run_id])
    base_id = resolve_baseline(history, baseline, run.release)
    base = read_rows(history, [base_id]) if base_id else None
    modules = sorted(set(rows["module"])) if len(rows) else list(run.modules)
    prev = previous_rows(history, run, modules) if previous else None
    rep = analyse(rows, run_id=run.run_id, release=run.release, baseline=base, baseline_id=base_id,
                  previous=prev, state=run.state, expected_modules=run.modules, expected_keys=run.models,
                  thresholds=thresholds)
    return with_telemetry(rep, history.telemetry(run.run_id))


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
                  thresholds=thresholds)
    return with_telemetry(rep, history.telemetry(b.run_id))
