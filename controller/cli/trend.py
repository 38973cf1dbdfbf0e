"""``fleetctl trend``: change points across the release history (or of one column of a CSV file).

A module-level verb (:func:`controller.cli.app.build_app` adds it) reading the run history through the
invocation's session. The work is :mod:`controller.report.trend` and
:mod:`controller.report.analysis.changepoints`; this file parses and prints.

Lazy imports: those modules load pandas and numpy (pandas alone 462 ms of CPU, ``bench/import_costs.py``)
when a trend is computed here, never for a served one: ``fleetctl --help`` imports this module with every verb's
and costs ~0.14 s of CPU in all (``bench/cli.py``: bench/results/cli_20261207_0057_defer-plugins.txt).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from controller.cli import served
from controller.cli.invocation import history_given, session
from controller.cli.output import Output, emit, fail, output_option, stderr, stdout
from controller.cli.served import SERVICE_HELP, use_service

if TYPE_CHECKING:
    from controller.history import History
    from controller.report.analysis.changepoints import DetectorSettings

COLUMNS = ["release", "model_key", "profile", "metric", "scope", "size", "ci", "p", "in_force", "drift"]
SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], mark: int | None = None) -> str:
    """The series as one line of block characters; ``|`` before index ``mark`` (a change point)."""
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    cells = [SPARK[min(len(SPARK) - 1, int((v - lo) / span * len(SPARK)))] for v in values]
    if mark is not None:
        cells.insert(mark, "|")
    return "".join(cells)


def from_csv(path: Path, column: str, order_by: str | None, settings: DetectorSettings, *,
             skip_blanks: bool = False) -> tuple[list[dict[str, Any]], list[float], list[int]]:
    """The change points of one column of a CSV file (rows in file order, or sorted by ``order_by``), its values,
    and the file lines of the rows left out for a blank (only with ``skip_blanks``; without it a blank is refused,
    naming its line: a series silently shorter would move every later value's index)."""
    import pandas as pd

    from controller.report.analysis.changepoints import SeriesError, analyse_series
    from controller.report.trend import TrendError, record

    # every cell as its text, a blank line a row of blanks: what is blank is seen, not dropped or NaN
    try:
        df = pd.read_csv(path, dtype=str, keep_default_na=False, skip_blank_lines=False).fillna("")
    except (OSError, ValueError) as exc:
        raise TrendError(f"{path}: cannot be read as CSV ({exc})") from exc
    for c in (column, order_by):
        if c is not None and c not in df.columns:
            raise TrendError(f"{path}: no column {c!r} (columns: {', '.join(map(str, df.columns))})")
    df.index = pd.RangeIndex(2, len(df) + 2)  # each row's line in the file (the header is line 1)
    filled = (df != "").any(axis=1).to_numpy()
    # the blank lines at the end left out
    df = df.iloc[:len(filled) - int(filled[::-1].argmax())] if filled.any() else df.iloc[:0]
    used = [c for c in (column, order_by) if c is not None]
    blank = (df[used].apply(lambda col: col.str.strip()) == "").any(axis=1)
    if blank.any() and not skip_blanks:
        line = int(blank.idxmax())
        which = next(c for c in used if not df.at[line, c].strip())
        raise TrendError(f"{path}: line {line}, column {which!r}: blank ({int(blank.sum())} row"
                         f"{'s' if blank.sum() > 1 else ''} with a blank; --skip-blanks leaves them out)")
    skipped = [int(i) for i in df.index[blank]]
    df = df[~blank]
    if order_by:
        key = pd.to_numeric(df[order_by], errors="coerce")
        df = df.iloc[(key if key.notna().all() else df[order_by]).argsort(kind="stable")]
    values = pd.to_numeric(df[column], errors="coerce")
    bad = ~values.apply(lambda v: math.isfinite(v) if isinstance(v, (int, float)) else False)
    # a blank or a word, nan, inf, or a figure beyond a float (1e999): named by its line and text
    if bad.any():
        line = int(values.index[bad.to_numpy().argmax()])
        raise TrendError(f"{path}: line {line}, column {column!r}: {df.at[line, column]!r} is not a finite number")
    # each row named by --order-by's value, else by its line in the file (what a user finds it by; not 0, 1, ...)
    labels = [str(v) for v in df[order_by]] if order_by else [f"line {n}" for n in df.index]
    try:
        found = analyse_series(values.to_numpy(dtype=float), settings).change_points
    except SeriesError as exc:
        raise TrendError(f"{path}: column {column!r}: {exc}") from exc
    recs = [record(labels[cp.index], "", "", column, "csv", cp, labels[cp.end]) for cp in found]
    return recs, [float(v) for v in values], skipped


def trend(
    ctx: typer.Context,
    models: str = typer.Option("all", "--models", "-m", help="model keys, comma separated, or 'all'"),
    profile: str | None = typer.Option(None, "--profile", help="only this profile"),
    metric: str | None = typer.Option(None, "--metric", help="only this metric (e.g. decode_tps)"),
    devices: str = typer.Option("all", "--devices", "-d", help="'all' or module names, comma separated "
                                "(per-module series of those; the fleet series are over every module)"),
    min_magnitude: float = typer.Option(0.03, "--min-magnitude", help="smallest relative change reported"),
    max_pvalue: float = typer.Option(0.002, "--max-pvalue", help="largest p-value of a change point"),
    from_csv_file: Path | None = typer.Option(None, "--from-csv", help="a CSV file instead of the history"),
    column: str | None = typer.Option(None, "--column", help="with --from-csv: the column of values"),
    order_by: str | None = typer.Option(None, "--order-by", help="with --from-csv: sort the rows by this column"),
    skip_blanks: bool = typer.Option(False, "--skip-blanks", help="with --from-csv: leave out the rows with a "
                                     "blank value (said on stderr); without it a blank is refused"),
    output: Output = output_option(),
    service: str | None = typer.Option(None, "--service", envvar="FLEET_SERVICE", help=SERVICE_HELP),
) -> None:
    """Change points across the releases in the run history (or of one CSV column): table and sparklines."""
    remote = None if from_csv_file is not None else use_service(ctx, service, history_given(ctx))
    if remote is not None:
        got = served.get(remote, "/trend", {"models": models, "profile": profile, "metric": metric,
                                            "devices": devices, "min_magnitude": min_magnitude,
                                            "max_pvalue": max_pvalue})
        _print_trend(json.loads(got.body), got.releases, output, got.reach)
        return
    from controller.report.trend import settings_of

    settings = settings_of(min_magnitude, max_pvalue)
    if from_csv_file is not None:
        if not column:
            raise fail("--from-csv needs --column")
        recs, values, skipped = from_csv(from_csv_file, column, order_by, settings, skip_blanks=skip_blanks)
        if skipped:
            stderr().print(f"{len(skipped)} row{'s' if len(skipped) > 1 else ''} with a blank left out (line"
                           f"{'s' if len(skipped) > 1 else ''} {', '.join(map(str, skipped[:10]))}"
                           f"{', ...' if len(skipped) > 10 else ''})", highlight=False)
        if not recs:
            _say_none(f"no change points in {len(values)} values of {column!r}", _csv_reach(values, settings),
                      output)
            if output == Output.table:
                return
        emit(recs, COLUMNS, output)
        if output == Output.table:
            marks = [r["index"] for r in recs]
            stdout().print(f"{column}: {sparkline(values, marks[0] if marks else None)}", highlight=False)
        return
    _history_trend(session(ctx).read_history(), models, profile, metric, devices, settings, output)


def _history_trend(history: History, models: str, profile: str | None, metric: str | None, devices: str,
                   settings: DetectorSettings, output: Output) -> None:
    from contract.records import parse_model_keys
    from controller.report.kept import trend_of
    from controller.report.trend import TrendQuery

    query = TrendQuery(models=None if models == "all" else tuple(parse_model_keys(models)), profile=profile,
                       metric=metric, settings=settings,
                       devices=None if devices == "all" else frozenset(d.strip() for d in devices.split(",")
                                                                       if d.strip()))
    # the findings the history keeps (computed and kept if the history changed since)
    got = trend_of(history, query)
    _print_trend(got.records, got.releases, output, got.reach.line() if got.reach is not None else None)


# controller.report.trend.MIN_RELEASES, not imported: a served trend loads no pandas
MIN_RELEASES = 6


def _csv_reach(values: list[float], settings: DetectorSettings) -> str | None:
    import numpy as np

    from controller.report.trend import reach_of

    got = reach_of([np.asarray(values, dtype=float)], settings) if values else None
    return got.line().replace(" (noise", " (its noise").replace(", median of 1 series", "") if got else None


def _say_none(head: str, reach: str | None, output: Output) -> None:
    """The line of an empty result, with what could have been found: on stdout for a table, else on stderr (the
    JSON or CSV on stdout stays empty)."""
    line = f"{head}; {reach}" if reach else head
    (stdout() if output == Output.table else stderr()).print(line, highlight=False)


def _print_trend(recs: list[dict[str, Any]], releases: int, output: Output, reach: str | None = None) -> None:
    """The records of a trend (``releases``: how many the history holds; ``reach``: with none, what could have
    been found) as ``fleetctl trend`` prints them."""
    if not recs:
        n = releases
        short = (f" (none can be named under {MIN_RELEASES}: docs/howto/trends.md)" if n < MIN_RELEASES else "")
        _say_none(f"no change points over {n} release{'' if n == 1 else 's'}{short}",
                  reach if n >= MIN_RELEASES else None, output)
        if output == Output.table:
            return
    shown = recs if output == Output.json else [{**r, "modules_moved": ", ".join(r["modules_moved"])} for r in recs]
    emit(shown, [*COLUMNS, "moved", "modules_moved"], output)  # JSON: every field, "moved_with" each series
    if output == Output.table:
        for r in recs:
            stdout().print(f"{r['model_key']} {r['profile']} {r['metric']} ({r['scope']}): "
                           f"{sparkline(r['values'], r['index'])}", highlight=False)
