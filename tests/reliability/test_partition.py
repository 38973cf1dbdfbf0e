"""Faults of the module's surroundings: its network link to the broker goes down (the agent in a
network namespace of its own, the host side of its veth pair set down), and its work folder fills up
(a small tmpfs). Real links, real mounts; each test ends with the suite's invariants."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.store import RunStore
from contract.records import RunState
from tests.support.locks import machine_lock
from tests.support.redis_server import REDIS, RedisServer
from tests.support.reliability import KEYS
from tests.support.tmpfs import mounted_tmpfs
from tests.support.wait import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.netns]

NS, HOST_IF, NS_IF = f"f8rel{os.getpid() % 10000}", "f8relh", "f8reln"
HOST_IP, NS_IP = "10.231.8.1", "10.231.8.2"


def _ip(*args: str, check: bool = True) -> None:
    p = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {p.stderr.strip()}")


def _capability() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces and tmpfs mounts need root"
    if shutil.which("ip") is None:
        return "ip (iproute2) not installed"
    if not REDIS:
        return "redis-server not installed (make test installs Debian's redis-server)"
    p = subprocess.run(["ip", "netns", "add", NS + "p"], capture_output=True, text=True)
    if p.returncode != 0:
        return f"cannot create a network namespace: {p.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", NS + "p"], capture_output=True)
    return None


@pytest.fixture(scope="module")
def link(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A namespace joined to this host by a veth pair, and a redis-server listening on both sides' reach."""
    why = _capability()
    if why:
        pytest.skip(why)
    with machine_lock("partition"):  # this link's fixed names: one on the machine at a time
        _ip("netns", "del", NS, check=False)
        _ip("link", "del", HOST_IF, check=False)
        _ip("netns", "add", NS)
        try:
            _ip("link", "add", HOST_IF, "type", "veth", "peer", "name", NS_IF)
            _ip("link", "set", NS_IF, "netns", NS)
            _ip("addr", "add", f"{HOST_IP}/24", "dev", HOST_IF)
            _ip("link", "set", HOST_IF, "up")
            _ip("netns", "exec", NS, "ip", "addr", "add", f"{NS_IP}/24", "dev", NS_IF)
            _ip("netns", "exec", NS, "ip", "link", "set", NS_IF, "up")
            _ip("netns", "exec", NS, "ip", "link", "set", "lo", "up")
            server = RedisServer(tmp_path_factory.mktemp("redis"), bind=("127.0.0.1", HOST_IP))
            server.start()
            try:
                yield server
            finally:
                server.stop()
        finally:
            _ip("link", "del", HOST_IF, check=False)
            _ip("netns", "del", NS, check=False)


@contextlib.contextmanager
def link_down(seconds: float) -> Iterator[None]:
    _ip("link", "set", HOST_IF, "down")
    try:
        time.sleep(seconds)
    finally:
        _ip("link", "set", HOST_IF, "up")
    yield


def start_in_namespace(b, server: RedisServer) -> None:
    db = b.lab.settings.broker_url.rsplit("/", 1)[1]
    b.lab.start(sim_env={"sim-01": {"FLEET_BROKER_URL": f"redis://{HOST_IP}:{server.port}/{db}"}},
                argv_prefix=("ip", "netns", "exec", NS))


# alone: heartbeats every 0.5 s against offline_after 2 s and lost_after 8 s; with both cores saturated by the
# slow tier's other workers the agent, back after a 5 s gap, was judged lost, and another run never reached its
# second key in 90 s
@pytest.mark.alone
@pytest.mark.parametrize("down,expect", [(1.0, "blip"), (5.0, "unreachable"), (12.0, "lost")])
def test_partition_agent_from_broker(bench_factory, link, release, down, expect):
    """The module's link to the broker goes down: a blip and a gap longer than offline_after cost nothing
    (the module is shown unreachable meanwhile, its run goes on, every row arrives); a gap longer than
    lost_after ends that module's part as lost, and the agent, back, fails it instead of finishing it."""
    b = bench_factory((f"redis://127.0.0.1:{link.port}/0", link), offline_after=2.0, lost_after=8.0)
    start_in_namespace(b, link)
    run_id = b.validate(release)
    b.on_key(run_id, "sim-01", KEYS[1])
    with link_down(down):
        pass
    seen = b.fleet.statuses(b.lab.state().inventory().modules)["sim-01"].state
    view = b.check_run(run_id, 90)
    p = view.progress["sim-01"]
    if expect == "lost":
        assert seen in ("offline", "unreachable")
        assert any("marked lost" in e[2] for e in b.history.events(run_id))
        # back on the network, the module's own end replaces "lost": done with every row when the run ended
        # during the partition, failed ("agent lost") when the agent saw the controller give it up first
        late = wait_for(lambda: (q := b.fleet.sync(run_id).progress["sim-01"]).state != RunState.LOST and q, 30,
                        "the late state")
        assert any("accepted after the module was marked lost" in e[2] for e in b.history.events(run_id))
        if late.state == RunState.DONE:
            assert b.history.row_count(run_id) == 26
        else:
            assert late.state == RunState.FAILED and "agent lost" in late.error.message
        b.check_run(run_id, 30)
    else:
        assert p.state == RunState.DONE and p.rows == 26 and b.history.row_count(run_id) == 26
        assert not any("marked lost" in e[2] for e in b.history.events(run_id))


@pytest.fixture
def small_workdir(tmp_path: Path) -> Iterator[Path]:
    yield from mounted_tmpfs(tmp_path / "lab0" / "modules" / "sim-01" / "work", "size=48m")


def test_disk_full_while_rows_are_written(bench_factory, redis_broker, release, small_workdir):
    """The module's work folder fills up mid-run: the run still ends, with the reason; what was stored is
    what the history has; the module comes back idle once space is free again."""
    b = bench_factory(redis_broker)
    b.lab.start(sim_env={"sim-01": {"FLEET_MIN_FREE_DISK": "0"}})
    run_id = b.validate(release)
    b.on_key(run_id, "sim-01", KEYS[1])
    filler = small_workdir / "filler"
    subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=1M", "count=64"], capture_output=True)
    try:
        view = b.finished(run_id, 90)
    finally:
        filler.unlink()
    p = view.progress["sim-01"]
    text = (p.error.message if p.error else "") + " ".join(o.error.message for o in p.outcomes if o.error)
    assert p.state == RunState.FAILED or any(o.status == "failed" for o in p.outcomes)
    assert "No space left" in text or "disk full" in text, text
    assert [o.status for o in p.outcomes][0] == "passed"
    b.check_run(run_id, 30)
    release_rows = [r for r in RunStore(small_workdir).rows(run_id) if r.source == "release"]
    assert len(release_rows) == b.history.row_count(run_id) >= 11
