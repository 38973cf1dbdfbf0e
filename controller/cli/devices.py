"""``fleetctl`` verbs about modules: devices (their state), devices reset, describe module.

Each verb parses and prints; :mod:`controller.service` does the work, imported when the verb runs.

Lazy imports: the service's modules load the run history, the settings and the inventory (pydantic): ``fleetctl
--help`` imports this module with every verb's and costs ~0.14 s of CPU in all (``bench/cli.py``:
bench/results/cli_20261207_0057_defer-plugins.txt).
"""

from __future__ import annotations

import time

import typer

from controller import service
from controller.cli.invocation import session
from controller.cli.output import Output, emit, output_option, stdout

DEVICE_COLUMNS = ("module", "host", "labels", "state", "reserved", "reason", "agent_version", "contract", "last_beat",
                  "clock_skew", "free_disk")


def devices(ctx: typer.Context,
            select_: str = typer.Option("all", "--devices", "-d", help="'all', names, label=value; comma separated"),
            output: Output = output_option()) -> None:
    """Modules and their state, from their heartbeats, and who reserved them until when; each agent's contract
    version, flagged when it is not the controller's (behind: upgrade it with ``fleetctl deploy``)."""
    if ctx.invoked_subcommand is not None:
        return
    from contract.compat import judge
    from controller.fleet.reservations import shown_until
    from controller.service.reservations import reservations

    s = session(ctx)
    held = {r.module: r for r in reservations(s, select_)}
    recs = []
    for d in service.devices(s, select_):
        rec = service.device_dict(d)
        r = held.get(d.module.name)
        rec["reserved"] = f"{r.user} until {shown_until(r.until)}" if r else ""
        age, free = rec["heartbeat_age_s"], rec["free_disk_bytes"]
        rec["last_beat"] = f"{age:.0f} s ago" if age is not None else "never"
        rec["clock_skew"] = shown_skew(rec["clock_skew_s"])
        rec["free_disk"] = f"{free / 1024**3:.1f} GiB" if free is not None else ""
        # "1 (behind)": the reason says what to do (ADR 0051); JSON keeps the number
        if output == Output.table:
            rec["contract"] = judge(rec["contract"]).shown()
        recs.append(rec)
    emit(recs, DEVICE_COLUMNS, output)


def shown_skew(skew: float | None) -> str:
    """The module's clock minus the controller's (ages are the broker's), in whole seconds: rounded first, so a
    skew of -0.3 s reads "0 s", never "-0 s"."""
    if skew is None:
        return ""
    whole = round(skew)
    return f"{whole:+d} s" if whole else "0 s"


def devices_reset(ctx: typer.Context, module: str = typer.Argument(..., help="module name")) -> None:
    """Clear a module's failed runs in a row and a failed golden check: a module bad by either takes work again
    now (recorded in the history). Without it, one bad by failed runs does once 15 minutes have passed since
    the last one, on trial; one that failed its golden check stays bad."""
    s = session(ctx)
    drift = s.history().golden_drift(module) if s.has_history() else None
    n = service.reset_module(s, module)
    stdout().print(f"{module}: {n} failed run(s) in a row cleared" + (", its failed golden check too" if drift else "")
                   + f" (recorded in {s.history_path})", highlight=False, markup=False)


def devices_power(ctx: typer.Context, module: str = typer.Argument(..., help="module name"),
                  command: str = typer.Argument(..., help="on, off or cycle (off, pdudaemon's delay, on)")) -> None:
    """Power a module on, off, or cycle it through its PDU (the inventory's `power` entry, through pdudaemon);
    refused for a module another user reserved. Recorded in the history."""
    from controller.service.power import power_module

    stdout().print(power_module(session(ctx), module, command), highlight=False, markup=False)


def describe_module(ctx: typer.Context, name: str = typer.Argument(..., help="module name"),
                    output: Output = output_option()) -> None:
    """A module: inventory entry, state from its heartbeat, its reservation and who had it, its recent runs
    (read-only)."""
    s = session(ctx)
    d = service.describe_module(s, name)
    dev = service.device_dict(service.Device(d.module, d.status))
    recent = [{"run_id": info.run_id, "release": info.release,
               "created": time.strftime("%Y-%m-%d %H:%M", time.localtime(info.created_at)),
               "state": p.state.value if p else "queued", "rows": p.rows if p else 0,
               "error": p.error.one_line() if p and p.error else ""} for info, p in d.recent]
    from controller.service.reservations import reservation_dict, reservation_events, reservations

    held = reservations(s, name)
    events = reservation_events(s, name)  # who had it: its reserve and release events
    doc = {**dev, "inventory": d.module.model_dump(mode="json"), "recent_runs": recent,
           "reservation": reservation_dict(held[0]) if held else None,
           "reservation_events": [{"ts": ts, "message": msg} for ts, msg in events]}
    if output == Output.table:
        out = stdout()
        for k in ("module", "host", "transport", "labels", "state", "reason", "agent_version", "run_id"):
            v = dev[k]
            out.print(f"{k + ':':15} {','.join(f'{a}={b}' for a, b in v.items()) if isinstance(v, dict) else v or ''}",
                      highlight=False)
        out.print(f"{'workdir:':15} {d.module.workdir}", highlight=False)
        shown = held[0].line().removeprefix("reserved ") if held else ""
        out.print(f"{'reserved:':15} {shown}", highlight=False, markup=False)
        for ts, msg in events[-5:]:
            out.print(f"{'':15} {time.strftime('%Y-%m-%d %H:%M', time.localtime(ts))} {msg}", highlight=False,
                      markup=False)
    emit(recent, ["run_id", "release", "created", "state", "rows", "error"], output, document=doc,
         title="recent runs")


QUEUE_COLUMNS = ("module", "position", "run_id", "priority", "asked", "waited", "behind")


def queue(ctx: typer.Context,
          select_: str = typer.Option("all", "--devices", "-d", help="'all', names, label=value; comma separated"),
          output: Output = output_option()) -> None:
    """Runs waiting on each module's queue, in the order the module takes them (highest priority first, then
    the order sent), how long each has waited and behind what; then how long runs waited, by priority."""
    from controller.service.queue import queue as read_queue
    from controller.service.queue import queue_document, queue_records, waits_line

    v = read_queue(session(ctx), select_)
    if output != Output.table:
        emit(queue_records(v), QUEUE_COLUMNS, output, document=queue_document(v))
        return
    if v.runs:
        emit(queue_records(v), QUEUE_COLUMNS, output, title="waiting")
    else:
        stdout().print(f"nothing waits on {len(v.depths)} module(s)", highlight=False)
    stdout().print(waits_line(v.waits), markup=False, highlight=False, soft_wrap=True)
