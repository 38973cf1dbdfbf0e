"""A real redis-server that may evict keys (``maxmemory`` set, ``maxmemory-policy allkeys-lru``): the
controller (``fleetctl validate``, ``serve``) and the agent (``fleet-agent worker``) refuse to use it, with
one line naming the fix, exit 2; nothing is dispatched. Without a limit nothing is evicted: accepted."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.history import History
from tests.support.lab import make_lab
from tests.support.redis_server import RedisServer, running_redis

pytestmark = [pytest.mark.slow, pytest.mark.redis]


def refusal(port: int) -> str:
    return (f"redis at 127.0.0.1:{port}: maxmemory-policy allkeys-lru evicts keys; results would be lost — "
            "set maxmemory-policy noeviction (redis.conf or CONFIG SET)")


@pytest.fixture(scope="module")
def evicting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    import redis

    with running_redis(tmp_path_factory) as server:
        r = redis.Redis(port=server.port)
        r.config_set("maxmemory", "256mb")
        r.config_set("maxmemory-policy", "allkeys-lru")
        r.close()
        yield server


def _fleet_agent() -> str:
    exe = Path(sys.executable).parent / "fleet-agent"
    return str(exe) if exe.exists() else "fleet-agent"


def test_fleetctl_validate_and_serve_refuse_an_evicting_broker(evicting, release, tmp_path):
    lab = make_lab(tmp_path / "lab", (evicting.url, evicting), 1)
    r = lab.fleetctl("validate", str(release.path), "--models", "qwen3", "--devices", "sim-01", "--detach")
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip() == f"fleetctl: error: {refusal(evicting.port)}"
    assert History(lab.settings.history_path).runs() == []  # nothing dispatched, nothing recorded
    import redis

    assert redis.Redis(port=evicting.port, db=int(lab.settings.broker_url.rsplit("/", 1)[1])).llen(
        "module.sim-01") == 0
    s = lab.fleetctl("serve", "--once")
    assert s.returncode == 2 and s.stderr.strip() == f"fleetctl: error: {refusal(evicting.port)}", s.stderr


def test_fleet_agent_worker_refuses_an_evicting_broker(evicting, tmp_path):
    work = tmp_path / "work"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env.update({"FLEET_BROKER_URL": evicting.url, "FLEET_MODULE": "sim-01", "FLEET_WORKDIR": str(work),
                "FLEET_MODEL_ROOT": str(tmp_path / "models"), "FLEET_DATA_DIR": str(tmp_path / "fleet"),
                "FLEET_METRICS_PORT": "0"})
    r = subprocess.run([_fleet_agent(), "worker"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr[-2000:]
    assert r.stderr.strip().splitlines()[-1] == f"error: {refusal(evicting.port)}"
    assert "Traceback" not in r.stderr
    import redis

    assert redis.Redis(port=evicting.port).get("m1000-fleet:lease:sim-01") is None  # it never claimed the name


def test_no_limit_evicts_nothing_whatever_the_policy(tmp_path_factory, tmp_path):
    import redis

    with running_redis(tmp_path_factory) as server:
        redis.Redis(port=server.port).config_set("maxmemory-policy", "allkeys-lru")  # maxmemory 0: no limit
        lab = make_lab(tmp_path / "lab", (server.url, server), 1)
        r = lab.fleetctl("devices")
        assert r.returncode == 0, r.stderr
        assert "sim-01" in r.stdout
