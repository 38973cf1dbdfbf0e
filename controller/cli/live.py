"""The live view of a run in a terminal: one row per module (state, step, model key, progress,
elapsed, result), then the verdict. Shared by ``fleetctl validate/watch`` and ``fleetctl demo``."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from contract.records import RunProgress, RunState
from controller.command import fleetctl
from controller.fleet import BrokerUnavailable, RunView, is_collecting, module_failed

if TYPE_CHECKING:
    from controller.service import Launched, Session

_STYLE = {
    "done": "green", "failed": "red", "cancelled": "yellow", "queued": "dim", "benchmarking": "cyan",
}


def result_text(p: RunProgress | None) -> Text:
    if p is None:
        return Text("queued", style="dim")
    if not p.state.terminal:
        return Text(p.error.message[:80], style="yellow") if is_collecting(p) and p.error else Text("")
    if p.state == RunState.CANCELLED:
        return Text("cancelled", style="yellow")
    if module_failed(p):
        failed = [o.model_key for o in p.outcomes if o.status == "failed"]
        msg = p.error.one_line() if p.error else "failed: " + ", ".join(failed)
        return Text(msg[:80], style="red")
    return Text(f"ok, {p.rows} rows", style="green")


MAX_ROWS = 60  # more is unreadable live, and a row costs ~0.45 ms of controller CPU per refresh


def shown_modules(view: RunView, max_rows: int = MAX_ROWS) -> list[str]:
    """The modules the live table lists: all of them, or ``max_rows`` with unfinished and failed ones first."""
    if len(view.modules) <= max_rows:
        return list(view.modules)

    def rank(m: str) -> int:
        p = view.progress.get(m)
        return 0 if p is not None and p.state.terminal and module_failed(p) else 1 if p is None or not \
            p.state.terminal else 2

    keep = set(sorted(view.modules, key=rank)[:max_rows])  # stable: inventory order within a rank
    return [m for m in view.modules if m in keep]


def render(view: RunView, now: float | None = None, title: str = "", max_rows: int = MAX_ROWS) -> Table:
    now = time.time() if now is None else now
    t = Table(title=title or f"run {view.run_id}", expand=False, show_lines=False)
    for col in ("module", "state", "step", "model key", "progress", "elapsed", "result"):
        t.add_column(col, no_wrap=col != "result")
    shown = shown_modules(view, max_rows)
    if len(shown) < len(view.modules):
        t.caption = (f"{len(view.modules) - len(shown)} more modules not listed; all of them: "
                     + summary_line(view).split(": ", 1)[1])
    for m in shown:
        p = view.progress.get(m)
        if p is None:
            t.add_row(m, Text("queued", style="dim"), "", "", ProgressBar(total=1.0, completed=0, width=20), "",
                      result_text(None))
            continue
        state = "queued" if p.step == "queued" and p.state == RunState.PENDING else p.state.value
        started = p.started_at
        end = p.finished_at or now
        elapsed = f"{end - started:5.0f} s" if started else ""
        keys = f" {p.keys_done}/{p.keys_total}" if p.keys_total else ""
        t.add_row(m, Text(state, style=_STYLE.get(state, "")), p.step, (p.model_key or "") + keys,
                  ProgressBar(total=1.0, completed=max(0.0, min(1.0, p.progress)), width=20), elapsed,
                  result_text(p))
    return t


def resilient(sync: Callable[[], RunView], console: Console, *, give_up_after: float = 600.0) -> Callable[[], RunView]:
    """``sync`` that rides out a broker outage: the last view is shown until the broker is back."""
    last: list[RunView] = []
    down_since: list[float] = []

    def call() -> RunView:
        try:
            view = sync()
        except BrokerUnavailable as exc:
            if not last:
                raise
            if not down_since:
                down_since.append(time.monotonic())
                console.print(f"[yellow]{exc}; retrying[/]", highlight=False)
            elif time.monotonic() - down_since[0] > give_up_after:
                raise
            return last[0]
        if down_since:
            console.print("[green]broker reachable again[/]")
            down_since.clear()
        last[:] = [view]
        return view

    return call


def follow(sync: Callable[[], RunView], console: Console, *, interval: float = 0.5, title: str = "",
           footer: Callable[[RunView], str] | None = None) -> RunView:
    """Refresh the view until the run finishes (Ctrl-C detaches; the run goes on)."""
    sync = resilient(sync, console)
    view = sync()
    if not console.is_terminal:
        last = ""
        while not view.finished:
            line = summary_line(view)
            if line != last:
                console.print(line)
                last = line
            time.sleep(interval)
            view = sync()
        for m in view.modules:
            p = view.progress.get(m)
            state = p.state.value if p else "queued"
            console.print(f"  {m}: {state}, {result_text(p).plain}", highlight=False)
        return view
    with Live(render(view, title=title), console=console, refresh_per_second=4, transient=False) as live:
        while not view.finished:
            time.sleep(interval)
            view = sync()
            parts: list[Table | str] = [render(view, title=title)]
            if footer:
                parts.append(footer(view))
            live.update(Group(*parts))
    return view


def summary_line(view: RunView) -> str:
    states: dict[str, int] = {}
    for p in view.progress.values():
        key = "queued" if p is None else p.state.value
        states[key] = states.get(key, 0) + 1
    return f"run {view.run_id}: " + ", ".join(f"{n} {s}" for s, n in sorted(states.items()))


def print_launched(launched: Launched, err: Console, n_modules: int) -> None:
    """``run <id>: release ..., N model keys, Q/M modules queued`` and why each other module was not."""
    err.print(f"run [bold]{launched.run_id}[/]: release {launched.release} ({launched.sha256[:12]}), "
              f"{len(launched.models)} model keys, {launched.queued}/{n_modules} modules queued"
              + (" (resumed)" if launched.resumed else ""), highlight=False)
    for name, why in launched.modules.items():
        if why != "queued":
            err.print(f"  [red]{name}[/]: {why}", highlight=False)


def follow_and_judge(s: Session, run_id: str, baseline: str | None, out: Console, err: Console,
                     root: tuple[str, ...] = ()) -> int:
    """Follow a run live until it ends, print its failures and verdict; the exit code (0, 1; 130 detached).
    ``root``: the root options the hints it prints need (the demo's ``--history FILE``)."""
    from controller import service

    try:
        view = follow(lambda: service.sync(s, run_id), err, title=f"run {run_id}")
    except KeyboardInterrupt:
        err.print(f"detached; the run goes on: {fleetctl(*root, 'watch', run_id)}", markup=False, highlight=False)
        return 130
    for m, errs in service.errors_of(view).items():
        for e in errs:
            err.print(Text.assemble((m, "red"), f": {e}"), highlight=False)
    j = service.judge(s, run_id, baseline)
    n = s.history().row_count(run_id)
    out.print(f"verdict: [bold]{j.verdict}[/] - {j.line}", highlight=False)
    for t in j.report.outlier_telemetry if j.report is not None else ():  # why the slow modules are slow
        from controller.report.render.text import telemetry_line  # a report: pandas is there

        out.print(f"outlier {t.module}{'' if t.model_key == '*' else f' [{t.model_key}]'}: {telemetry_line(t)}",
                  markup=False, highlight=False)
    out.print(f"{n} result rows in {s.history_path} ({fleetctl(*root, 'results', run_id)}; "
              f"{fleetctl(*root, 'report', run_id)})",
              markup=False, highlight=False)
    return service.exit_code(j.verdict)
