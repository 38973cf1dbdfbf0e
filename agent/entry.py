"""``fleet-agent``'s entry point: ``fleet-agent worker`` starts the worker without the CLI library.

``fleet-agent worker [--config PATH] [--loglevel LEVEL]`` is what the systemd unit runs; parsed
here, it goes straight to :func:`agent.worker.main`. Everything else, ``worker --help`` and any
option this parser does not know included, goes to :mod:`agent.cli`, which answers it (or reports
the error) as before.

Lazy imports: :mod:`agent.cli` and :mod:`agent.worker` are imported by the branch that runs them, so
the worker does not load typer (1.9 MiB of RSS, ``bench/agent.py --how cli``) and ``fleet-agent run``
does not load Celery's app (123 ms CPU, 14.7 MiB: ``bench/import_costs.py``, raw
bench/results/import_costs_20261207_0346_lazy-libraries.txt).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import NamedTuple


class WorkerArgs(NamedTuple):
    config: str | None
    loglevel: str


def worker_args(argv: Sequence[str]) -> WorkerArgs | None:
    """``worker [--config|-c PATH] [--loglevel LEVEL]`` -> its options; None for any other command line."""
    if not argv or argv[0] != "worker":
        return None
    values: dict[str, str] = {}
    names = {"--config": "config", "-c": "config", "--loglevel": "loglevel"}
    rest = list(argv[1:])
    while rest:
        arg = rest.pop(0)
        name, eq, value = arg.partition("=")
        if name not in names or (eq and name == "-c"):
            return None  # --help, an unknown option: agent.cli answers
        if not eq:
            if not rest or rest[0].startswith("-"):
                return None  # a missing value: agent.cli says so
            value = rest.pop(0)
        values[names[name]] = value
    return WorkerArgs(config=values.get("config"), loglevel=values.get("loglevel", "INFO"))


def main(argv: Sequence[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = worker_args(argv)
    if args is None:
        from agent.cli import main as cli_main

        cli_main(argv)
        return
    from agent.worker import main as worker_main

    worker_main(args.config, loglevel=args.loglevel)


if __name__ == "__main__":  # pragma: no cover
    main()
