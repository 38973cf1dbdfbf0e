"""``fleetctl history migrate``: the run history's rows kept column-wise for fast reads
(:mod:`controller.history.frames`); ``fleetctl history copy``: the whole history copied into another
(:mod:`controller.history.copy`). This file parses and prints.

Lazy imports: :func:`copy` imports the run history and the controller's settings (pydantic) when it runs:
``fleetctl --help`` imports this module with every verb's and costs ~0.14 s of CPU in all (``bench/cli.py``:
bench/results/cli_20261207_0057_defer-plugins.txt).
"""

from __future__ import annotations

from typing import Annotated

import typer

from controller.cli.invocation import session
from controller.cli.output import Output, emit, output_option, stdout


def migrate(ctx: typer.Context, output: Output = output_option()) -> None:
    """Write the column file of every ended run that lacks a current one, so that reports read its rows
    column-wise. Idempotent; safe to interrupt and run again (a run without its file is read from SQLite)."""
    s = session(ctx)
    done = s.read_history().migrate_columns()
    rec = {"written": done.written, "current": done.current, "running": done.running, "abandoned": done.abandoned}
    if output != Output.table:
        emit([rec], list(rec), output, document=rec)
        return
    stdout().print(f"{done.written} run(s) written, {done.current} already current, {done.running} not ended "
                   f"(read from the history's tables until they end); {done.abandoned} abandoned temporary "
                   f"file(s) removed ({s.history_path})", highlight=False, markup=False)


def copy(ctx: typer.Context,
         to: Annotated[str, typer.Option("--to", metavar="LOCATION", help=(
             "the history to copy into: a SQLite file, or a postgresql:// URL (its password from ~/.pgpass or "
             "PGPASSWORD, not in the URL: a URL on the command line is visible to every user of the machine)"))],
         output: Output = output_option()) -> None:
    """Copy every run of this history (rows, progress, events, verdicts, baselines, telemetry, webhook events) into
    another, e.g. an existing SQLite history into a shared PostgreSQL database. Each run is copied whole or not at
    all; run it again to resume or to bring runs that were still running up to date."""
    from controller.history import History, copy_history
    from controller.settings import ControllerSettings

    s = session(ctx)
    src = s.read_history()
    dest_settings = ControllerSettings(history=to, data_dir=s.settings.data_dir)
    dst = History(dest_settings.history_location)
    try:
        done = copy_history(src.db, dst.db)
    finally:
        dst.close()
    rec = {"copied": done.copied, "current": done.current, "replaced": done.replaced,
           "module_events": done.module_events, "webhook_targets": done.targets}
    if output != Output.table:
        emit([rec], list(rec), output, document=rec)
        return
    stdout().print(f"{done.copied} run(s) copied, {done.current} already current, {done.replaced} brought up to date; "
                   f"{done.module_events} module event(s) and {done.targets} webhook target(s) added "
                   f"({s.history_path} -> {dest_settings.history_path})", highlight=False, markup=False)
