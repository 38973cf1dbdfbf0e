"""``bench/fake_agents.py``, the scale bench's fake agents (issue 47): each fake module holds connections of its own
on a real redis-server, sends a real idle agent's commands on them, takes its run message off its own queue and
writes its progress and rows with ``contract.kv``'s keys; a connection Redis refuses (``maxclients``) is counted,
not hidden."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from bench.scale import start_fakes
from controller.settings import ControllerSettings
from tests.support.redis_server import RedisServer, running_redis


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with running_redis(tmp_path_factory) as s:
        yield s


def fakes(tmp_path: Path, server: RedisServer, names: list[str], conns: int) -> tuple[list, dict]:
    settings = ControllerSettings(broker_url=server.url, data_dir=tmp_path / "fleet", inventory=tmp_path / "inv.toml",
                                  history=tmp_path / "h.sqlite")
    procs = start_fakes(tmp_path, names, conns, server.port, "run-1", 0.2, settings, polling=1.0)
    assert len(procs) == 1
    return procs, json.loads(procs[0][0].stdout.readline())


def stop(procs: list) -> dict:
    proc, out = procs[0]
    proc.stdin.write("stop\n")
    proc.stdin.flush()
    assert proc.wait(timeout=20) == 0
    return json.loads(out.read_text())


def _json(r: redis.Redis, key: str) -> Any:
    """The JSON value ``key`` holds (it must be there)."""
    raw = r.get(key)
    assert raw is not None, f"{key}: not on the server"
    return json.loads(raw)


def test_each_fake_holds_its_own_connections_beats_and_runs_what_it_takes(tmp_path: Path, server: RedisServer):
    r = redis.Redis(port=server.port)
    r.flushall()
    before = len(r.client_list())
    procs, up = fakes(tmp_path, server, ["fake-1", "fake-2"], 3)
    try:
        assert (up["open"], up["refused"]) == (6, 0)
        assert len(r.client_list()) == before + 6  # 3 each, as a real idle agent holds
        hb = _json(r, "m1000-fleet:hb:fake-1")
        assert hb["module"] == "fake-1" and hb["run_id"] is None
        assert 0 < r.ttl("m1000-fleet:hb:fake-2") <= 604800 and r.exists("m1000-fleet:lease:fake-2")
        r.lpush("module.fake-1", b"a run message")  # what the controller's dispatch leaves on the module's queue
        end = time.monotonic() + 10
        while not r.exists("m1000-fleet:rows:run-1:fake-1") and time.monotonic() < end:
            time.sleep(0.05)
        done = _json(r, "m1000-fleet:progress:run-1:fake-1")
        assert (done["state"], done["module"], done["rows"]) == ("done", "fake-1", 11)
        assert len(_json(r, "m1000-fleet:rows:run-1:fake-1")) == 11
        assert not r.exists("m1000-fleet:progress:run-1:fake-2")  # fake-2 took no message
    finally:
        seen = stop(procs)
    assert list(seen["received"]) == ["fake-1"] and seen["finished"] == 1


def test_connections_redis_refuses_are_counted(tmp_path: Path, server: RedisServer):
    r = redis.Redis(port=server.port)
    old = r.config_get("maxclients")["maxclients"]
    assert old is not None
    end = time.monotonic() + 10  # the module's earlier test's fakes may still be closing theirs (the server is shared)
    while len(r.client_list()) > 1 and time.monotonic() < end:
        time.sleep(0.05)
    r.config_set("maxclients", len(r.client_list()) + 4)  # room for one fake and one connection of the next
    try:
        procs, up = fakes(tmp_path, server, ["fake-1", "fake-2"], 3)
        stop(procs)
    finally:
        r.config_set("maxclients", old)
    assert up["refused"] >= 2 and "max number of clients" in up["why"]
