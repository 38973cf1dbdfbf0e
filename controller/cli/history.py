"""``fleetctl history migrate``: the run history's rows kept column-wise for fast reads
(:mod:`controller.history.frames`). This file parses and prints."""

from __future__ import annotations

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
