"""A simulated lab: inventory, controller settings and real ``fleet-agent`` workers on one broker
(embedded, or the session's shared redis-server in a database of the lab's own: the ``broker`` fixture's two
params)."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from controller.cli.demo import Worker, inventory_toml, start_worker, stop_workers, wait_for_heartbeats
from controller.service import Session
from controller.settings import ControllerSettings
from tests.support.redis_server import DATABASES, RedisServer

_REDIS_DB = itertools.cycle(range(1, DATABASES))  # database 0 left to whoever uses the server directly


@pytest.fixture(scope="module", params=["embedded", pytest.param("redis", marks=pytest.mark.redis)])
def broker(request: pytest.FixtureRequest) -> Iterator[tuple[str, RedisServer | None]]:
    if request.param == "embedded":
        yield "filesystem://", None
        return
    server: RedisServer = request.getfixturevalue("shared_redis")
    yield server.url, server


@dataclass
class Lab:
    """A simulated lab: inventory, controller state, worker processes."""

    base: Path
    settings: ControllerSettings
    names: list[str]
    workers: dict[str, Worker] = field(default_factory=dict)
    redis: RedisServer | None = None

    def state(self) -> Session:
        return Session(self.settings)

    def worker_env(self) -> dict[str, str]:
        """FLEET_* variables for the lab's settings that workers must share (beyond start_worker's own)."""
        fields = ("lost_after", "run_time_limit", "broker_visibility_timeout", "max_attempts",
                  "broker_sentinel_master")
        defaults = ControllerSettings()
        return {f"FLEET_{f.upper()}": str(getattr(self.settings, f)) for f in fields
                if getattr(self.settings, f) != getattr(defaults, f)}

    def start(self, names: list[str] | None = None, sim_env: dict[str, dict[str, str]] | None = None,
              wait: bool = True, argv_prefix: tuple[str, ...] = ()) -> None:
        from simulator import make_models

        started = []
        for name in names or self.names:
            make_models(self.base / "modules" / name / "models")
            env = {**self.worker_env(), **(sim_env or {}).get(name, {})}
            w = start_worker(name, self.base, self.settings, sim_env=env, argv_prefix=argv_prefix)
            self.workers[name] = w
            started.append(w)
        if wait:
            wait_for_heartbeats(self.settings, started, 60)

    def kill(self, name: str) -> None:
        w = self.workers.pop(name)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(w.proc.pid, signal.SIGKILL)
        w.proc.wait(timeout=10)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
        env.update({"FLEET_BROKER_URL": self.settings.broker_url, "FLEET_DATA_DIR": str(self.settings.data_dir),
                    "FLEET_INVENTORY": str(self.settings.inventory),
                    "FLEET_HISTORY": str(self.settings.history_location),
                    "FLEET_HEARTBEAT_INTERVAL": str(self.settings.heartbeat_interval),
                    "FLEET_OFFLINE_AFTER": str(self.settings.offline_after), "FLEET_METRICS_PORT": "0",
                    "FLEET_CONTROLLER_METRICS_PORT": "0",
                    **self.worker_env()})
        return env

    def fleetctl(self, *args: str, timeout: float = 180, user: str | None = None) -> subprocess.CompletedProcess[str]:
        """``user``: who fleetctl acts as ($FLEET_USER; default: the OS user)."""
        exe = Path(sys.executable).parent / "fleetctl"
        cmd = [str(exe) if exe.exists() else "fleetctl", *args]
        env = self.env() if user is None else {**self.env(), "FLEET_USER": user}
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)

    def stop(self) -> None:
        stop_workers(list(self.workers.values()), grace=5)
        self.workers.clear()


def make_lab(base: Path, broker: tuple[str, RedisServer | None], n: int, extra: list[str] | None = None,
             **overrides: float) -> Lab:
    """A lab of ``n`` modules (plus ``extra`` names in the inventory that never get a worker).

    ``overrides``: ControllerSettings fields (heartbeat_interval, offline_after, lost_after, time limits...).
    """
    names = [f"sim-{i + 1:02d}" for i in range(n)]
    url = broker[0]
    if broker[1] is not None:  # every lab its own Redis database, emptied: labs reuse module names, and an
        db = next(_REDIS_DB)  # earlier module's lab may have used it on the session's shared server
        url = f"redis://127.0.0.1:{broker[1].port}/{db}"
        with redis.Redis(port=broker[1].port, db=db) as client:
            client.flushdb()
    fields: dict[str, Any] = {"heartbeat_interval": 0.5, "offline_after": 4.0, **overrides}  # names known at run time
    settings = ControllerSettings(broker_url=url, data_dir=base / "fleet", inventory=base / "inventory.toml",
                                  history=base / "history.sqlite", **fields)
    base.mkdir(parents=True, exist_ok=True)
    (base / "inventory.toml").write_text(inventory_toml(names + (extra or []), base, None))
    return Lab(base, settings, names, redis=broker[1])
