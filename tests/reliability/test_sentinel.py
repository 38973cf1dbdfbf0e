"""Redis Sentinel: the broker's master is SIGKILLed mid-run, a replica takes over, the run finishes.

A master and a replica (redis-server, AOF), three Sentinels (Debian's redis-sentinel) on loopback;
agents and controller reach the broker as ``sentinel://...`` with ``broker_sentinel_master``. The
master dies while the module benchmarks its second key; the Sentinels promote the replica (down
after 1 s here) and every client follows on its next connection. The suite's invariants hold: the
run ends within its bound, the rows on the module equal the rows in the history, no key was
benchmarked twice, nothing is left running, the module ends idle.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from contract.records import RunState
from simulator.ports import free_port
from tests.support.redis_server import REDIS, RedisServer
from tests.support.reliability import KEYS
from tests.support.wait import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.redis]

SENTINEL = shutil.which("redis-sentinel")
MASTER = "m1000"


def _client(port: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=0.5, socket_connect_timeout=0.5)


def _info(port: int, section: str) -> dict:
    try:
        with _client(port) as c:
            return dict(c.info(section))
    except redis.RedisError:
        return {}


@dataclass
class Replica(RedisServer):
    master_port: int = 0

    def start(self) -> None:  # RedisServer.start with --replicaof (same AOF settings)
        assert REDIS
        self.dir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [REDIS, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir), "--appendonly", "yes",
             "--appendfsync", "everysec", "--save", "", "--replicaof", "127.0.0.1", str(self.master_port)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: _info(self.port, "replication").get("master_link_status") == "up", 10,
                 "the replica in sync with its master", interval=0.05)


@dataclass
class Sentinels:
    dir: Path
    master_port: int
    ports: list[int] = field(default_factory=lambda: [free_port() for _ in range(3)])
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return ";".join(f"sentinel://127.0.0.1:{p}" for p in self.ports) + "/0"

    def start(self) -> None:
        assert SENTINEL
        for port in self.ports:
            d = self.dir / f"sentinel-{port}"
            d.mkdir(parents=True, exist_ok=True)
            conf = d / "sentinel.conf"  # the Sentinel rewrites its own config file: one each, writable
            conf.write_text(f"port {port}\nbind 127.0.0.1\ndir {d}\n"
                            f"sentinel monitor {MASTER} 127.0.0.1 {self.master_port} 2\n"
                            f"sentinel down-after-milliseconds {MASTER} 1000\n"
                            f"sentinel failover-timeout {MASTER} 5000\n"
                            f"sentinel parallel-syncs {MASTER} 1\n")
            self.procs.append(subprocess.Popen([SENTINEL, str(conf)], stdout=subprocess.DEVNULL,
                                               stderr=subprocess.DEVNULL))
        # every Sentinel knows the master and has found the other two (quorum 2 can be reached)
        wait_for(lambda: all(self._ask(p, "master").get("num-other-sentinels") == 2 for p in self.ports), 20,
                 "three Sentinels that see each other", interval=0.2)

    @staticmethod
    def _ask(port: int, what: str) -> dict:
        try:
            with _client(port) as c:
                return dict(c.sentinel_master(MASTER)) if what == "master" else {}
        except redis.RedisError:
            return {}

    def master_port_now(self) -> int | None:
        """Where the Sentinels say the master is (the first one that answers)."""
        for p in self.ports:
            with contextlib.suppress(redis.RedisError), _client(p) as c:
                addr = c.sentinel_get_master_addr_by_name(MASTER)
                if addr:
                    return int(addr[1])
        return None

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)


@pytest.fixture
def sentinel_broker(tmp_path: Path) -> Iterator[tuple[str, RedisServer, Replica, Sentinels]]:
    if not REDIS:
        pytest.skip("redis-server not installed (make test installs Debian's redis-server)")
    if not SENTINEL:
        pytest.skip("redis-sentinel not installed (make test installs Debian's redis-sentinel)")
    master = RedisServer(tmp_path / "master")
    master.start()
    replica = Replica(tmp_path / "replica", master_port=master.port)
    sentinels = Sentinels(tmp_path / "sentinels", master.port)
    try:
        replica.start()
        sentinels.start()
        yield sentinels.url, master, replica, sentinels
    finally:
        sentinels.stop()
        replica.stop()
        master.stop()


def test_master_sigkilled_mid_run_failover(bench_factory, sentinel_broker, release):
    """SIGKILL of the master while a key is benchmarked: the replica is promoted, the run finishes,
    every row is in the history and no key was benchmarked twice."""
    url, master, replica, sentinels = sentinel_broker
    b = bench_factory((url, None), broker_sentinel_master=MASTER)
    b.lab.start()
    run_id = b.validate(release)
    b.on_key(run_id, "sim-01", KEYS[1])
    t_kill = time.monotonic()
    master.kill()
    wait_for(lambda: sentinels.master_port_now() == replica.port, 30, "the Sentinels to promote the replica")
    failover_s = time.monotonic() - t_kill
    view = b.check_run(run_id, 120)
    p = view.progress["sim-01"]
    assert p.state == RunState.DONE and p.rows == 26, (p.state, p.error)
    assert b.history.row_count(run_id) == 26
    assert _info(replica.port, "replication").get("role") == "master"
    starts = b.benchmark_starts("sim-01", run_id)
    assert starts[KEYS[0]] == 1, starts  # the key that passed before the kill never ran again
    # the final state was written after the failover, to a master with no replica left: no replica
    # acknowledged it (WAIT 1), so it stays in the module's outbox until the old master is back as a replica
    outbox = b.workdir("sim-01") / "outbox" / f"{run_id}.json"
    assert outbox.exists()
    back = Replica(master.dir, port=master.port, master_port=replica.port)
    back.start()
    try:
        wait_for(lambda: not outbox.exists(), 30, "the outbox to empty once a replica acknowledges", interval=0.2)
        with _client(back.port) as c:
            assert c.get(f"m1000-fleet:progress:{run_id}:sim-01") is not None
    finally:
        back.kill()
    print(f"failover took {failover_s:.1f} s")


def test_final_state_no_replica_acknowledged_stays_in_the_outbox(tmp_path):
    """Asynchronous replication, closed at the seam: a final state that no replica acknowledged (WAIT 1
    answers 0) is not yet published and stays in the module's outbox; once a replica is in sync, the next
    flush sends it again, the replica holds it, and the outbox is empty."""
    from agent.outbox import Publisher, flush_outbox, outbox_path
    from agent.settings import AgentSettings
    from contract.celery_app import make_app
    from contract.kv import KV
    from contract.records import RunProgress

    if not REDIS:
        pytest.skip("redis-server not installed (make test installs Debian's redis-server)")
    master = RedisServer(tmp_path / "master")
    master.start()
    replica = Replica(tmp_path / "replica", master_port=master.port)
    try:
        work = tmp_path / "work"
        settings = AgentSettings(broker_url=master.url, module="sim-01", workdir=work, final_state_replicas=1)
        kv = KV(make_app(settings, module=settings.module))
        run_id, now = "r-wait-1", time.time()
        done = RunProgress(run_id=run_id, module="sim-01", release="1.4.1", state=RunState.DONE, keys_total=1,
                           keys_done=1, updated_at=now, finished_at=now)
        Publisher(kv, work, run_id, "sim-01", replicas=settings.replicas_to_wait(), wait_s=0.2).final(done)
        assert outbox_path(work, run_id).exists()  # on the master, but no replica has it: kept
        sent = kv.progress(run_id, ["sim-01"])["sim-01"]
        assert sent is not None and sent.state == RunState.DONE
        assert flush_outbox(kv, work, 1, 0.2) == 0 and outbox_path(work, run_id).exists()
        replica.start()
        assert flush_outbox(kv, work, 1, 5.0) == 1 and not outbox_path(work, run_id).exists()
        with _client(replica.port) as c:
            assert c.get(f"m1000-fleet:progress:{run_id}:sim-01") is not None
        # without a replica to wait for (a single Redis: the default), the outbox empties at once
        Publisher(kv, work, "r-wait-2", "sim-01").final(done.model_copy(update={"run_id": "r-wait-2"}))
        assert not outbox_path(work, "r-wait-2").exists()
    finally:  # SIGKILL: a replica that has just synced can take over 10 s to shut down on SIGTERM
        replica.kill()
        master.kill()
