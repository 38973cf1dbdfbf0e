"""fleetctl commands of the reports: ``report``, ``compare`` and ``baseline import|set|list``.

Module-level verbs (:func:`controller.cli.app.build_app` adds them) reading the run history through the
invocation's session (:func:`controller.cli.invocation.session`). Errors end in one clear line and exit
code 2; ``--check`` exits 1 unless the verdict is pass.

Lazy imports: the report's modules (pandas, numpy) and the run history load when a report command runs:
``fleetctl --help`` imports this module with every verb's and costs ~0.14 s of CPU in all, where pandas alone
costs 462 ms (``bench/cli.py``, ``bench/import_costs.py``: bench/results/cli_20261207_0057_defer-plugins.txt,
bench/results/import_costs_20261207_0346_lazy-libraries.txt).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

import typer

from contract.files import write_atomic
from controller.cli import served
from controller.cli.invocation import history_given, session
from controller.cli.output import EXIT_ERROR, EXIT_FAILED, Output, emit, fail, output_option
from controller.cli.served import SERVICE_HELP, use_service
from controller.command import fleetctl

if TYPE_CHECKING:
    from controller.report.model import Report, Thresholds

EXIT_NOT_PASS = EXIT_FAILED
__all__ = ["EXIT_ERROR", "EXIT_NOT_PASS", "Format", "baseline_import", "baseline_list", "baseline_set", "compare",
           "report"]


class Format(str, Enum):
    md = "md"
    html = "html"
    csv = "csv"
    json = "json"


def _fail(message: str) -> None:
    raise fail(message)


def _emit(report: Report, fmt: Format, out: Path | None, check: bool) -> None:
    from controller.report.render import to_json, to_markdown, verdict_line, write_report

    if out is None and fmt in (Format.md, Format.json):
        sys.stdout.write(to_markdown(report) if fmt is Format.md else to_json(report) + "\n")
    else:
        target = out or _default_out(report.run_id)
        for path in write_report(report, fmt.value, target):
            typer.echo(f"wrote {path.resolve()}", err=True)
        typer.echo(verdict_line(report))
    if check and report.verdict != "pass":
        raise typer.Exit(EXIT_NOT_PASS)


# controller.report.model.STARTUP_TOLERANCE, not imported: that module loads pandas
STARTUP_TOLERANCE = 0.15


def _default_out(run_id: str) -> Path:
    """./report-<run>/, where html and csv go without ``--out``."""
    return Path(f"report-{run_id.replace(':', '_').replace('/', '_')}")


def _check_fractions(options: dict[str, float]) -> None:
    """Each option (``--name``: value) a fraction between 0 and 1, else one line naming it."""
    for name, v in options.items():
        if not 0 < v < 1:
            _fail(f"{name} must be a fraction between 0 and 1, got {v}")


def _thresholds(tolerance: float, energy_tolerance: float = 0.05,
                startup_tolerance: float = STARTUP_TOLERANCE) -> Thresholds:
    from controller.report.model import Thresholds

    _check_fractions({"--tolerance": tolerance, "--energy-tolerance": energy_tolerance,
                      "--startup-tolerance": startup_tolerance})
    return Thresholds(tolerance=tolerance, energy_tolerance=energy_tolerance, startup_tolerance=startup_tolerance)


def _report(build: Callable[[Thresholds], Report], tolerance: float, fmt: Format, out: Path | None,
            check: bool, energy_tolerance: float = 0.05, startup_tolerance: float = STARTUP_TOLERANCE) -> None:
    """Build a report with ``tolerance`` (a bad run, baseline or history: one line, exit 2) and emit it."""
    from controller.history import HistoryError
    from controller.report.model import ReportError

    try:
        rep = build(_thresholds(tolerance, energy_tolerance, startup_tolerance))
    except (ReportError, HistoryError, OSError) as exc:
        _fail(str(exc))
    # the figures may differ for that alone: said where a person looks
    for warning in rep.environment_changes:
        typer.echo(f"warning: {warning}", err=True)
    _emit(rep, fmt, out, check)


def _served_report(service: str, run: str, baseline: str | None, fmt: Format, out: Path | None, check: bool,
                   tolerances: dict[str, float]) -> None:
    """``fleetctl report --service``: the report a running ``fleetctl serve`` makes, printed or written as
    ``fleetctl report`` does (:mod:`controller.cli.served`)."""
    if fmt is Format.csv:
        _fail("--output csv with --service: not served (it is several tables and a Parquet file); "
              "read the history here instead (--history)")
    _check_fractions({f"--{name.replace('_', '-')}": v for name, v in tolerances.items()})
    got = served.get(service, f"/runs/{quote(run, safe='')}/report",
                     {"format": fmt.value, "baseline": baseline, **tolerances})
    for warning in got.warnings:
        typer.echo(f"warning: {warning}", err=True)
    if out is None and fmt in (Format.md, Format.json):
        sys.stdout.buffer.write(got.body + (b"\n" if fmt is Format.json else b""))
        sys.stdout.flush()
    else:
        path = (out or _default_out(got.run_id)) / f"report.{fmt.value}"
        mask = os.umask(0)
        os.umask(mask)
        try:
            write_atomic(path, got.body.decode("utf-8"), mode=0o666 & ~mask)
        except OSError as exc:
            _fail(f"{path}: cannot be written ({exc.strerror or exc})")
        typer.echo(f"wrote {path.resolve()}", err=True)
        typer.echo(got.verdict_line)
    if check and got.verdict != "pass":
        raise typer.Exit(EXIT_NOT_PASS)


FORMAT_HELP = "md, html, csv (+parquet) or json"
OUT_HELP = "folder to write into (default: md/json to stdout, html/csv into ./report-RUN/)"


def report(
    ctx: typer.Context,
    run: str = typer.Argument("latest", help="run id, unique prefix or 'latest' (the default)"),
    baseline: str | None = typer.Option(None, "--baseline", "-b", help="'1.4.1', '1.4.1@v2' or a run id"),
    fmt: Format = typer.Option(Format.md, "--output", "-o", help=FORMAT_HELP),
    old_fmt: Format | None = typer.Option(None, "--format", hidden=True, help="old name of --output"),
    out: Path | None = typer.Option(None, "--out", help=OUT_HELP),
    tolerance: float = typer.Option(0.05, help="relative change that counts as a regression"),
    energy_tolerance: float = typer.Option(0.05, help="relative change of energy per token (J/token, "
                                                      "tokens/J) that counts as a regression"),
    startup_tolerance: float = typer.Option(STARTUP_TOLERANCE, help="relative change of a start-up cost (server "
                                            "ready, first request, precompile) that counts as a regression"),
    check: bool = typer.Option(False, "--check", help=f"exit {EXIT_NOT_PASS} unless the verdict is pass"),
    service: str | None = typer.Option(None, "--service", envvar="FLEET_SERVICE", help=SERVICE_HELP),
) -> None:
    """Verdict, regressions, outlier modules and fleet summary of one run (default: the latest)."""
    remote = use_service(ctx, service, history_given(ctx))
    if remote is not None:
        _served_report(remote, run, baseline, old_fmt or fmt, out, check,
                       {"tolerance": tolerance, "energy_tolerance": energy_tolerance,
                        "startup_tolerance": startup_tolerance})
        return
    from controller.report.load import build_report

    s = session(ctx)
    html = (old_fmt or fmt) == Format.html  # the HTML report has a "History" section
    _report(lambda th: build_report(s.read_history(), run, baseline, thresholds=th, with_history=html,
                                    same_environment=s.settings.baseline_same_environment), tolerance,
            old_fmt or fmt, out, check, energy_tolerance, startup_tolerance)


def compare(
    ctx: typer.Context,
    run_a: str = typer.Argument(..., help="the reference run"),
    run_b: str = typer.Argument(..., help="the run compared with it"),
    fmt: Format = typer.Option(Format.md, "--output", "-o", help=FORMAT_HELP),
    old_fmt: Format | None = typer.Option(None, "--format", hidden=True, help="old name of --output"),
    out: Path | None = typer.Option(None, "--out", help=OUT_HELP),
    tolerance: float = typer.Option(0.05, help="relative change that counts as a regression"),
    check: bool = typer.Option(False, "--check", help=f"exit {EXIT_NOT_PASS} unless the verdict is pass"),
) -> None:
    """Run B against run A (module by module where they share modules)."""
    from controller.report.load import compare_runs

    _report(lambda th: compare_runs(session(ctx).read_history(), run_a, run_b, thresholds=th), tolerance,
            old_fmt or fmt, out, check)


BASELINE_HELP = "Baselines: reference figures per release, versioned."


def baseline_import(
    ctx: typer.Context,
    seed_file: Path = typer.Argument(..., help="reference document with the result tables"),
    release: str = typer.Option(..., "--release", "-r", help="release these figures belong to, e.g. 1.4.1"),
) -> None:
    """Import the reference tables of SEED_FILE as the next baseline version of RELEASE."""
    from agent.tables import TableError, parse_seed
    from controller.history import HistoryError

    try:
        text = seed_file.read_text(encoding="utf-8")
        tables = parse_seed(text, source=str(seed_file))
    except (OSError, UnicodeDecodeError, TableError) as exc:
        _fail(f"{seed_file}: {exc}" if not isinstance(exc, TableError) else str(exc))
    rows = [r for key_rows in tables.values() for r in key_rows]
    if not rows:
        _fail(f"{seed_file}: no result tables found")
    try:
        version, run_id = session(ctx).history().add_baseline(release, rows, source=str(seed_file))
    except HistoryError as exc:
        _fail(str(exc))
    typer.echo(f"baseline {release}@v{version} ({run_id}): {len(rows)} rows, {len(tables)} model keys")


def baseline_set(
    ctx: typer.Context,
    run: str = typer.Argument(..., help="run whose rows become the baseline"),
    release: str | None = typer.Option(None, "--release", "-r", help="default: the run's release"),
) -> None:
    """Promote a run's results to the next baseline version of its release."""
    from controller.history import HistoryError

    hist = session(ctx).history()
    try:
        info = hist.find_run(run)
        rows = [r for r in hist.rows(info.run_id) if r.source == "release"]  # not the probe's
    except HistoryError as exc:
        _fail(str(exc))
    rel = release or info.release
    if not rel:
        _fail(f"run {info.run_id} has no release; give --release")
    if not rows:
        _fail(f"run {info.run_id} has no result rows")
    version, run_id = hist.add_baseline(rel, rows, source=f"run:{info.run_id}")
    typer.echo(f"baseline {rel}@v{version} ({run_id}): {len(rows)} rows from run {info.run_id}")


def baseline_list(ctx: typer.Context, output: Output = output_option()) -> None:
    """Every baseline version, oldest first."""
    hist = session(ctx).read_history()
    items = [{**b, "baseline": f"{b['release']}@v{b['version']}", "rows": hist.row_count(b["run_id"])}
             for b in hist.baselines()]
    if not items and output == Output.table:
        typer.echo(f"no baselines ({fleetctl('baseline', 'import', 'SEED_FILE', '--release', 'R')})")
        return
    emit(items, ["baseline", "run_id", "rows", "source"], output)
