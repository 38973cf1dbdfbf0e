"""A release that daemonizes (issue 25, item 5), through real workers and a real redis-server.

The simulated release's ``qwen3`` start script launches ``setsid -f env -i python3 squatter.py`` before its
server: a process in a session of its own with an empty environment (no agent mark), whose parent exits at
once; it waits for the server to serve and takes its port as soon as the server lets go. Before the fix it
outlived its key, the next key's server found its port taken ("port ... already in use before starting the
server"), and so did every later run on the module.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import tarfile
from pathlib import Path

import psutil
import pytest

from contract.records import RunState
from simulator.build import BuiltRelease
from tests.support import squatter
from tests.support.reliability import KEYS, QUICK_ENV
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow

SQUATTER = squatter.SOURCE


def daemon_release(release: BuiltRelease, out: Path, record: Path) -> BuiltRelease:
    """``release`` with a ``qwen3`` start script that daemonizes a port squatter first."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / release.path.name
    musa = f"{release.top}/scripts/ci/musa"
    line = (f'setsid -f env -i "$(command -v python3)" "$here/squatter.py" "${{SERVER_HOST:-127.0.0.1}}" '
            f'"${{SERVER_PORT:-30000}}" {record} </dev/null >/dev/null 2>&1\n')
    with tarfile.open(release.path) as src, tarfile.open(path, "w:gz") as dst:
        for m in src.getmembers():
            data = src.extractfile(m).read() if m.isfile() else None  # type: ignore[union-attr]  # a file: not None
            if m.name == f"{musa}/start_qwen3_server.sh":
                assert data is not None
                data = data.replace(b'MODEL="', line.encode() + b'MODEL="', 1)
                m.size = len(data)
            dst.addfile(m, io.BytesIO(data) if data is not None else None)
        info = tarfile.TarInfo(f"{musa}/squatter.py")
        info.size, info.mode = len(SQUATTER), 0o644
        dst.addfile(info, io.BytesIO(SQUATTER.encode()))
    return BuiltRelease(path, hashlib.sha256(path.read_bytes()).hexdigest(), release.version, release.top)


def squatters(record: Path) -> list[int]:
    return [int(p.read_text()) for p in record.glob("squatter-*.pid")]


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.fixture
def record(tmp_path: Path):
    d = tmp_path / "record"
    d.mkdir()
    yield d
    for pid in squatters(d):  # a failing test does not leave its squatter on the machine
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()


def test_a_daemon_of_the_release_ends_with_its_key_and_after_a_killed_agent(bench_factory, redis_broker, release,
                                                                             quick_release, tmp_path, record):
    # the first run at time scale 1000 (its keys' ends are what it checks); the second at 50: time to kill the agent
    # while qwen3's daemon waits
    quick = daemon_release(quick_release, tmp_path / "dist-quick", record)
    rel = daemon_release(release, tmp_path / "dist", record)
    b = bench_factory(redis_broker)
    b.lab.start()
    first = b.validate(quick)
    view = b.check_run(first, 120)
    assert [o.status for o in view.progress["sim-01"].outcomes] == ["passed", "passed"], view.progress["sim-01"]
    assert len(squatters(record)) == 1 and not any(alive(p) for p in squatters(record))
    # the agent SIGKILLed while qwen3's daemon waits: server, benchmark and daemon live on without it
    squatters_before = squatters(record)
    second = b.validate(rel)
    b.on_key(second, "sim-01", KEYS[0])
    wait_for(lambda: len(squatters(record)) == 2, 20, "the second run's daemon")
    b.lab.kill("sim-01")
    (daemon,) = set(squatters(record)) - set(squatters_before)
    assert alive(daemon)  # re-parented to init with the agent gone, and no mark to find it by
    b.lab.start(["sim-01"], sim_env={"sim-01": QUICK_ENV})  # the resumed run at time scale 1000
    view = b.check_run(second, 120)
    assert view.progress["sim-01"].state == RunState.DONE
    assert all(o.status == "passed" for o in view.progress["sim-01"].outcomes), view.progress["sim-01"]
    wait_for(lambda: not any(alive(p) for p in squatters(record)), 10, "no daemon of the release left")
