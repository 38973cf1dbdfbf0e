"""``fleetctl cache``: the fleet's kernel cache store (``ls``, ``prune``).

Each verb parses and prints; :mod:`controller.service.kernel_cache` does the work, imported when the verb runs.

Lazy imports: that module loads the run history and pydantic: ``fleetctl --help`` imports this module with every
verb's and costs ~0.14 s of CPU in all (``bench/cli.py``: bench/results/cli_20261207_0057_defer-plugins.txt).
"""

from __future__ import annotations

import typer

from controller.cli.invocation import session
from controller.cli.output import Output, emit, output_option, stdout

CACHE_COLUMNS = ("version", "release", "key", "device_class", "environment", "archive", "size", "compiled_by",
                 "fetched_by", "trusted")


def cache_ls(ctx: typer.Context, output: Output = output_option()) -> None:
    """Compiled kernel caches in the store: per release, key (model set, device class, driver and toolkit) and
    archive, the modules that compiled it and those that fetched it instead of compiling."""
    from controller.service.kernel_cache import cache_entries

    s = session(ctx)
    recs = [e.as_dict() for e in cache_entries(s)]
    if output == Output.table and not recs:
        stdout().print(f"no kernel cache in {s.settings.kernel_cache_root()}", highlight=False, markup=False)
        return
    if output != Output.json:
        for r in recs:
            r["archive"] = r["archive"][:12]
    emit(recs, CACHE_COLUMNS, output)


def cache_prune(ctx: typer.Context,
                everything: bool = typer.Option(False, "--all", help="every cache, not only those of releases no "
                                                                     "run may still use")) -> None:
    """Remove the kernel caches of releases no run may still use (kept: those of running runs and of the
    5 newest, as the staged releases); with --all, every cache."""
    from controller.service.kernel_cache import prune_cache

    gone = prune_cache(session(ctx), everything=everything)
    stdout().print(f"removed the kernel caches of {len(gone)} release(s)" +
                   (f": {', '.join(d.name for d in gone)}" if gone else ""), highlight=False, markup=False)
