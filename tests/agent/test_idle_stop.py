"""An idle agent stops within 1.5 s of SIGTERM (issue 47), polling no more often for it, on two Redis connections.

A real redis-server of the test's own (its command counts are this agent's), a real ``agent.worker`` process, a real
SIGTERM sent just after the agent's BRPOP went out: kombu's close waited for that BRPOP's reply, which an idle queue
sends at its server-side timeout (``polling_interval``, 5 s), so the stop took up to 5 s more; the agent now ends it
with ``CLIENT UNBLOCK`` (:mod:`contract.safe_transport`). Its connections: its BRPOP and one pool that its broker
channel and its result backend share (three before: the channel and the backend had a pool each).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import redis

from controller.cli.demo import inventory_toml, start_worker, stop_workers, wait_for_heartbeats
from controller.settings import ControllerSettings
from tests.support.redis_server import running_redis

pytestmark = [pytest.mark.slow, pytest.mark.redis]


def brpops(client: redis.Redis) -> int:
    stats = client.info("commandstats")
    return int(stats.get("cmdstat_brpop", {}).get("calls", 0))


def agent_connections(pid: int, port: int) -> int:
    import psutil

    return sum(1 for c in psutil.Process(pid).net_connections(kind="tcp") if c.raddr and c.raddr.port == port)


def test_an_idle_agent_stops_within_1_5_s_of_sigterm_and_polls_every_5_s(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    with running_redis(tmp_path_factory) as server:
        settings = ControllerSettings(broker_url=server.url, data_dir=tmp_path / "fleet",
                                      inventory=tmp_path / "inventory.toml", history=tmp_path / "h.sqlite",
                                      heartbeat_interval=5.0, offline_after=30.0)
        (tmp_path / "inventory.toml").write_text(inventory_toml(["m1"], tmp_path, None))
        client = redis.Redis(port=server.port)
        w = start_worker("m1", tmp_path, settings, sim_env={})
        try:
            wait_for_heartbeats(settings, [w], 60)
            end = time.monotonic() + 30
            while brpops(client) == 0 and time.monotonic() < end:  # the worker's consumer is polling
                time.sleep(0.05)
            # idle: one BRPOP per polling_interval (5 s), as before this change
            before, t0 = brpops(client), time.monotonic()
            time.sleep(6.0)
            polled = brpops(client) - before
            assert 1 <= polled <= 2, f"{polled} BRPOPs in {time.monotonic() - t0:.1f} s of idle"
            assert agent_connections(w.proc.pid, server.port) == 2
            # SIGTERM just after a BRPOP went out: its server-side timeout is ~5 s away
            n = brpops(client)
            while brpops(client) == n and time.monotonic() < end + 10:
                time.sleep(0.02)
            t0 = time.monotonic()
            os.killpg(w.proc.pid, signal.SIGTERM)
            w.proc.wait(timeout=15)
            took = time.monotonic() - t0
            log = w.log.read_text(errors="replace")
            assert w.proc.returncode == 0, log[-2000:]
            assert "Warm shutdown" in log  # the stop was Celery's warm shutdown, not a crash
            assert took < 1.5, f"the idle agent took {took:.2f} s to stop after SIGTERM"
        finally:
            stop_workers([w], grace=5)
