"""The controller warns in one line when the broker's maxclients cannot hold its inventory's agents (issue 47)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.fleet.capacity import CONNECTIONS_PER_AGENT, RESERVED, capacity_problem
from tests.support.redis_server import RedisServer, running_redis


def test_enough_clients_is_no_problem() -> None:
    need = 10_000 * CONNECTIONS_PER_AGENT + RESERVED
    assert capacity_problem({"maxclients": need}, 10_000, "h:1") is None
    assert capacity_problem({"maxclients": "65000"}, 10_000, "h:1") is None


def test_too_few_clients_is_one_line_naming_the_server_both_limits_and_the_count() -> None:
    line = capacity_problem({"maxclients": 10_000}, 10_000, "redis.lab:6379")
    assert line is not None and "\n" not in line
    holds = (10_000 - RESERVED) // CONNECTIONS_PER_AGENT
    need = 10_000 * CONNECTIONS_PER_AGENT + RESERVED
    for part in ("redis.lab:6379", "maxclients 10000", f"~{holds} agents", "has 10000",
                 f"maxclients {need} or more", f"file-descriptor limit of {need + 32} or more"):
        assert part in line, (part, line)


@pytest.mark.parametrize("info", [{}, {"maxclients": None}, {"maxclients": "many"}])
def test_an_unreadable_maxclients_is_not_checked(info: dict[str, object]) -> None:
    assert capacity_problem(info, 10_000, "h:1") is None


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with running_redis(tmp_path_factory) as server:
        yield server


@pytest.mark.redis
def test_the_fleet_reads_maxclients_from_a_real_redis(redis_server: RedisServer, tmp_path: Path) -> None:
    import redis

    from controller.fleet import Fleet
    from controller.history import History
    from controller.settings import ControllerSettings

    settings = ControllerSettings(broker_url=redis_server.url, data_dir=tmp_path / "fleet",
                                  inventory=tmp_path / "inventory.toml", history=tmp_path / "h.sqlite")
    redis.Redis(port=redis_server.port).config_set("maxclients", 200)
    fleet = Fleet(settings, History(":memory:"))
    try:
        assert fleet.capacity_problem(50) is None  # 50 * 3 + 32 = 182
        line = fleet.capacity_problem(60)  # 212
        assert line is not None and f"127.0.0.1:{redis_server.port}" in line and "maxclients 200" in line
    finally:
        fleet.close()


@pytest.mark.redis
def test_serve_warns_in_one_line_when_the_inventory_outgrows_maxclients(redis_server: RedisServer,
                                                                          tmp_path: Path) -> None:
    import redis

    from controller.cli.demo import inventory_toml
    from controller.serve.daemon import capacity_warning
    from controller.service import Session
    from controller.settings import ControllerSettings

    redis.Redis(port=redis_server.port).config_set("maxclients", 200)
    (tmp_path / "inventory.toml").write_text(inventory_toml([f"m{i:02d}" for i in range(60)], tmp_path, None))
    settings = ControllerSettings(broker_url=redis_server.url, data_dir=tmp_path / "fleet",
                                  inventory=tmp_path / "inventory.toml", history=tmp_path / "h.sqlite")
    with Session(settings) as s:
        line = capacity_warning(s)
    assert line is not None and "\n" not in line and "the inventory has 60" in line
    (tmp_path / "inventory.toml").write_text(inventory_toml([f"m{i:02d}" for i in range(50)], tmp_path, None))
    with Session(settings) as s:
        assert capacity_warning(s) is None
