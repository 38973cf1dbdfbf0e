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
    console = Console(file=io.StringIO(), width=160)
    console.print(render(view))
    text = console.file.getvalue()
    assert "940 more modules not listed; all of them: 10 benchmarking, 989 done, 1 failed" in text.replace("\n", " ")
