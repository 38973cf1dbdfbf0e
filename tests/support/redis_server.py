"""A redis-server of a test's own: started on a free loopback port, AOF on, stopped, killed or restarted."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from simulator.ports import free_port

REDIS = shutil.which("redis-server")
# a lab takes a database of its own (tests.support.lab.make_lab): a session's shared server goes through dozens
DATABASES = 64


@dataclass
class RedisServer:
    dir: Path
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    bind: tuple[str, ...] = ("127.0.0.1",)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        assert REDIS
        self.dir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [REDIS, "--port", str(self.port), "--bind", *self.bind, "--dir", str(self.dir), "--appendonly", "yes",
             "--appendfsync", "everysec", "--save", "", "--daemonize", "no",
             "--databases", str(DATABASES),
             # protected mode refuses clients off loopback without a password: the veth test host is one
             "--protected-mode", "yes" if self.bind == ("127.0.0.1",) else "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        end = time.monotonic() + 10
        while time.monotonic() < end:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as c:
                c.sendall(b"PING\r\n")
                if c.recv(16).startswith(b"+PONG"):
                    return
            time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)

    def kill(self) -> None:
        """SIGKILL: no shutdown, no final AOF rewrite (appendfsync everysec: at most ~1 s of writes lost)."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def restart(self, down_for: float = 1.0) -> None:
        self.stop()
        time.sleep(down_for)
        self.start()


@contextlib.contextmanager
def running_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A redis-server of its own for a test module (skips, saying why, where none is installed)."""
    if not REDIS:
        pytest.skip("redis-server not installed (make test installs Debian's redis-server)")
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    try:
        yield server
    finally:
        server.stop()



@pytest.fixture(scope="session")
def shared_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server for every lab of the session (of each xdist worker), each lab in a database of its own,
    emptied when the lab takes it (``tests.support.lab.make_lab``). Labs only use their broker; a test that faults
    its Redis (kills, fills, restarts it) or counts the commands it receives starts one of its own
    (``running_redis``)."""
    with running_redis(tmp_path_factory) as server:
        yield server
