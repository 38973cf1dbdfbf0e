"""The fast tier's time budget: each test not marked ``slow`` must cost at most ``--budget`` seconds
(2 by default), or the session fails naming it.

A test's cost is its setup, call and teardown, measured where it runs (an xdist worker or the one process),
as wall time less the time its process spent runnable but waiting for a CPU (Linux ``/proc/self/schedstat``'s
second field). ``make test`` runs lint, the docs and two workers on two cores at once: waiting for a core is the
machine's load, not the test's cost, and leaving it out keeps the check from failing a test for its neighbours.
Sleeping, waiting for a child process and computing all count. Where schedstat is missing the cost is wall time.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path

import pytest

SCHEDSTAT = Path("/proc/thread-self/schedstat")
KEY = "budget_cost_s"
DEFAULT_BUDGET = 2.0


def _waited_s() -> float:
    """Seconds this thread has spent runnable, waiting for a CPU (0 where the kernel does not say)."""
    try:
        return int(SCHEDSTAT.read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


@dataclass(frozen=True)
class Over:
    nodeid: str
    cost_s: float
    wall_s: float


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--budget", type=float, default=DEFAULT_BUDGET,
                     help="seconds each test not marked slow may cost (setup + call + teardown, less the time "
                          "spent waiting for a CPU); 0 turns the check off (default %(default)s)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    t0, w0 = time.monotonic(), _waited_s()
    item.user_properties.append((KEY, None))  # filled in before the teardown report is made
    slot = len(item.user_properties) - 1
    item.stash[_START] = (t0, w0, slot)
    yield


_START = pytest.StashKey[tuple[float, float, int]]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, None, None]:
    if call.when == "teardown" and _START in item.stash:
        t0, w0, slot = item.stash[_START]
        wall = time.monotonic() - t0
        item.user_properties[slot] = (KEY, (round(wall - (_waited_s() - w0), 3), round(wall, 3)))
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
                cost, wall = value  # type: ignore[misc]
                if cost > self.budget:
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
            terminalreporter.line(f"{o.nodeid}: {o.cost_s:.2f} s (wall {o.wall_s:.2f} s) over the budget of "
                                  f"{self.budget:g} s: make it cheaper or mark it slow")


def pytest_configure(config: pytest.Config) -> None:
    budget = config.getoption("--budget")
    # under xdist the workers measure and the controller judges (workers have workerinput)
    if budget and not hasattr(config, "workerinput"):
        config.pluginmanager.register(BudgetCheck(budget), "m1000-budget-check")
