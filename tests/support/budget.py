"""The fast tier's time budget, and what each test cost.

Each test not marked ``slow`` may cost at most ``--budget`` seconds (2 by default), or the session fails naming it.
A test's cost is the CPU time of its setup, call and teardown, measured where it runs (an xdist worker or the one
process): the process's own user and system time plus that of the child processes it waited for. ``make test`` runs
lint, the docs and two workers on two cores at once, which stretches wall times by 1.5-2.5x at random; CPU time
stays nearer what the test costs. A test that mostly waits (sleeps, a slow server) is caught by its wall time
instead: at most ``WALL_FACTOR`` times the budget.

With ``--durations`` the summary also names the tests that cost the most CPU (slow ones too), and
``--durations-out PATH`` writes each test module's summed wall seconds as JSON: ``tests/durations.json``, by
which ``tests/conftest.py`` orders the slow tier's modules, longest first.
"""

from __future__ import annotations

import json
import resource
import time
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path

import pytest

KEY = "budget_cost_s"
DEFAULT_BUDGET = 2.0
WALL_FACTOR = 5
TOP = 15
_START = pytest.StashKey[tuple[float, float]]()


def _cpu_s() -> float:
    """CPU seconds of this process and of the children it has waited for."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def module_of(nodeid: str) -> str:
    """The test module a node id names: the key of ``--durations-out``'s JSON and of ``load_durations``."""
    return nodeid.split("::", 1)[0]


def load_durations(path: Path) -> dict[str, float]:
    """What ``--durations-out`` wrote (each module's wall seconds); empty where there is no such file."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in raw.items()} if isinstance(raw, dict) else {}


@dataclass(frozen=True)
class Cost:
    nodeid: str
    cpu_s: float
    wall_s: float
    fast: bool  # not marked slow: held to the budget


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--durations-out", default="", metavar="PATH",
                     help="write each test module's summed wall seconds there as JSON, for "
                          "tests/durations.json (the slow tier's order: longest first)")
    parser.addoption("--budget", type=float, default=DEFAULT_BUDGET,
                     help="CPU seconds each test not marked slow may cost (setup + call + teardown, its child "
                          f"processes included; wall time at most {WALL_FACTOR}x that); 0 turns the check off "
                          "(default %(default)s)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    item.stash[_START] = (time.monotonic(), _cpu_s())
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, None, None]:
    # before the teardown report is made from the item: its user properties travel to the controller under xdist
    if call.when == "teardown" and _START in item.stash:
        t0, c0 = item.stash[_START]
        item.user_properties.append((KEY, (round(_cpu_s() - c0, 3), round(time.monotonic() - t0, 3))))
    yield


class BudgetCheck:
    """Collects each test's cost from its teardown report (in the controller under xdist) and fails the session
    naming every fast test over the budget."""

    def __init__(self, budget: float, durations_out: str = "", top: bool = False) -> None:
        self.budget = budget
        self.durations_out = durations_out
        self.top = top
        self.costs: list[Cost] = []
        self.unwritten = ""

    def over(self) -> list[Cost]:
        """The fast tests over the budget, costliest first."""
        if not self.budget:
            return []
        return sorted((c for c in self.costs if c.fast and (c.cpu_s > self.budget
                                                             or c.wall_s > WALL_FACTOR * self.budget)),
                      key=lambda c: -c.cpu_s)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "teardown":
            return
        for key, value in report.user_properties:
            if key == KEY and isinstance(value, (tuple, list)):  # a list once it has crossed from an xdist worker
                cpu, wall = value
                self.costs.append(Cost(report.nodeid, float(cpu), float(wall), "slow" not in report.keywords))

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.durations_out and self.costs:
            modules: dict[str, float] = {}
            for c in self.costs:
                modules[module_of(c.nodeid)] = modules.get(module_of(c.nodeid), 0.0) + c.wall_s
            out = Path(self.durations_out)
            try:
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(json.dumps({m: round(t, 1) for m, t in sorted(modules.items())}, indent=1) + "\n")
            except OSError as exc:  # the tests' outcome stands; the summary says what was not written
                self.unwritten = f"--durations-out {out}: not written: {exc.strerror or exc}"
        if self.over() and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if self.unwritten:
            terminalreporter.write_line(self.unwritten, yellow=True)
        if self.top and len(self.costs) > 1:
            total = sum(c.cpu_s for c in self.costs)
            terminalreporter.section(f"most CPU ({total:.0f} s of CPU in all, child processes included)", sep="=")
            for c in sorted(self.costs, key=lambda c: -c.cpu_s)[:TOP]:
                terminalreporter.line(f"{c.cpu_s:7.2f} s CPU {c.wall_s:7.2f} s wall  {c.nodeid}")
        over = self.over()
        if not over:
            return
        terminalreporter.section("fast-test budget", sep="=", red=True, bold=True)
        for c in over:
            terminalreporter.line(f"{c.nodeid}: {c.cpu_s:.2f} s of CPU, {c.wall_s:.2f} s wall: over the budget "
                                  f"of {self.budget:g} s CPU ({WALL_FACTOR * self.budget:g} s wall): make it "
                                  "cheaper or mark it slow")


def pytest_configure(config: pytest.Config) -> None:
    # under xdist the workers measure and the controller judges (workers have workerinput)
    if not hasattr(config, "workerinput"):
        check = BudgetCheck(config.getoption("--budget"), config.getoption("--durations-out"),
                            config.getoption("durations") is not None)
        config.pluginmanager.register(check, "m1000-budget-check")
