"""``fleetctl trend``: change points across the release history (or of one column of a CSV file).

``controller.cli.app`` calls :func:`register` with its typer app and the function that opens the run
history for reading. The work is :mod:`controller.report.trend` and
:mod:`controller.report.analysis.changepoints`; this file parses and prints.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from controller.cli.output import Output, emit, fail, output_option, stdout
from controller.cli.served import SERVICE_HELP, use_service

if TYPE_CHECKING:
    from controller.history import History
    from controller.report.analysis.changepoints import DetectorSettings

COLUMNS = ["release", "model_key", "profile", "metric", "scope", "size", "ci", "p", "in_force"]
SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], mark: int | None = None) -> str:
    """The series as one line of block characters; ``|`` before index ``mark`` (a change point)."""
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    cells = [SPARK[min(len(SPARK) - 1, int((v - lo) / span * len(SPARK)))] for v in values]
    if mark is not None:
        cells.insert(mark, "|")
    return "".join(cells)


def from_csv(path: Path, column: str, order_by: str | None, settings: DetectorSettings) -> \
        tuple[list[dict[str, Any]], list[float]]:
    """The change points of one column of a CSV file (rows in file order, or sorted by ``order_by``)."""
    import pandas as pd

    from controller.report.analysis.changepoints import SeriesError, analyse_series
    from controller.report.trend import TrendError, record

    try:
        df = pd.read_csv(path)
    except (OSError, ValueError) as exc:
        raise TrendError(f"{path}: cannot be read as CSV ({exc})") from exc
    for c in (column, order_by):
        if c is not None and c not in df.columns:
            raise TrendError(f"{path}: no column {c!r} (columns: {', '.join(map(str, df.columns))})")
    if order_by:
        df = df.sort_values(order_by, kind="stable")
    values = pd.to_numeric(df[column], errors="coerce")
    if values.isna().any():
        bad = int(values.isna().to_numpy().argmax())
        raise TrendError(f"{path}: column {column!r}, data row {bad + 1}: {df[column].iloc[bad]!r} is not a number")
    labels = [str(v) for v in (df[order_by] if order_by else pd.Series(range(len(df))))]
    try:
        found = analyse_series(values.to_numpy(dtype=float), settings).change_points
    except SeriesError as exc:
        raise TrendError(f"{path}: column {column!r}: {exc}") from exc
    recs = [record(labels[cp.index], "", "", column, "csv", cp) for cp in found]
    return recs, [float(v) for v in values]


def register(app: typer.Typer, get_history: Callable[[], History],
             history_given: Callable[[], bool] = lambda: False) -> None:
    """Add ``trend`` to ``app``; ``get_history`` opens the run history for reading; ``history_given``: whether
    ``--history`` named one (it wins over ``FLEET_SERVICE``)."""

    @app.command("trend")
    def trend_cmd(
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
        output: Output = output_option(),
        service: str | None = typer.Option(None, "--service", envvar="FLEET_SERVICE", help=SERVICE_HELP),
    ) -> None:
        """Change points across the releases in the run history (or of one CSV column): table and sparklines."""
        remote = None if from_csv_file is not None else use_service(ctx, service, history_given())
        if remote is not None:
            from controller.cli import served

            got = served.get(remote, "/trend", {"models": models, "profile": profile, "metric": metric,
                                                "devices": devices, "min_magnitude": min_magnitude,
                                                "max_pvalue": max_pvalue})
            _print_trend(json.loads(got.body), got.releases, output)
            return
        from controller.report.trend import settings_of  # pandas: only when the command runs

        settings = settings_of(min_magnitude, max_pvalue)
        if from_csv_file is not None:
            if not column:
                raise fail("--from-csv needs --column")
            recs, values = from_csv(from_csv_file, column, order_by, settings)
            emit(recs, COLUMNS, output)
            if output == Output.table:
                marks = [r["index"] for r in recs]
                stdout().print(f"{column}: {sparkline(values, marks[0] if marks else None)}", highlight=False)
            return
        _history_trend(get_history(), models, profile, metric, devices, settings, output)


def _history_trend(history: History, models: str, profile: str | None, metric: str | None, devices: str,
                   settings: DetectorSettings, output: Output) -> None:
    from contract.records import parse_model_keys
    from controller.report.load import trend_frames
    from controller.report.trend import TrendQuery, trend_records

    query = TrendQuery(models=None if models == "all" else tuple(parse_model_keys(models)), profile=profile,
                       metric=metric, settings=settings,
                       devices=None if devices == "all" else frozenset(d.strip() for d in devices.split(",")
                                                                       if d.strip()))
    got = trend_records(*trend_frames(history, query), query)
    _print_trend(got.records, got.releases, output)


MIN_RELEASES = 12  # controller.report.trend.MIN_RELEASES (not imported here: a served trend has no pandas)


def _print_trend(recs: list[dict[str, Any]], releases: int, output: Output) -> None:
    """The records of a trend (``releases``: how many the history holds) as ``fleetctl trend`` prints them."""
    if not recs and output == Output.table:
        n = releases
        short = (f" (at the default --max-pvalue none can be named under {MIN_RELEASES}: docs/howto/trends.md)"
                 if n < MIN_RELEASES else "")
        stdout().print(f"no change points over {n} release{'' if n == 1 else 's'}{short}", highlight=False)
        return
    shown = recs if output == Output.json else [{**r, "modules_moved": ", ".join(r["modules_moved"])} for r in recs]
    emit(shown, [*COLUMNS, "moved", "modules_moved"], output)  # JSON: every field, "moved_with" each series
    if output == Output.table:
        for r in recs:
            stdout().print(f"{r['model_key']} {r['profile']} {r['metric']} ({r['scope']}): "
                           f"{sparkline(r['values'], r['index'])}", highlight=False)
