"""The reliability suite's lab: real workers, a real broker, real faults, and the invariants every test checks.

Every fault test ends with ``Bench.check_run``: the run reaches a terminal state within its bound,
the rows on each module equal the rows in the history, every passed key was benchmarked to
success exactly once and never again after it passed (counted in the module's own events; the key
a fault interrupted runs again, the tests count its starts), no process of the run is left, and
every module ends idle.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.lab import Lab, broker, make_lab  # noqa: F401 - broker: the fixture, registered by name
from tests.support.redis_server import RedisServer, running_redis
from tests.support.reliability import SCALE, Bench


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory):
    from simulator import build_release

    return build_release(tmp_path_factory.mktemp("release"), time_scale=SCALE, noise=0.0, seed=3)


@pytest.fixture(scope="module")
def quick_release(tmp_path_factory: pytest.TempPathFactory):
    """The same release at time scale 1000 (a key in about a second), its own version (another tarball, another
    digest): for the runs whose order or end is asserted, not their figures nor a fault in their middle."""
    from simulator import build_release

    return build_release(tmp_path_factory.mktemp("quick"), version="1.4.2", time_scale=1000.0, noise=0.0, seed=3)


@pytest.fixture(scope="module")
def redis_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, RedisServer]]:
    """A redis-server of this test module (for the faults that need a server to kill or stop)."""
    with running_redis(tmp_path_factory) as server:
        yield server.url, server


@pytest.fixture
def bench_factory(tmp_path: Path) -> Iterator:
    labs: list[Lab] = []

    def make(brk: tuple[str, RedisServer | None], n: int = 1, **overrides: float) -> Bench:
        lab = make_lab(tmp_path / f"lab{len(labs)}", brk, n, extra=None, **overrides)
        labs.append(lab)
        return Bench(lab)

    yield make
    for lab in labs:
        lab.stop()
