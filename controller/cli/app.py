"""``fleetctl``: the controller's command line, assembled: root options, the command tree, errors and exit codes.

The verbs live by group: :mod:`controller.cli.runs` (validate, status, watch, cancel, retry, runs,
results, logs, describe run), :mod:`controller.cli.devices` (devices, devices reset, describe
module), :mod:`controller.cli.services` (serve, demo), :mod:`controller.cli.report` (report,
compare, baseline), :mod:`controller.cli.trend` (trend), :mod:`controller.cli.deploy` (deploy, push, devices
check, broker acl), :mod:`controller.cli.golden` (golden), :mod:`controller.cli.ab` (ab),
:mod:`controller.cli.reserve` (reserve, reservations, unreserve), :mod:`controller.cli.bisect` (bisect),
:mod:`controller.cli.targets` (prometheus-targets). They parse and print; :mod:`controller.service`
does the work.

Exit codes, everywhere: 0 pass (or done), 1 a module failed or the release regressed, 2 an
error (bad input, unknown run, broker unreachable, missing extras), reported as one line
``fleetctl: error: ...`` on stderr. 130 when interrupted. A user's error says its own exit code
(:mod:`controller.errors`); anything else is a bug: its traceback, exit 2.

Only typer and click are imported to build the command tree: every verb imports what it uses
(the service, rich, pandas, paramiko) when it runs, so ``fleetctl --help`` stays light and works
without the controller extras.

Lazy imports: ``version`` reads the contract's versions and an unexpected error asks the fleet which errors are
the broker's, when they happen: :mod:`controller.fleet` loads pydantic and the run history, and ``fleetctl
--help`` costs ~0.14 s of CPU in all (``bench/cli.py``: bench/results/cli_20261207_0057_defer-plugins.txt).
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperGroup

from contract.oneline import error_line
from controller.cli import ab as ab_cli
from controller.cli import bisect as bisect_cli
from controller.cli import cache as cache_cli
from controller.cli import deploy as deploy_cli
from controller.cli import devices as devices_cli
from controller.cli import golden as golden_cli
from controller.cli import history as history_cli
from controller.cli import report as report_cli
from controller.cli import reserve as reserve_cli
from controller.cli import runs as runs_cli
from controller.cli import services as services_cli
from controller.cli import targets as targets_cli
from controller.cli import trend as trend_cli
from controller.cli.invocation import Invocation
from controller.cli.output import EXIT_ERROR, Output, emit, error, new_app, output_option, renamed
from controller.errors import exit_code_of

__all__ = ["Invocation", "build_app", "main", "run"]

# read when neither --config nor FLEET_CONFIG names a file, as git reads ./.git and the inventory ./inventory.toml
DEFAULT_CONFIG = Path("fleet.toml")


def _root(
    ctx: typer.Context,
    config: Path | None = typer.Option(None, "--config", "-c", envvar="FLEET_CONFIG",
                                       help="TOML config file (sections [fleet] and [controller]); default "
                                            "./fleet.toml when the current folder holds one"),
    inventory: Path | None = typer.Option(None, "--inventory", "-i", help="inventory TOML (default from config)"),
    history: str | None = typer.Option(None, "--history",
                                       help="run history: a SQLite file, or a PostgreSQL URL (postgresql://...)"),
) -> None:
    """Validate SGLang-MUSA releases on a fleet of M1000 modules."""
    inv = ctx.obj
    assert isinstance(inv, Invocation)
    if config is None and DEFAULT_CONFIG.is_file():
        # as the inventory defaults to ./inventory.toml: a lab folder's own config, not the embedded broker (on
        # which every module of a Redis lab shows offline)
        config = DEFAULT_CONFIG
    inv.config, inv.inventory, inv.history = config, inventory, history


def version(output: Output = output_option()) -> None:
    """Version of fleetctl, of the records it exchanges with agents (its contract), the agents' contract versions it
    works with, and Python's."""
    from contract.version import versions  # no pydantic, broker or history

    v = versions()
    if output == Output.table:
        print(f"fleetctl {v['fleetctl']} (records schema {v['record_schema']}, works with agents of "
              f"{v['works_with_agents']}, Python {v['python']})")
        return
    emit([v], list(v), output, document=v)


# ``fleetctl --help`` lists the verbs as a user meets them: try it, validate and read a run, the lab's
# modules and who holds them, then across releases, the lab's stores, setting a lab up, the service; a verb not named
# here comes after these (a test checks that every verb is named)
HELP_ORDER = ("demo", "validate", "status", "watch", "runs", "report", "compare", "results", "logs", "cancel",
              "retry", "devices", "golden", "describe", "queue", "reserve", "reservations", "unreserve", "trend",
              "ab", "bisect", "baseline", "history", "cache", "deploy", "push", "prometheus-targets", "broker", "serve",
              "version")
# old names, hidden, kept for one release: each prints a one-line note on stderr and runs the new verb (ADR 0057)
RENAMED = {"release": "unreserve", "compare-releases": "ab"}


class _Ordered(TyperGroup):
    def list_commands(self, ctx: Any) -> list[str]:  # typer's own click Context
        names = super().list_commands(ctx)
        rank = {n: i for i, n in enumerate(HELP_ORDER)}
        return sorted(names, key=lambda n: (rank.get(n, len(rank)), names.index(n)))


def build_app() -> typer.Typer:
    """The command tree: the verbs of every group, each a module-level function that gets the invocation's session
    from the context (:func:`controller.cli.invocation.session`)."""
    app = new_app(no_args_is_help=True, add_completion=True, cls=_Ordered)
    app.callback()(_root)
    app.command("ab")(ab_cli.ab)
    app.command("bisect")(bisect_cli.bisect)
    for verb in (runs_cli.validate, runs_cli.status, runs_cli.watch, runs_cli.cancel, runs_cli.retry, runs_cli.runs,
                 runs_cli.results, runs_cli.logs, services_cli.serve, services_cli.demo, version):
        app.command()(verb)
    devices_app = new_app(add_completion=False, invoke_without_command=True,
                          help="Modules of the inventory and their state (idle, busy, unreachable, offline, bad).")
    devices_app.callback()(devices_cli.devices)
    devices_app.command("reset")(devices_cli.devices_reset)
    devices_app.command("power")(devices_cli.devices_power)
    devices_app.command("check")(deploy_cli.devices_check)
    app.add_typer(devices_app, name="devices")
    app.command("queue")(devices_cli.queue)
    app.command("reserve")(reserve_cli.reserve)
    app.command("reservations")(reserve_cli.reservations)
    app.command("unreserve")(reserve_cli.unreserve)
    app.command("golden")(golden_cli.golden)
    describe_app = new_app(add_completion=False, no_args_is_help=True,
                           help="Everything about one run or one module (read-only).")
    describe_app.command("run")(runs_cli.describe_run)
    describe_app.command("module")(devices_cli.describe_module)
    app.add_typer(describe_app, name="describe")
    history_app = new_app(add_completion=False, no_args_is_help=True, help="The run history's storage.")
    history_app.command("migrate")(history_cli.migrate)
    history_app.command("copy")(history_cli.copy)
    app.add_typer(history_app, name="history")
    cache_app = new_app(add_completion=False, no_args_is_help=True,
                        help="The fleet's kernel cache: compiled TileLang kernels modules share (docs/howto/"
                             "kernel-cache.md).")
    cache_app.command("ls")(cache_cli.cache_ls)
    cache_app.command("prune")(cache_cli.cache_prune)
    app.add_typer(cache_app, name="cache")
    app.command("report")(report_cli.report)
    app.command("compare")(report_cli.compare)
    baseline_app = new_app(add_completion=False, no_args_is_help=True, help=report_cli.BASELINE_HELP)
    baseline_app.command("import")(report_cli.baseline_import)
    baseline_app.command("set")(report_cli.baseline_set)
    baseline_app.command("list")(report_cli.baseline_list)
    app.add_typer(baseline_app, name="baseline")
    app.command("trend")(trend_cli.trend)
    app.command("deploy")(deploy_cli.deploy)
    app.command("push")(deploy_cli.push)
    broker_app = new_app(add_completion=False, help=deploy_cli.BROKER_HELP)
    broker_app.command("acl")(deploy_cli.broker_acl)
    app.add_typer(broker_app, name="broker")
    app.command("prometheus-targets")(targets_cli.prometheus_targets)
    verbs: dict[str, Callable[..., Any]] = {"unreserve": reserve_cli.unreserve, "ab": ab_cli.ab}
    for old, new in RENAMED.items():
        app.command(old, hidden=True)(renamed(verbs[new], old, new))
    return app


# --------------------------------------------------------------------------- errors and exit codes
CONTROLLER_EXTRA = frozenset({"pandas", "numpy", "scipy", "pyarrow", "matplotlib", "jinja2", "fabric", "paramiko",
                              "invoke", "fastapi", "uvicorn", "starlette"})


def run(argv: list[str] | None = None) -> int:
    """Run ``fleetctl ARGV``; the exit code (every error handled here, once)."""
    inv = Invocation()
    try:
        rv = build_app()(args=argv, prog_name="fleetctl", standalone_mode=False, obj=inv)
        return rv if isinstance(rv, int) else 0
    except typer.Exit as e:
        return int(e.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        return 130
    except typer.TyperException as e:  # click's usage errors (typer's own copy of click)
        show = getattr(e, "show", None)
        if show is not None:
            show()
        else:
            error(str(e))
        return EXIT_ERROR
    except ModuleNotFoundError as e:
        if (e.name or "").partition(".")[0] not in CONTROLLER_EXTRA:
            raise
        error(f"this command needs the controller extras (no module {e.name!r}): install m1000-fleet[controller]")
        return EXIT_ERROR
    except Exception as e:
        # the user's to fix: FleetctlError, or another package's error a user causes
        code = exit_code_of(e)
        if code is not None:
            error(error_line(e))
            return code
        from controller.fleet import broker_errors

        if isinstance(e, broker_errors()):
            error(f"broker unreachable: {error_line(e)}")
        else:  # a bug: keep the traceback, still exit "error"
            traceback.print_exc()
        return EXIT_ERROR
    finally:
        inv.close()


def main(argv: list[str] | None = None) -> Any:
    # fleetctl's pydantic models are its own records: no pydantic plugin (an entry-point group) applies to them, and
    # looking for one scans every installed distribution's metadata on the first model built, in every verb
    # (~15 ms of CPU each: bench/cli.py). typer's own adapters turn plugins off the same way. A user's value is kept.
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    sys.exit(run(argv))
