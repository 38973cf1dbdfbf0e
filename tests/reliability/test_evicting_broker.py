"""An evicting broker (``maxmemory`` with ``maxmemory-policy allkeys-lru``) under memory pressure from another
client: Redis drops the module's rows and final state after the backend took them. The module keeps every row
and sends its final state again until the controller acknowledges it; the controller never records the module
done with fewer rows than it reported. Real redis-server, real agent; ends with the suite's invariants.

The policy is set with CONFIG SET once the agent runs (a stack that refuses to start on an evicting broker can
still be driven into one)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

import pytest
import redis

from agent.store import RunStore
from contract.records import RunState
from tests.support.redis_server import RedisServer, running_redis
from tests.support.reliability import KEYS
from tests.support.wait import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.redis]

HEADROOM = 3 * 1024 * 1024  # maxmemory: what Redis holds when the pressure starts, plus this
FILLER = 32 * 1024  # bytes per filler value
RATE = 1.5 * 1024 * 1024  # filler bytes a second: an unread key lives ~HEADROOM / RATE = 2 s


@pytest.fixture
def evicting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with running_redis(tmp_path_factory) as server:
        yield server


@contextlib.contextmanager
def memory_pressure(server: RedisServer) -> Iterator[redis.Redis]:
    """allkeys-lru with little headroom, and another client writing filler keys (into a database of its own)
    until the block ends."""
    c = redis.Redis(port=server.port, db=15)
    used = int(c.info("memory")["used_memory"])
    c.config_set("maxmemory-policy", "allkeys-lru")
    c.config_set("maxmemory", str(used + HEADROOM))
    stop = threading.Event()

    def fill() -> None:
        value, n = b"x" * FILLER, 0
        while not stop.is_set():
            c.set(f"filler:{n}", value)
            n += 1
            stop.wait(FILLER / RATE)

    t = threading.Thread(target=fill, name="filler", daemon=True)
    t.start()
    try:
        yield c
    finally:
        stop.set()
        t.join(timeout=10)
        c.config_set("maxmemory", "0")
        c.close()


def test_evicting_broker_loses_no_row(bench_factory, evicting, release):
    """Memory pressure from the middle of the run until after it ended, and nobody syncing while the module
    finishes: Redis evicts the rows and the final state the module published. Every row the module measured
    still reaches the history, and the module is recorded done only with all of them."""
    b = bench_factory((evicting.url, evicting))
    b.lab.start()  # an unacknowledged final state is sent again every 6th heartbeat: 3 s
    run_id = b.validate(release)
    b.on_key(run_id, "sim-01", KEYS[1])
    work = b.workdir("sim-01")
    with memory_pressure(evicting) as c:
        # the module finishes with no controller looking, and the backend took its final state...
        wait_for(lambda: (p := RunStore(work).progress(run_id)) is not None and p.state.terminal
                 and not (work / "outbox" / f"{run_id}.json").exists(), 90, "the module to finish", interval=0.2)
        time.sleep(3 * HEADROOM / RATE)  # ...which Redis evicts meanwhile (an unread key lives ~2 s)
        evicted = int(c.info("stats")["evicted_keys"])
        assert evicted > 0
        view = b.check_run(run_id, 60)
    p = view.progress["sim-01"]
    local = RunStore(work).rows(run_id)
    assert p.state == RunState.DONE and p.finished_at is not None, (p.state, p.error)
    assert p.stored_rows == len(local) == len(b.history.rows(run_id, "sim-01", source=None))
    assert b.history.row_count(run_id) == p.rows == 26
    assert "sim-01" in b.history.telemetry(run_id)
    # the module drops its copy once the controller acknowledged it
    wait_for(lambda: not (work / "unacked" / f"{run_id}.json").exists(), 20, "the acknowledgement to reach the module")
    print(f"{evicted} keys evicted")
