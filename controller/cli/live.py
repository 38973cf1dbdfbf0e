"""The live view of a run in a terminal: one row per module (state, step, model key, progress,
elapsed, result), then the verdict. Shared by ``fleetctl validate/watch`` and ``fleetctl demo``.

Without a terminal (a CI log) the view is lines instead: one per module state or step change, and a
progress line every ``PROGRESS_INTERVAL`` (elapsed time, keys done of all, modules per state). In a
terminal narrower than the full table, the lower-value columns give way first (:func:`table_layout`):
module names and state words are never cut.

Lazy imports: :func:`follow_and_judge` imports the report's text renderer only when a run's verdict came with a
report, which has loaded pandas already; ``fleetctl status`` of a judged run imports this module and no pandas
(462 ms of CPU, ``bench/import_costs.py``: bench/results/import_costs_20261207_0346_lazy-libraries.txt).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich import box
from rich.cells import cell_len
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.live import Live
from rich.markup import escape
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from contract.records import RunProgress, RunState
from controller import service
from controller.command import fleetctl
from controller.fleet import BrokerUnavailable, RunView, is_collecting, module_failed
from controller.history import HistoryUnavailable

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


# without a terminal (a CI log), a progress line this often, s
PROGRESS_INTERVAL = 60.0
# more is unreadable live, and a row costs ~0.45 ms of CPU a refresh (bench/results/NOTES-scale.md)
MAX_ROWS = 60


def _look(p: RunProgress | None) -> tuple[str, str, str]:
    return ("queued", "", "") if p is None else (p.state.value, p.step, p.model_key or "")


def changed_modules(before: RunView | None, after: RunView) -> frozenset[str]:
    """The modules whose state, step or model key differ between two refreshes of a view (pure; none without
    ``before``)."""
    if before is None:
        return frozenset()
    return frozenset(m for m in after.modules if _look(before.progress.get(m)) != _look(after.progress.get(m)))


def shown_modules(view: RunView, max_rows: int = MAX_ROWS, changed: frozenset[str] = frozenset()) -> list[str]:
    """The modules the live table lists: all of them, or ``max_rows``: the failed ones first, then those that
    ``changed`` since the last refresh, then the unfinished ones (inventory order within each)."""
    if len(view.modules) <= max_rows:
        return list(view.modules)

    def rank(m: str) -> int:
        p = view.progress.get(m)
        if p is not None and p.state.terminal and module_failed(p):
            return 0
        return 1 if m in changed else 2 if p is None or not p.state.terminal else 3

    keep = set(sorted(view.modules, key=rank)[:max_rows])  # stable: inventory order within a rank
    return [m for m in view.modules if m in keep]


def states_summary(view: RunView, shown: int, changed: int) -> str:
    """``10000 modules: 9000 benchmarking, 950 done, 50 failed; 60 listed (failed, changed (12), then unfinished
    first)`` (pure): what the live view says above a table that lists only some of the modules."""
    return (f"{len(view.modules)} modules: " + summary_line(view).split(": ", 1)[1]
            + f"; {shown} listed (failed, changed ({changed}), then unfinished first)")


@dataclass(frozen=True)
class Layout:
    """Which columns the live table shows, and how: ``bar`` the progress bar's width (0: a percentage instead),
    ``compact`` a box without vertical lines or outer padding."""

    columns: tuple[str, ...]
    bar: int = 20
    compact: bool = False


COLUMNS = ("module", "state", "step", "model key", "progress", "elapsed", "result")
# from the richest to the leanest: the bar narrows, then becomes a percentage in a lighter box, then the
# elapsed time, the step and the model key go; module, state, progress and result always stay
LAYOUTS = (
    Layout(COLUMNS),
    Layout(COLUMNS, bar=10),
    Layout(COLUMNS, bar=0, compact=True),
    Layout(("module", "state", "step", "model key", "progress", "result"), bar=0, compact=True),
    Layout(("module", "state", "model key", "progress", "result"), bar=0, compact=True),
    Layout(("module", "state", "progress", "result"), bar=0, compact=True),
)
# the result column wraps: this much of it is counted when a layout is measured
RESULT_MIN = 16


def table_width(layout: Layout, cells: Sequence[Mapping[str, str]]) -> int:
    """The width the live table takes in ``layout`` for rows of ``cells`` (column -> text), the result column
    counted at most :data:`RESULT_MIN` wide (pure)."""
    total = 0
    for col in layout.columns:
        w = max([cell_len(col), *(cell_len(c.get(col, "")) for c in cells)])
        if col == "progress":
            w = max(cell_len(col), layout.bar)
        total += min(w, RESULT_MIN) if col == "result" else w
    n = len(layout.columns)
    # a column's padding is 1 a side; between columns a rule (a space in the compact box); the full box has edges
    return total + (3 * (n - 1) if layout.compact else 3 * n + 1)


def table_layout(cells: Sequence[Mapping[str, str]], width: int | None) -> Layout:
    """The richest layout whose table fits ``width`` (None: unbounded), else the leanest (pure)."""
    if width is None:
        return LAYOUTS[0]
    return next((lay for lay in LAYOUTS if table_width(lay, cells) <= width), LAYOUTS[-1])


def _cells(view: RunView, shown: Sequence[str], now: float) -> list[dict[str, str]]:
    out = []
    for m in shown:
        p = view.progress.get(m)
        if p is None:
            out.append({"module": m, "state": "queued", "step": "", "model key": "", "elapsed": "",
                        "progress": "0%", "result": "queued"})
            continue
        state = "queued" if p.step == "queued" and p.state == RunState.PENDING else p.state.value
        started = p.started_at
        end = p.finished_at or now
        keys = f" {p.keys_done}/{p.keys_total}" if p.keys_total else ""
        out.append({"module": m, "state": state, "step": p.step, "model key": ((p.model_key or "") + keys).strip(),
                    "elapsed": f"{end - started:5.0f} s" if started else "",
                    "progress": f"{max(0.0, min(1.0, p.progress)):.0%}", "result": result_text(p).plain})
    return out


@dataclass(frozen=True)
class Fitted:
    """The live table of a view, laid out for the width it is printed in (:func:`table`)."""

    view: RunView
    now: float
    title: str = ""
    max_rows: int = MAX_ROWS
    changed: frozenset[str] = frozenset()

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        t = table(self.view, self.now, self.title, self.max_rows, options.max_width, self.changed)
        if len(self.view.modules) > self.max_rows:
            yield Text(states_summary(self.view, t.row_count, len(self.changed)))
        yield t


def render(view: RunView, now: float | None = None, title: str = "", max_rows: int = MAX_ROWS,
           changed: frozenset[str] = frozenset()) -> Fitted:
    """The live table, fitting the width of whatever prints it: a terminal of 80 columns, a log of 200. Above
    ``max_rows`` modules: a line of counts per state first, and the table lists the failed modules, those
    ``changed`` since the last refresh, then the unfinished ones (:func:`shown_modules`)."""
    return Fitted(view, time.time() if now is None else now, title, max_rows, changed)


def table(view: RunView, now: float, title: str = "", max_rows: int = MAX_ROWS, width: int | None = None,
          changed: frozenset[str] = frozenset()) -> Table:
    """The live table for ``width`` columns (None: unbounded) (:func:`table_layout`)."""
    shown = shown_modules(view, max_rows, changed)
    cells = _cells(view, shown, now)
    lay = table_layout(cells, width)
    t = Table(title=title or f"run {view.run_id}", expand=False, show_lines=False,
              box=box.SIMPLE_HEAD if lay.compact else box.HEAVY_HEAD, pad_edge=not lay.compact,
              show_edge=not lay.compact)
    for col in lay.columns:
        whole = max([cell_len(col), *(cell_len(c[col]) for c in cells)]) if col in ("module", "state") else None
        t.add_column(col, no_wrap=col != "result", min_width=whole)
    if len(shown) < len(view.modules):
        t.caption = (f"{len(view.modules) - len(shown)} more modules not listed; all of them: "
                     + summary_line(view).split(": ", 1)[1])
    for m, c in zip(shown, cells, strict=True):
        p = view.progress.get(m)
        done = 0.0 if p is None else max(0.0, min(1.0, p.progress))
        row: dict[str, Text | ProgressBar | str] = {
            "module": m, "state": Text(c["state"], style=_STYLE.get(c["state"], "")), "step": c["step"],
            "model key": c["model key"],
            "progress": ProgressBar(total=1.0, completed=done, width=lay.bar) if lay.bar else c["progress"],
            "elapsed": c["elapsed"], "result": result_text(p)}
        t.add_row(*(row[col] for col in lay.columns))
    return t


def resilient(sync: Callable[[], RunView], console: Console, *, give_up_after: float = 600.0) -> Callable[[], RunView]:
    """``sync`` that rides out an outage of the broker or of a PostgreSQL run history (each named as itself): the
    last view is shown until the part is back (the history's connection is made again at its next use)."""
    last: list[RunView] = []
    down_since: list[float] = []
    part: list[str] = []

    def call() -> RunView:
        try:
            view = sync()
        except (BrokerUnavailable, HistoryUnavailable) as exc:
            if not last:
                raise
            what = "run history" if isinstance(exc, HistoryUnavailable) else "broker"
            if not down_since or part != [what]:
                down_since[:] = down_since or [time.monotonic()]
                part[:] = [what]
                console.print(f"[yellow]{exc}; retrying[/]", highlight=False)
            elif time.monotonic() - down_since[0] > give_up_after:
                raise
            return last[0]
        if down_since:
            console.print(f"[green]{part[0] if part else 'broker'} reachable again[/]")
            down_since.clear()
        last[:] = [view]
        return view

    return call


def follow(sync: Callable[[], RunView], console: Console, *, interval: float = 0.5, title: str = "",
           footer: Callable[[RunView], str] | None = None, progress_every: float = PROGRESS_INTERVAL,
           since: float | None = None) -> RunView:
    """Refresh the view until the run finishes (Ctrl-C detaches; the run goes on). Without a terminal:
    :func:`follow_lines`, a progress line every ``progress_every`` s (``since``: when the run began, for
    the elapsed time; default: now)."""
    # what the process holds before it follows (its imports, the inventory, the dispatch's records) is left out of
    # every later garbage collection; objects freed by their count go as before. At 10,000 modules a pass's full
    # collection took 0.2-0.34 s of CPU without it, 0.1-0.17 s with it (bench/scale.py)
    gc.freeze()
    sync = resilient(sync, console)
    view = sync()
    if not console.is_terminal:
        return follow_lines(sync, view, console, interval=interval, every=progress_every, since=since)
    with Live(render(view, title=title), console=console, refresh_per_second=4, transient=False) as live:
        while not view.finished:
            time.sleep(interval)
            before, view = view, sync()
            parts: list[RenderableType] = [render(view, title=title, changed=changed_modules(before, view))]
            if footer:
                parts.append(footer(view))
            live.update(Group(*parts))
    return view


def follow_lines(sync: Callable[[], RunView], view: RunView, console: Console, *, interval: float, every: float,
                 since: float | None = None) -> RunView:
    """The run followed in lines (a CI log): one per module state or step change (:func:`change_lines`), a
    progress line every ``every`` s (:func:`progress_line`), each module's result at the end."""
    began = time.time() if since is None else since
    seen: dict[str, tuple[str, str, str]] = {}
    due = time.monotonic() + every
    while True:
        for line in change_lines(view, seen):
            console.print(line, highlight=False)
        if view.finished:
            break
        if time.monotonic() >= due:
            console.print(progress_line(view, time.time() - began), highlight=False)
            due = time.monotonic() + every
        time.sleep(interval)
        view = sync()
    for m in view.modules:
        p = view.progress.get(m)
        state = p.state.value if p else "queued"
        console.print(f"  {m}: {state}, {result_text(p).plain}", highlight=False)
    return view


def change_lines(view: RunView, seen: dict[str, tuple[str, str, str]]) -> list[str]:
    """``module: state, step key; keys D/T, P%`` for each module whose state, step or model key changed since
    ``seen`` (updated) (pure but for ``seen``)."""
    out = []
    for m in view.modules:
        p = view.progress.get(m)
        now = _look(p)
        if seen.get(m) == now:
            continue
        seen[m] = now
        if p is None:
            out.append(f"{m}: queued")
            continue
        step = f", {p.step}" if p.step and p.step != p.state.value else ""
        key = f" {p.model_key}" if p.model_key else ""
        keys = f"; keys {p.keys_done}/{p.keys_total}" if p.keys_total else ""
        out.append(f"{m}: {p.state.value}{step}{key}{keys}, {max(0.0, min(1.0, p.progress)):.0%}")
    return out


def progress_line(view: RunView, elapsed: float) -> str:
    """``run R: 12m05s elapsed; keys 5/14 done; 1 benchmarking, 1 done`` (pure)."""
    ps = [p for p in view.progress.values() if p is not None]
    done, total = sum(p.keys_done for p in ps), sum(p.keys_total for p in ps)
    return (f"run {view.run_id}: {duration(elapsed)} elapsed; keys {done}/{total} done; "
            + summary_line(view).split(": ", 1)[1])


def duration(seconds: float) -> str:
    """``1h02m05s``, ``12m05s``, ``45s`` (pure)."""
    s = max(0, int(seconds))
    h, m = divmod(s // 60, 60)
    return f"{h}h{m:02d}m{s % 60:02d}s" if h else f"{m}m{s % 60:02d}s" if m else f"{s}s"


def summary_line(view: RunView) -> str:
    states: dict[str, int] = {}
    for p in view.progress.values():
        key = "queued" if p is None else p.state.value
        states[key] = states.get(key, 0) + 1
    return f"run {view.run_id}: " + ", ".join(f"{n} {s}" for s, n in sorted(states.items()))


def print_launched(launched: Launched, err: Console, n_modules: int, page: str | None = None) -> None:
    """``run <id>: release ..., N model keys, Q/M modules queued`` (``page``: the run's page in ``fleetctl serve``,
    when ``serve_url`` is set) and why each other module was not."""
    err.print(f"run [bold]{launched.run_id}[/]: release {launched.release} ({launched.sha256[:12]}), "
              f"{len(launched.models)} model keys, {launched.queued}/{n_modules} modules queued"
              + (" (resumed)" if launched.resumed else ""), highlight=False)
    if page:
        err.print(f"page: {page}", highlight=False, markup=False, soft_wrap=True)
    for name, why in launched.modules.items():
        if why != "queued":
            err.print(f"  [red]{name}[/]: {why}", highlight=False)
    for name, why in launched.waiting.items():
        err.print(f"  {name}: queued, waits until the reservation ends: {why}", highlight=False, markup=False)
    for name, note in launched.apart.items():
        err.print(f"  {name}: queued; {note}", highlight=False, markup=False)
    for name, run in launched.preempted.items():
        err.print(f"  {name}: run {run} stops for it (preempted) and resumes from its passed keys after it",
                  highlight=False, markup=False)


def follow_and_judge(s: Session, run_id: str, baseline: str | None, out: Console, err: Console,
                     root: tuple[str, ...] = ()) -> int:
    """Follow a run live until it ends, print its failures and verdict; the exit code (0, 1; 130 detached).
    ``root``: the root options the hints it prints need (the demo's ``--history FILE``)."""
    info = s.history().run(run_id)
    try:
        view = follow(lambda: service.sync(s, run_id), err, title=f"run {run_id}",
                      progress_every=PROGRESS_INTERVAL, since=info.created_at if info else None)
    except KeyboardInterrupt:
        err.print(f"detached; the run goes on: {fleetctl(*root, 'watch', run_id)}", markup=False, highlight=False)
        return 130
    for m, errs in service.errors_of(view).items():
        for e in errs:
            err.print(Text.assemble((m, "red"), f": {e}"), highlight=False)
    j = service.judge(s, run_id, baseline)
    n = s.history().row_count(run_id)
    out.print(f"verdict: [bold]{j.verdict}[/] - {escape(j.line)}", highlight=False, soft_wrap=True)
    for t in j.report.outlier_telemetry if j.report is not None else ():  # why the slow modules are slow
        from controller.report.render.text import telemetry_line

        out.print(f"outlier {t.module}{'' if t.model_key == '*' else f' [{t.model_key}]'}: {telemetry_line(t)}",
                  markup=False, highlight=False, soft_wrap=True)
    for d in j.report.environment if j.report is not None else ():  # measured in another environment
        out.print(f"environment {d.module}: {'; '.join(d.differences)}", markup=False, highlight=False,
                  soft_wrap=True)
    for w in j.report.environment_changes if j.report is not None else ():  # since the baseline / previous run
        err.print(f"warning: {w}", markup=False, highlight=False, soft_wrap=True)
    out.print(f"{n} result rows in {s.history_path} ({fleetctl(*root, 'results', run_id)}; "
              f"{fleetctl(*root, 'report', run_id)})",
              markup=False, highlight=False)
    return service.exit_code(j.verdict)
