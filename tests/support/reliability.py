"""The reliability suite's bench: one lab with its controller seam, and the invariants every fault test checks
(``Bench.check_run``: see tests/reliability/conftest.py)."""

from __future__ import annotations

import collections
import time
from pathlib import Path

from agent.store import RunStore
from contract.records import RunState
from controller.fleet import BrokerUnavailable, Fleet, RunView
from controller.history import History
from tests.support.lab import Lab
from tests.support.procs import leftovers
from tests.support.wait import wait_for

KEYS = ("qwen3", "qwen35_mtp")  # the first passes before each fault, the second is running when it strikes
SCALE = 50.0  # module seconds per wall second: a key takes a few seconds
# a module's simulator at time scale 1000 (its environment, over the release's 50): for an agent started again after
# a fault, whose resumed run is checked for what it runs and how it ends, not for its figures
QUICK_ENV = {"M1000_SIM_TIME_SCALE": "1000"}


class Bench:
    """One lab with its controller seam, and what the tests ask of it."""

    def __init__(self, lab: Lab) -> None:
        self.lab = lab
        self.history = History(lab.settings.history_path)
        self.fleet = Fleet(lab.settings, self.history)

    def workdir(self, name: str) -> Path:
        return self.lab.base / "modules" / name / "work"

    def validate(self, release, devices: str = "sim-01", models: tuple[str, ...] = KEYS, *extra: str) -> str:
        r = self.lab.fleetctl("validate", str(release.path), "--models", ",".join(models), "--devices", devices,
                              "--detach", *extra)
        assert r.returncode == 0, r.stderr
        return r.stdout.strip().splitlines()[-1]

    def on_key(self, run_id: str, module: str, key: str, timeout: float = 90) -> None:
        """Wait until ``module`` benchmarks ``key`` (the keys before it passed): the controller sees the step, and
        the module's own events say the benchmark started (the step is published just before that line is
        written: a test that kills the agent in between, on a loaded machine, found one start fewer)."""
        wait_for(lambda: (p := self.fleet.sync(run_id).progress.get(module)) is not None
                 and p.state == RunState.BENCHMARKING and p.model_key == key and p.step == "benchmark",
                 timeout, f"{module} benchmarking {key}", interval=0.1)
        wait_for(lambda: self.benchmark_starts(module, run_id)[key] >= 1, 30,
                 f"{module}'s own record of benchmarking {key}", interval=0.1)

    def benchmark_starts(self, name: str, run_id: str, status: str = "start") -> collections.Counter[str]:
        """Benchmarks per key from the module's own events (``status="ok"``: those that succeeded)."""
        events = RunStore(self.workdir(name)).events(run_id)
        return collections.Counter(e["model_key"] for e in events if e["step"] == "benchmark"
                                   and e["status"] == status)

    def finished(self, run_id: str, bound: float) -> RunView:
        """Sync until the run ends, riding out a broker that is briefly away (as `fleetctl watch` does)."""

        def ended() -> RunView | None:
            try:
                v = self.fleet.sync(run_id)
            except BrokerUnavailable:
                return None
            return v if v.finished else None

        return wait_for(ended, bound, "a terminal state")

    def check_run(self, run_id: str, bound: float, *, modules: tuple[str, ...] = ("sim-01",)) -> RunView:
        """The invariants of every fault test; returns the final view."""
        t0 = time.monotonic()
        view = self.finished(run_id, bound)
        assert time.monotonic() - t0 <= bound
        for m in modules:
            local = sorted((r.source, r.model_key, r.profile, r.ttft_ms)
                           for r in RunStore(self.workdir(m)).rows(run_id))
            stored = sorted((r.source, r.model_key, r.profile, r.ttft_ms)
                            for r in self.history.rows(run_id, m, source=None))  # the probe's rows too
            assert local == stored, f"{m}: rows on the module and in the history differ"
            p = view.progress[m]
            assert p is not None, f"{m}: no progress in the run's view"
            ok = self.benchmark_starts(m, run_id, "ok")
            assert all(n == 1 for n in ok.values()), f"{m}: a key benchmarked again after it passed: {ok}"
            for o in p.outcomes:
                if o.status == "passed":
                    assert ok[o.model_key] == 1, f"{m}: {o.model_key} passed {ok[o.model_key]} times"
        wait_for(lambda: leftovers(self.lab) == [], 20, "no process of the run left")
        wait_for(lambda: all(st.state == "idle" for n, st in self.fleet.statuses(
            [mm for mm in self.lab.state().inventory().modules if mm.name in modules]).items()), 20,
                 "every module idle")
        return view
