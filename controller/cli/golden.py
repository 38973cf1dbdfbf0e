"""``fleetctl golden REL``: a short validation of a known-good release on each module, each module judged against
its own golden history (:mod:`controller.service.golden`); a drifted module goes ``bad`` until ``fleetctl devices
reset MODULE``. It was ``fleetctl devices check --golden REL`` (a check that started a validation: ADR 0057).
This file parses and prints.

Lazy imports: :func:`golden_check` imports the service's golden check and the live view (the run history,
pydantic, rich) when it runs: ``fleetctl --help`` imports this module with every verb's and costs
~0.14 s of CPU in all (``bench/cli.py``: bench/results/cli_20261207_0057_defer-plugins.txt).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer

from controller import service
from controller.cli.invocation import session
from controller.cli.output import Output, emit, output_option, stderr, stdout
from controller.command import fleetctl

if TYPE_CHECKING:
    from controller.service import Session


def golden_check(s: Session, release: str, devices: str, models: str, tolerance: float | None,
                 output: Output) -> int:
    """Run the golden check; exit 0 when no module drifted, 1 otherwise."""
    from contract.records import parse_model_keys
    from controller.cli.live import PROGRESS_INTERVAL, follow, print_launched
    from controller.service.golden import golden_check as check

    err = stderr()
    req = service.release_request(release, models=parse_model_keys(models), devices=devices)

    def wait(launched: service.Launched) -> None:
        print_launched(launched, err, len(launched.modules))
        follow(lambda: service.sync(s, launched.run_id), err, title=f"golden check {launched.run_id}",
               progress_every=PROGRESS_INTERVAL)

    res = check(s, req, wait, tolerance)
    recs = [{"module": c.module, "status": c.status, "history": c.history, "line": c.line} for c in res.checks]
    emit(recs, ["module", "status", "history", "line"], output, title=f"golden check {res.release} ({res.run_id})",
         document={"run_id": res.run_id, "release": res.release, "drifted": list(res.drifted), "checks": recs})
    if output == Output.table:
        for m in res.drifted:
            stdout().print(f"{m} is bad until {fleetctl('devices', 'reset', m)}", markup=False, highlight=False)
    return 1 if res.drifted else 0


GOLDEN_MODELS = "qwen3"


def golden(
    ctx: typer.Context,
    release: str = typer.Argument(..., help="the known-good release: a tarball path or an http/https URL"),
    devices: str = typer.Option("all", "--devices", "-d", help="'all', names, label=value; comma separated"),
    models: str = typer.Option(GOLDEN_MODELS, "--models", "-m", help="the model keys of the short validation"),
    tolerance: float | None = typer.Option(None, "--tolerance", help="the drift that makes a module bad, a fraction "
                                           "(default: golden_tolerance, 0.03)"),
    output: Output = output_option(),
) -> None:
    """Health check with a golden release: validate a known-good release on each module and judge each against its
    own golden history; a module worse than its history goes bad until `fleetctl devices reset`. Exit 0 when no
    module drifted, 1 otherwise."""
    raise typer.Exit(golden_check(session(ctx), release, devices, models, tolerance, output))
