"""A slow, lossy link between the module and the broker: the agent in a network namespace of its own whose
packets are dropped at random (iptables' statistic match, 20 % each way: this kernel has no sch_netem) and
whose every byte to and from Redis waits 150-300 ms in a TCP delay proxy. The run ends (slower), and the
history gets the module's one terminal state with ``finished_at``, its device telemetry summary and every row.
Real namespace, real redis-server, real agent; ends with the suite's invariants."""

from __future__ import annotations

import contextlib
import os
import queue
import random
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator

import pytest

from agent.store import RunStore
from contract.records import RunState
from tests.support.locks import machine_lock
from tests.support.redis_server import REDIS, RedisServer, running_redis
from tests.support.reliability import KEYS
from tests.support.wait import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.redis, pytest.mark.netns]

NS, HOST_IF, NS_IF = f"f25ll{os.getpid() % 10000}", "f25llh", "f25lln"
HOST_IP, NS_IP = "10.231.25.1", "10.231.25.2"
LOSS = 0.2
DELAY = (0.15, 0.30)  # seconds, each way


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    p = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {p.stderr.strip()}")
    return p


def _capability() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces and iptables need root"
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return f"{tool} not installed"
    if not REDIS:
        return "redis-server not installed (make test installs Debian's redis-server)"
    probe = NS + "p"
    p = _run("ip", "netns", "add", probe, check=False)
    if p.returncode != 0:
        return f"cannot create a network namespace: {p.stderr.strip()}"
    try:
        q = _run("ip", "netns", "exec", probe, "iptables", "-A", "INPUT", "-m", "statistic", "--mode", "random",
                 "--probability", "0.5", "-j", "DROP", check=False)
        if q.returncode != 0:
            return f"iptables' statistic match is not available: {q.stderr.strip()}"
    finally:
        _run("ip", "netns", "del", probe, check=False)
    return None


def dropped_packets() -> int:
    """Packets the namespace's random DROP rules dropped so far (both ways)."""
    out = _run("ip", "netns", "exec", NS, "iptables", "-L", "-v", "-x", "-n").stdout
    return sum(int(line.split()[0]) for line in out.splitlines() if "DROP" in line and "statistic" in line)


class DelayProxy:
    """A TCP proxy that holds every chunk it relays, each way, for a random delay in ``delay`` (order kept)."""

    def __init__(self, listen: str, target: tuple[str, int], delay: tuple[float, float]) -> None:
        self.server = socket.create_server((listen, 0))
        self.port = self.server.getsockname()[1]
        self.target, self.delay = target, delay
        self.stopped = threading.Event()
        self.socks: list[socket.socket] = []
        threading.Thread(target=self._accept, name="delay-proxy", daemon=True).start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            self.socks += [client, upstream]
            for src, dst in ((client, upstream), (upstream, client)):
                self._pump(src, dst)

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        held: queue.Queue[tuple[float, bytes] | None] = queue.Queue()

        def read() -> None:
            with contextlib.suppress(OSError):
                while data := src.recv(65536):
                    held.put((time.monotonic() + random.uniform(*self.delay), data))
            held.put(None)

        def write() -> None:
            with contextlib.suppress(OSError):
                while (item := held.get()) is not None:
                    due, data = item
                    time.sleep(max(0.0, due - time.monotonic()))
                    dst.sendall(data)
                dst.shutdown(socket.SHUT_WR)

        threading.Thread(target=read, daemon=True).start()
        threading.Thread(target=write, daemon=True).start()

    def close(self) -> None:
        self.stopped.set()
        self.server.close()
        for s in self.socks:
            with contextlib.suppress(OSError):
                s.close()


@pytest.fixture
def lossy_link(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RedisServer, DelayProxy]]:
    """A namespace joined to this host by a veth pair that drops LOSS of its packets each way, and a delay proxy
    on the host side in front of a redis-server (the controller reaches Redis directly)."""
    why = _capability()
    if why:
        pytest.skip(why)
    with machine_lock("lossy-link"):  # this link's fixed names: one on the machine at a time
        _run("ip", "netns", "del", NS, check=False)
        _run("ip", "link", "del", HOST_IF, check=False)
        _run("ip", "netns", "add", NS)
        try:
            _run("ip", "link", "add", HOST_IF, "type", "veth", "peer", "name", NS_IF)
            _run("ip", "link", "set", NS_IF, "netns", NS)
            _run("ip", "addr", "add", f"{HOST_IP}/24", "dev", HOST_IF)
            _run("ip", "link", "set", HOST_IF, "up")
            for cmd in (("ip", "addr", "add", f"{NS_IP}/24", "dev", NS_IF), ("ip", "link", "set", NS_IF, "up"),
                        ("ip", "link", "set", "lo", "up")):
                _run("ip", "netns", "exec", NS, *cmd)
            for chain in ("INPUT", "OUTPUT"):
                _run("ip", "netns", "exec", NS, "iptables", "-A", chain, "-o" if chain == "OUTPUT" else "-i", NS_IF,
                     "-m", "statistic", "--mode", "random", "--probability", str(LOSS), "-j", "DROP")
            with running_redis(tmp_path_factory) as server:
                proxy = DelayProxy(HOST_IP, ("127.0.0.1", server.port), DELAY)
                try:
                    yield server, proxy
                finally:
                    proxy.close()
        finally:
            _run("ip", "link", "del", HOST_IF, check=False)
            _run("ip", "netns", "del", NS, check=False)


def test_lossy_slow_link_keeps_finished_at_telemetry_and_rows(bench_factory, lossy_link, release) -> None:
    """The controller follows the run closely (as `fleetctl watch` does) while the module's writes crawl over
    the link: the module's part is terminal only with its final record, finished_at, the device telemetry
    summary and every row it measured."""
    server, proxy = lossy_link
    b = bench_factory((server.url, server), offline_after=30.0, lost_after=300.0)
    db = b.lab.settings.broker_url.rsplit("/", 1)[1]
    # the module's simulated time at 200 (its benchmarks in ~4 s, not ~15 s): what crawls is the link, not the run
    b.lab.start(sim_env={"sim-01": {"FLEET_BROKER_URL": f"redis://{HOST_IP}:{proxy.port}/{db}",
                                    "M1000_SIM_TIME_SCALE": "200"}},
                argv_prefix=("ip", "netns", "exec", NS))
    t0 = time.monotonic()
    run_id = b.validate(release)
    # followed closely from its last key on (any step of it: at this speed its benchmark may pass between two
    # writes that crawl over the link)
    wait_for(lambda: (p := b.fleet.sync(run_id).progress.get("sim-01")) is not None
             and (p.model_key == KEYS[1] or p.state.terminal), 240, f"sim-01 on {KEYS[1]}", interval=0.1)
    seen: list[str] = []
    end = time.monotonic() + 240
    while time.monotonic() < end:  # sync often: a terminal state published before the final one is seen
        p = b.fleet.sync(run_id).progress["sim-01"]
        if p is not None and (not seen or seen[-1] != f"{p.state.value}/{p.step}"):
            seen.append(f"{p.state.value}/{p.step}")
        if p is not None and p.state.terminal:
            break
        time.sleep(0.05)
    view = b.check_run(run_id, 60)
    p = view.progress["sim-01"]
    assert p.state == RunState.DONE, (p.state, p.error, seen)
    assert p.finished_at is not None, seen
    assert "sim-01" in b.history.telemetry(run_id), seen
    assert p.telemetry_digest is not None and p.stored_rows == len(RunStore(b.workdir("sim-01")).rows(run_id))
    assert b.history.row_count(run_id) == p.rows == 26
    dropped = dropped_packets()
    assert dropped > 0
    print(f"run over the lossy link: {time.monotonic() - t0:.0f} s, {dropped} packets dropped; "
          f"states seen: {', '.join(seen)}")
