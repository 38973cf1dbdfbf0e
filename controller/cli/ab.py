"""``fleetctl ab A B``: an A/B test of two releases, run alternately (A B B A per round) on the same modules, and the
paired verdict of B against A (:mod:`controller.service.compare`). ``fleetctl compare`` reads two runs already
made; this verb makes the runs (it was ``compare-releases``: ADR 0057).

Lazy imports: :func:`ab` imports the comparison, the live view and the paired report (the run history,
pydantic, rich, pandas) when it runs, :func:`same_release` filecmp: ``fleetctl --help`` imports this module
with every verb's and costs ~0.14 s of CPU in all (``bench/cli.py``:
bench/results/cli_20261207_0057_defer-plugins.txt).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from controller import service
from controller.cli.invocation import session
from controller.cli.output import Output, emit, output_option, stderr, stdout
from controller.command import fleetctl

if TYPE_CHECKING:
    from controller.service import ValidateRequest


def same_release(a: ValidateRequest, b: ValidateRequest) -> bool:
    """Whether two release requests name one release: one URL, or tarballs of equal bytes (the same file, a copy)."""
    import filecmp

    if a.url is not None or b.url is not None:
        return a.url == b.url
    if a.release is None or b.release is None:
        return False
    try:
        return filecmp.cmp(a.release, b.release, shallow=False)
    except OSError:  # one is missing: the request's own check says so
        return False


def ab(
    ctx: typer.Context,
    release_a: str = typer.Argument(..., help="release A (the reference): a tarball path or an http/https URL"),
    release_b: str = typer.Argument(..., help="release B (the candidate): a tarball path or an http/https URL"),
    devices: str = typer.Option(..., "--devices", "-d", help="the modules both run on: 'all', names, label=value"),
    models: str = typer.Option("all", "--models", "-m", help="model keys, comma separated, or 'all'"),
    rounds: int = typer.Option(1, "--rounds", help="rounds of A B B A (4 runs each)"),
    tolerance: float | None = typer.Option(None, "--tolerance", help="paired tolerance, a fraction (default 0.01)"),
    output: Output = output_option(),
) -> int:
    """A/B test two releases: run them alternately (A B B A per round) on the same modules; the paired verdict of
    B against A, with the smallest change it could detect. Exit 0 when it passed, 1 otherwise."""
    from contract.records import parse_model_keys
    from controller.cli.live import PROGRESS_INTERVAL, follow, print_launched
    from controller.report.render.paired import PAIRED_COLUMNS, paired_json, paired_records, paired_verdict_line
    from controller.service.compare import compare_releases as compare

    s = session(ctx)
    keys = parse_model_keys(models)
    a = service.release_request(release_a, models=keys, devices=devices)
    b = service.release_request(release_b, models=keys, devices=devices)
    err = stderr()
    same = same_release(a, b)

    def wait(launched: service.Launched, slot: Any) -> None:
        if same and slot.position == 0:  # said once the request passed its checks
            err.print("ab: A and B are the same release: this measures the fleet's own A/A noise "
                      "(every change should lie within the tolerance)", markup=False, highlight=False)
        err.print(f"round {slot.round + 1} of {rounds}, release {slot.arm}:", highlight=False)
        print_launched(launched, err, len(launched.modules))
        try:
            follow(lambda: service.sync(s, launched.run_id), err, title=f"run {launched.run_id} ({slot.arm})",
                   progress_every=PROGRESS_INTERVAL)
        except KeyboardInterrupt:  # the comparison stops; the run goes on (exit 130)
            err.print(f"comparison stopped; run {launched.run_id} goes on ({fleetctl('cancel', launched.run_id)})",
                      markup=False, highlight=False)
            raise

    rep = compare(s, a, b, rounds, wait, tolerance)
    if output != Output.table:
        emit(paired_records(rep), PAIRED_COLUMNS, output, document=paired_json(rep))
    else:
        emit(paired_records(rep), PAIRED_COLUMNS, output, title=f"{rep.release_b} vs {rep.release_a}, paired")
        stdout().print(f"verdict: {paired_verdict_line(rep)}", markup=False, highlight=False, soft_wrap=True)
    return service.exit_code(rep.verdict)
