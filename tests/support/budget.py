"""The fast tier's time budget: each test not marked ``slow`` may cost at most ``--budget`` seconds
(2 by default), or the session fails naming it.

A test's cost is the CPU time of its setup, call and teardown, measured where it runs (an xdist worker or the one
process): the process's own user and system time plus that of the child processes it waited for. ``make test`` runs
lint, the docs and two workers on two cores at once, which stretches wall times by 1.5-2.5x at random; CPU time
stays what the test costs. A test that mostly waits (sleeps, a slow server) is caught by its wall time instead:
at most ``WALL_FACTOR`` times the budget.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Generator
from dataclasses import dataclass

import pytest

KEY = "budget_cost_s"
DEFAULT_BUDGET = 2.0
WALL_FACTOR = 5


def _cpu_s() -> float:
    """CPU seconds of this process and of the children it has waited for."""
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


@dataclass(frozen=True)
class Over:
    nodeid: str
    cost_s: float
    wall_s: float


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--budget", type=float, default=DEFAULT_BUDGET,
                     help="CPU seconds each test not marked slow may cost (setup + call + teardown, its child "
                          f"processes included; wall time at most {WALL_FACTOR}x that); 0 turns the check off "
                          "(default %(default)s)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    t0, c0 = time.monotonic(), _cpu_s()
    item.user_properties.append((KEY, None))  # filled in before the teardown report is made
    slot = len(item.user_properties) - 1
    item.stash[_START] = (t0, c0, slot)
    yield


_START = pytest.StashKey[tuple[float, float, int]]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, None, None]:
    if call.when == "teardown" and _START in item.stash:
        t0, c0, slot = item.stash[_START]
        item.user_properties[slot] = (KEY, (round(_cpu_s() - c0, 3), round(time.monotonic() - t0, 3)))
    yield


class BudgetCheck:
    """Collects each fast test's cost from its teardown report (in the controller under xdist) and fails the
    session naming every test over the budget."""

    def __init__(self, budget: float) -> None:
        self.budget = budget
        self.over: list[Over] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "teardown" or "slow" in report.keywords:
            return
        for key, value in report.user_properties:
            if key == KEY and value is not None:
                cost, wall = float(value[0]), float(value[1])
                if cost > self.budget or wall > WALL_FACTOR * self.budget:
                    self.over.append(Over(report.nodeid, cost, wall))

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.over and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if not self.over:
            return
        terminalreporter.section("fast-test budget", sep="=", red=True, bold=True)
        for o in sorted(self.over, key=lambda o: -o.cost_s):
            terminalreporter.line(f"{o.nodeid}: {o.cost_s:.2f} s of CPU, {o.wall_s:.2f} s wall: over the budget "
                                  f"of {self.budget:g} s CPU ({WALL_FACTOR * self.budget:g} s wall): make it "
                                  "cheaper or mark it slow")


def pytest_configure(config: pytest.Config) -> None:
    budget = config.getoption("--budget")
    # under xdist the workers measure and the controller judges (workers have workerinput)
    if budget and not hasattr(config, "workerinput"):
        config.pluginmanager.register(BudgetCheck(budget), "m1000-budget-check")
