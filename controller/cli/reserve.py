"""``fleetctl`` verbs about reservations: reserve, reservations, unreserve (was ``release``: ADR 0057).

Each verb parses and prints; :mod:`controller.service.reservations` does the work, imported when the verb runs.
The caller is the CLI's identity (``$FLEET_USER``, else the OS user).

Lazy imports: the service's and the fleet's reservations load the run history and the inventory (pydantic):
``fleetctl --help`` imports this module with every verb's and costs ~0.14 s of CPU in all
(``bench/cli.py``: bench/results/cli_20261207_0057_defer-plugins.txt).
"""

from __future__ import annotations

import typer

from controller.cli.invocation import session
from controller.cli.output import Output, emit, fail, output_option, stderr, stdout

RESERVATION_COLUMNS = ("module", "user", "until", "left", "reason", "id")


def reserve(ctx: typer.Context,
            select_: str = typer.Option(..., "--devices", "-d", help="'all', names, label=value; comma separated"),
            for_: str = typer.Option(..., "--for", help="how long: 30m, 2h, 1d (a number and s, m, h or d)"),
            reason: str = typer.Option("", "--reason", help="why, shown to the others")) -> None:
    """Reserve modules for yourself: no other user's validation is sent to them until the reservation ends (it
    expires by itself). Refused when another user holds one of them; your own are extended."""
    from controller.fleet.reservations import parse_duration, shown_until
    from controller.service.reservations import clock_warning
    from controller.service.reservations import reserve as do_reserve

    try:
        seconds = parse_duration(for_)
    except ValueError as exc:
        raise fail(str(exc)) from None
    s = session(ctx)
    for r in do_reserve(s, select_, seconds, reason, user=s.user):
        stdout().print(f"{r.module}: reserved by {r.user} until {shown_until(r.until)} [{r.id}]", highlight=False,
                       markup=False)
    warn = clock_warning(s)
    if warn:
        stderr().print(f"warning: {warn}", highlight=False, markup=False)


def reservations(ctx: typer.Context,
                 select_: str = typer.Option("all", "--devices", "-d",
                                             help="'all', names, label=value; comma separated"),
                 output: Output = output_option()) -> None:
    """Modules reserved now: by whom, until when, why."""
    from controller.history.waits import shown_duration
    from controller.service.reservations import reservation_dict
    from controller.service.reservations import reservations as read

    recs = [reservation_dict(r) for r in read(session(ctx), select_)]
    if output == Output.table and not recs:
        stdout().print("no module is reserved", highlight=False)
        return
    for rec in recs:
        rec["left"] = shown_duration(rec["left_s"])
        if output != Output.json:
            rec["until"] = rec["until_local"]
    emit(recs, RESERVATION_COLUMNS, output)


def unreserve(ctx: typer.Context,
              select_: str = typer.Option("all", "--devices", "-d", help="'all', names, label=value; comma separated"),
              force: bool = typer.Option(False, "--force", help="others' reservations too")) -> None:
    """End your reservations of the modules selected (all of yours by default); others' only with --force."""
    from controller.service.reservations import release as do_release

    s = session(ctx)
    done = do_release(s, select_, user=s.user, force=force)
    if not done:
        stdout().print("nothing to unreserve: none of the modules selected is reserved by you", highlight=False)
    for r in done:
        stdout().print(f"{r.module}: unreserved" + (f" (it was {r.user}'s)" if r.user != s.user else ""),
                       highlight=False, markup=False)
