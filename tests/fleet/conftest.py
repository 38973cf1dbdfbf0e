"""Fixtures for the dispatch tests: a real broker (embedded or redis-server) and real workers.

The same tests run twice, once per broker, as celery's own suite does.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.lab import Lab, broker, make_lab  # noqa: F401 - broker: the fixture, registered by name
from tests.support.redis_server import RedisServer


@pytest.fixture(scope="module")
def shared_lab(tmp_path_factory: pytest.TempPathFactory, broker: tuple[str, RedisServer | None]) -> Iterator[Lab]:  # noqa: F811 - the fixture
    """Two running modules (sim-01, sim-02) and one that never starts (sim-03), shared by a test module."""
    lab = make_lab(tmp_path_factory.mktemp("lab"), broker, 2, extra=["sim-03"])
    lab.start()
    try:
        yield lab
    finally:
        lab.stop()


@pytest.fixture
def lab_factory(tmp_path: Path, broker: tuple[str, RedisServer | None]) -> Iterator:  # noqa: F811 - the fixture
    labs: list[Lab] = []

    def make(n: int = 2, **overrides: float) -> Lab:
        lab = make_lab(tmp_path / f"lab{len(labs)}", broker, n, extra=None, **overrides)
        labs.append(lab)
        return lab

    yield make
    for lab in labs:
        lab.stop()
