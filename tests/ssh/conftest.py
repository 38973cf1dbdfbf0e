"""Fixtures of the SSH tier: a lab of real sshd hosts in network namespaces, a wheelhouse."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.remote.deploy import DEFAULT_CACHE, WheelhouseBuilder
from tests.ssh.netns import Lab, capability_problem
from tests.support.ssh import REDIS_PASSWORD, REDIS_PORT, CachedWheelhouse


@pytest.fixture(scope="session")
def lab() -> Iterator[Lab]:
    problem = capability_problem()
    if problem:
        pytest.skip(f"SSH lab: {problem}")
    with Lab() as lab:
        yield lab


@pytest.fixture(scope="session")
def wheelhouse() -> CachedWheelhouse:
    # The per-platform wheel cache persists across sessions (as on a real controller).
    cache = Path(os.environ.get("FLEET_TEST_WHEEL_CACHE", DEFAULT_CACHE))
    return CachedWheelhouse(WheelhouseBuilder(cache_dir=cache))


@pytest.fixture(scope="session")
def lab_redis(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real redis-server on the lab's bridge address (password protected); yields its URL."""
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server not installed")
    d = tmp_path_factory.mktemp("redis")
    conf = d / "redis.conf"
    conf.write_text(f"bind {lab.gateway}\nport {REDIS_PORT}\nsave \"\"\nappendonly no\ndir {d}\n"
                    f"requirepass {REDIS_PASSWORD}\nprotected-mode no\n")
    conf.chmod(0o600)
    proc = subprocess.Popen([exe, str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                socket.create_connection((lab.gateway, REDIS_PORT), timeout=0.5).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"redis-server did not start on {lab.gateway}:{REDIS_PORT}")
                time.sleep(0.05)
        yield f"redis://:{REDIS_PASSWORD}@{lab.gateway}:{REDIS_PORT}/0"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
