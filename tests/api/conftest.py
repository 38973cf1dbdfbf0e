"""Fixtures of the API tests: a controller on the embedded broker with a filled run history
(synthetic runs, no worker), a tokens file, and the app under a TestClient."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.history import History
from controller.settings import ControllerSettings
from tests.support.cli import INV, TARBALL, fill, write_release_stub
from tests.support.frames import seed_rows  # noqa: F401 - the fixture, registered by name
from tests.support.http_servers import TOKEN, Receiver, write_tokens


@pytest.fixture
def controller(tmp_path: Path, seed_rows: list) -> ControllerSettings:  # noqa: F811 - the fixture
    (tmp_path / "inv.toml").write_text(INV)
    write_release_stub(tmp_path / TARBALL)
    settings = ControllerSettings(broker_url="filesystem://", data_dir=tmp_path / "fleet",
                                  inventory=tmp_path / "inv.toml", history=tmp_path / "history.sqlite")
    h = History(settings.history_path)
    try:
        fill(h, seed_rows, state="done")
    finally:
        h.close()
    return settings


@pytest.fixture
def client(controller: ControllerSettings, tmp_path: Path) -> Iterator:
    from fastapi.testclient import TestClient

    from controller.serve.api import Tokens, create_app

    tokens = Tokens.load(write_tokens(tmp_path / "tokens", TOKEN, "another-token-0123456789"))
    with TestClient(create_app(controller, tokens)) as c:
        yield c


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()
