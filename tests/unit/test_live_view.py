"""The live table of a big run lists at most MAX_ROWS modules: failed and unfinished first, the rest counted."""

from __future__ import annotations

import io

from rich.console import Console

from contract.records import RunProgress, RunState, StepError
from controller.cli.live import MAX_ROWS, render, shown_modules
from controller.fleet import RunView


def _view(n: int) -> RunView:
    names = tuple(f"m{i:04d}" for i in range(n))
    progress: dict[str, RunProgress | None] = {}
    for i, m in enumerate(names):
        if i == 7:
            progress[m] = RunProgress(run_id="r", module=m, state=RunState.FAILED,
                                      error=StepError(step="benchmark", message="boom"))
        elif i % 100 == 50:
            progress[m] = RunProgress(run_id="r", module=m, state=RunState.BENCHMARKING, step="benchmark")
        else:
            progress[m] = RunProgress(run_id="r", module=m, state=RunState.DONE, rows=11)
    return RunView("r", names, progress)


def test_small_runs_list_every_module() -> None:
    assert shown_modules(_view(MAX_ROWS)) == list(_view(MAX_ROWS).modules)


def test_big_runs_list_failed_and_unfinished_first() -> None:
    view = _view(1000)
    shown = shown_modules(view)
    assert len(shown) == MAX_ROWS and "m0007" in shown
    assert all(f"m{i:04d}" in shown for i in range(50, 1000, 100))  # the 10 still benchmarking
    assert shown == sorted(shown)  # inventory order kept
    out = io.StringIO()
    console = Console(file=out, width=160)
    console.print(render(view))
    text = out.getvalue()
    assert "940 more modules not listed; all of them: 10 benchmarking, 989 done, 1 failed" in text.replace("\n", " ")


# --------------------------------------------------------------------------- issue 27: 80 columns, CI logs
def _mixed(now: float) -> RunView:
    from contract.records import KeyOutcome

    names = ("sim-01", "sim-02", "rack-a-m1000-07", "sim-04", "sim-05")
    p = {
        "sim-01": RunProgress(run_id="r", module="sim-01", state=RunState.BENCHMARKING, step="benchmark",
                              model_key="qwen35_fq_mtp", keys_total=7, keys_done=4, progress=0.62,
                              started_at=now - 300, updated_at=now),
        "sim-02": RunProgress(run_id="r", module="sim-02", state=RunState.PRECOMPILING, step="precompile",
                              keys_total=7, progress=0.1, started_at=now - 30, updated_at=now),
        "rack-a-m1000-07": RunProgress(run_id="r", module="rack-a-m1000-07", state=RunState.DONE, step="done",
                                       keys_total=7, keys_done=7, progress=1.0, started_at=now - 3000,
                                       finished_at=now - 10, updated_at=now, rows=77),
        "sim-04": RunProgress(run_id="r", module="sim-04", state=RunState.FAILED, step="server", model_key="qwen3",
                              keys_total=7, keys_done=1, progress=0.3, started_at=now - 300, finished_at=now,
                              updated_at=now, outcomes=(KeyOutcome(model_key="qwen3", status="failed"),)),
        "sim-05": None,
    }
    return RunView("20261202-031145-7c4d", names, p)


def test_the_live_table_fits_80_columns_with_whole_module_names_and_states() -> None:
    """Issue 27: at 80 columns the table cut names and states (``sim-…``, ``benchmarki…``); the lower-value columns
    now give way first (the bar becomes a percentage, elapsed and step go) and names and states stay whole."""
    import time

    now = time.time()
    out = io.StringIO()
    console = Console(file=out, width=80)
    console.print(render(_mixed(now), now=now))
    text = out.getvalue()
    assert max(len(line) for line in text.splitlines()) <= 80, text
    words = {w for line in text.splitlines() for w in line.split()}
    assert {"sim-01", "sim-02", "rack-a-m1000-07", "sim-04", "sim-05"} <= words, text
    assert {"benchmarking", "precompiling", "done", "failed", "queued"} <= words, text
    assert {"qwen35_fq_mtp", "62%", "ok,", "77", "rows"} <= words and "…" not in text, text
    wide_out = io.StringIO()
    wide = Console(file=wide_out, width=200)
    wide.print(render(_mixed(now), now=now))  # room enough: every column, the bar
    assert {"step", "elapsed", "━━━━━━━━━━━━"} <= {w for ln in wide_out.getvalue().splitlines() for w in ln.split()}


def _steps() -> list[RunView]:
    def p(m: str, state: RunState, step: str, key: str | None, done: int, progress: float) -> RunProgress:
        return RunProgress(run_id="r", module=m, state=state, step=step, model_key=key, keys_total=2, keys_done=done,
                           progress=progress, updated_at=1.0, rows=11 * done)

    steps: list[dict[str, RunProgress | None]] = [
        {"m1": None, "m2": p("m2", RunState.PENDING, "queued", None, 0, 0.0)},
        {"m1": p("m1", RunState.BENCHMARKING, "server", "qwen3", 0, 0.1),
         "m2": p("m2", RunState.PRECOMPILING, "precompile", None, 0, 0.08)},
        {"m1": p("m1", RunState.BENCHMARKING, "benchmark", "qwen3", 0, 0.1),
         "m2": p("m2", RunState.PRECOMPILING, "precompile", None, 0, 0.09)},  # no change of state or step: no line
        {"m1": p("m1", RunState.BENCHMARKING, "benchmark", "qwen35", 1, 0.55),
         "m2": p("m2", RunState.DONE, "done", None, 2, 1.0)},
        {"m1": p("m1", RunState.DONE, "done", None, 2, 1.0), "m2": p("m2", RunState.DONE, "done", None, 2, 1.0)},
    ]
    return [RunView("r", ("m1", "m2"), s) for s in steps]


def test_without_a_terminal_each_module_state_or_step_change_is_a_line() -> None:
    """Issue 27: without a TTY, ``2 benchmarking`` and then nothing for the whole key (hours on a real module):
    each module's state, step or model key change is now a line (module, state, step and key, progress)."""
    from controller.cli.live import follow

    views = iter(_steps())
    out = io.StringIO()
    console = Console(file=out, width=200)
    assert not console.is_terminal
    follow(lambda: next(views), console, interval=0.001)
    assert out.getvalue().splitlines() == [
        "m1: queued", "m2: pending, queued; keys 0/2, 0%",
        "m1: benchmarking, server qwen3; keys 0/2, 10%", "m2: precompiling, precompile; keys 0/2, 8%",
        "m1: benchmarking, benchmark qwen3; keys 0/2, 10%",
        "m1: benchmarking, benchmark qwen35; keys 1/2, 55%", "m2: done; keys 2/2, 100%",
        "m1: done; keys 2/2, 100%",
        "  m1: done, ok, 22 rows", "  m2: done, ok, 22 rows"]


def test_without_a_terminal_a_progress_line_comes_every_progress_interval() -> None:
    """Issue 27: a line at a fixed interval (``progress_interval``, 60 s by default) with the elapsed time, the keys
    done of all and the modules per state, whether or not anything changed."""
    import re
    import time

    from controller.cli.live import follow

    views = iter(_steps())
    out = io.StringIO()
    console = Console(file=out, width=200)
    follow(lambda: next(views), console, interval=0.001, progress_every=0.0, since=time.time() - 125)
    progress = [ln for ln in out.getvalue().splitlines() if ln.startswith("run r:")]
    assert len(progress) == 4, progress  # every poll while it ran: progress_every 0
    assert re.fullmatch(r"run r: 2m0[5-9]s elapsed; keys 0/2 done; 1 pending, 1 queued", progress[0]), progress
    assert re.fullmatch(r"run r: 2m0[5-9]s elapsed; keys 3/4 done; 1 benchmarking, 1 done", progress[-1]), progress
