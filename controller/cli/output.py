"""How ``fleetctl`` prints: one error format, one exit-code scheme, ``-o table|json|csv`` for
every verb that lists or shows something. Shared by every file that adds verbs (no verb here)."""

from __future__ import annotations

import csv
import functools
import json
import sys
from collections.abc import Callable, Sequence
from enum import Enum
from typing import Any

import typer

# 0: the run passed, the command did what was asked; 1: a module failed, the release regressed, a module could
# not be deployed; 2: bad input, unknown run, broker unreachable, missing extras (one line on stderr)
EXIT_PASS = 0
EXIT_FAILED = 1
EXIT_ERROR = 2


class Output(str, Enum):
    table = "table"
    json = "json"
    csv = "csv"


OUTPUT_HELP = "table, json or csv"


def output_option(default: Output = Output.table) -> Any:
    return typer.Option(default, "--output", "-o", help=OUTPUT_HELP, case_sensitive=False)


def new_app(**kw: Any) -> typer.Typer:
    """A typer app or group of fleetctl: help printed by click's plain formatter (rich's markup renderer
    costs more start-up time than the rest of ``fleetctl --help``), errors left to ``controller.cli.app.run``."""
    return typer.Typer(rich_markup_mode=None, pretty_exceptions_enable=False,
                       context_settings={"max_content_width": 120}, **kw)


def deprecation(old: str, new: str) -> None:
    """The one-line note a verb's old name prints on stderr (its alias is kept, hidden, for one release)."""
    sys.stderr.write(f"fleetctl: note: '{old}' is now '{new}'; the old name goes in the next release\n")
    sys.stderr.flush()


def renamed(verb: Callable[..., Any], old: str, new: str) -> Callable[..., Any]:
    """``verb`` under its old name ``old``: the same arguments and options (typer reads ``verb``'s signature
    through the wrapper), the note of :func:`deprecation` first."""
    @functools.wraps(verb)
    def alias(*args: Any, **kwargs: Any) -> Any:
        deprecation(f"fleetctl {old}", f"fleetctl {new}")
        return verb(*args, **kwargs)

    return alias


def error(message: str) -> None:
    """The one error format: ``fleetctl: error: <one line>`` on stderr."""
    sys.stderr.write(f"fleetctl: error: {message}\n")
    sys.stderr.flush()


def fail(message: str) -> typer.Exit:
    """Print the error line; the caller raises what this returns (exit code 2)."""
    error(message)
    return typer.Exit(EXIT_ERROR)


def _console(stderr: bool = False) -> Any:
    from rich.console import Console

    return Console(stderr=stderr, width=None if (sys.stderr if stderr else sys.stdout).isatty() else 200)


def stdout() -> Any:
    return _console()


def stderr() -> Any:
    return _console(stderr=True)


def _cell(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.2f}"
    if isinstance(v, (list, tuple)):
        return ",".join(str(x) for x in v)
    if isinstance(v, dict):
        return ",".join(f"{k}={x}" for k, x in v.items())
    return str(v)


def emit(records: Sequence[dict[str, Any]], columns: Sequence[str], fmt: Output, *, title: str | None = None,
         document: Any = None) -> None:
    """Print ``records`` as a table (``columns``), as JSON (``document`` if given, else the records,
    every field) or as CSV (``columns``, lists comma-joined)."""
    if fmt == Output.json:
        sys.stdout.write(json.dumps(records if document is None else document, indent=2, ensure_ascii=False,
                                    default=str) + "\n")
    elif fmt == Output.csv:
        w = csv.writer(sys.stdout, lineterminator="\n")
        w.writerow(columns)
        for r in records:
            w.writerow([_cell(r.get(c)) for c in columns])
    else:
        from rich.table import Table

        t = Table(*columns, title=title)
        for r in records:
            t.add_row(*(_cell(r.get(c)) for c in columns))
        stdout().print(t)
