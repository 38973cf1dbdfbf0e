"""Fixtures of the CLI tests: an isolated environment (no FLEET_* leaking in), an inventory,
a release-named file, and a run history filled with synthetic runs (fast: no broker work)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from controller.history import History
from tests.support.cli import INV, TARBALL, fill, write_release_stub
from tests.support.frames import seed_rows  # noqa: F401 - the fixture, registered by name


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for k in ("FLEET_CONFIG", "FLEET_BROKER_URL", "FLEET_INVENTORY", "FLEET_HISTORY"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("FLEET_DATA_DIR", str(tmp_path / "fleet"))
    monkeypatch.setenv("FLEET_INVENTORY", str(tmp_path / "inv.toml"))
    monkeypatch.setenv("FLEET_HISTORY", str(tmp_path / "history.sqlite"))
    (tmp_path / "inv.toml").write_text(INV)
    write_release_stub(tmp_path / TARBALL)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(scope="session")
def filled_template(tmp_path_factory: pytest.TempPathFactory, seed_rows: list) -> Path:  # noqa: F811 - the fixture
    path = tmp_path_factory.mktemp("filled") / "history.sqlite"
    h = History(path)
    try:
        fill(h, seed_rows, state="done")
        h.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        h.close()
    return path


@pytest.fixture
def filled(env: Path, filled_template: Path) -> Path:
    """``env`` with a history holding a baseline, run-a (pass) and run-b (regressed), both done
    (a copy of one history filled once per session)."""
    shutil.copyfile(filled_template, env / "history.sqlite")
    return env / "history.sqlite"
