"""The reliability suite's lab: real workers, a real broker, real faults, and the invariants every test checks.

Every fault test ends with ``Bench.check_run``: the run reaches a terminal state within its bound,
the rows on each module equal the rows in the history, every passed key was benchmarked to
success exactly once and never again after it passed (counted in the module's own events; the key
a fault interrupted runs again, the tests count its starts), no process of the run is left, and
every module ends idle.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.store import RunStore
from contract.records import RunState
from controller.fleet import BrokerUnavailable, Fleet, RunView
from controller.history import History
from tests.fleet.conftest import Lab, RedisServer, broker, make_lab, running_redis  # noqa: F401 - fixture re-exported
from tests.fleet.test_dispatch import leftovers, wait_for

KEYS = ("qwen3", "qwen35_mtp")  # the first passes before each fault, the second is running when it strikes
SCALE = 50.0  # module seconds per wall second: a key takes a few seconds


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory):
    from simulator import build_release

    return build_release(tmp_path_factory.mktemp("release"), time_scale=SCALE, noise=0.0, seed=3)


@pytest.fixture(scope="module")
def redis_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, RedisServer]]:
    """A redis-server of this test module (for the faults that need a server to kill or stop)."""
    with running_redis(tmp_path_factory) as server:
        yield server.url, server


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
        """Wait until ``module`` benchmarks ``key`` (the keys before it passed)."""
        wait_for(lambda: (p := self.fleet.sync(run_id).progress.get(module)) is not None
                 and p.state == RunState.BENCHMARKING and p.model_key == key and p.step == "benchmark",
                 timeout, f"{module} benchmarking {key}", interval=0.1)

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


@pytest.fixture
def bench_factory(tmp_path: Path) -> Iterator:
    labs: list[Lab] = []

    def make(brk: tuple[str, RedisServer | None], n: int = 1, **overrides: float) -> Bench:
        lab = make_lab(tmp_path / f"lab{len(labs)}", brk, n, **overrides)
        labs.append(lab)
        return Bench(lab)

    yield make
    for lab in labs:
        lab.stop()
