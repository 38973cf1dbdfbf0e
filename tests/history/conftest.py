"""The history's fixtures: one PostgreSQL server for the session (started when a test asks for it) and a history
on either engine, a fresh SQLite file or a fresh database per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.history import History
from tests.support.frames import reference, seed_rows  # noqa: F401 - fixtures, registered by name
from tests.support.postgres_server import PostgresServer, running_postgres

ENGINES = ["sqlite", pytest.param("postgresql", marks=pytest.mark.slow)]


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PostgresServer]:
    with running_postgres() as server:
        yield server


@pytest.fixture
def location(request: pytest.FixtureRequest, tmp_path: Path) -> str | Path:
    """Where a fresh history lives: a SQLite file, or (parameter ``postgresql``) a new database's URL."""
    if request.param == "postgresql":
        return request.getfixturevalue("pg_server").fresh_database()
    return tmp_path / "history.sqlite"


@pytest.fixture
def history(location: str | Path) -> Iterator[History]:
    h = History(location)
    yield h
    h.close()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Every test here that takes ``location`` (or ``history``) runs on both engines."""
    if "location" in metafunc.fixturenames:
        metafunc.parametrize("location", ENGINES, indirect=True)
