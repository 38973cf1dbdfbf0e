"""A release whose start script daemonizes (issue 25, item 5): real ``fleet-agent run`` processes, real signals.

The start script of ``qwen3`` launches ``setsid -f env -i python3 squatter.py``: a process in a session of its
own, with an empty environment (no agent mark), whose parent exits at once. It waits for the server's port and
takes it as soon as the server lets go. Before the fix it survived its run (and a cancel), and every later run
failed with "port ... already in use before starting the server".
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
from pathlib import Path

import psutil
import pytest

from agent import procs
from agent.store import RunStore
from simulator.ports import free_port
from tests.support import squatter
from tests.support.agent_release import TEMPLATE, TOP, Release, build_release
from tests.support.wait import wait_for

ROOT = Path(__file__).resolve().parents[2]
MUSA = "scripts/ci/musa"

SQUATTER = squatter.SOURCE

START = '''#!/usr/bin/env bash
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
py="$(command -v python3)"
# a daemon: a session of its own, an empty environment, its parent (setsid) gone at once
setsid -f env -i "$py" "$here/squatter.py" "$SERVER_HOST" "$SERVER_PORT" "$FAKE_RECORD_DIR" </dev/null >/dev/null 2>&1
exec python3 "$here/fake_server.py" "$(basename "$0")"
'''


def daemon_release(out: Path, tables: dict[str, str]) -> Release:
    """The hand-made release, with a start script of ``qwen3`` that daemonizes a port squatter."""
    tree = out / "tree"
    shutil.copytree(TEMPLATE, tree)
    (tree / MUSA / "squatter.py").write_text(SQUATTER)
    start = tree / MUSA / "start_qwen3_server.sh"
    start.write_text(START)
    start.chmod(0o755)
    plain = build_release(out, tables)  # tables added the usual way, then the template swapped for the tree
    path = out / "daemon.tar.gz"
    with tarfile.open(plain.path) as src, tarfile.open(path, "w:gz") as dst:
        dst.add(tree, arcname=TOP)
        for m in src.getmembers():
            if m.name.startswith(f"{TOP}/tables/"):
                dst.addfile(m, src.extractfile(m))
    return Release(path, hashlib.sha256(path.read_bytes()).hexdigest())


@pytest.fixture
def daemon(tmp_path: Path, tables: dict[str, str]) -> Release:
    return daemon_release(tmp_path / "dist", tables)


@pytest.fixture
def record(record_dir: Path, no_leftovers: None) -> Path:
    """The fake scripts' record folder; after the test no process of it may be left (``no_leftovers``)."""
    return record_dir


def squatters(record: Path) -> list[int]:
    return [int(p.read_text()) for p in record.glob("squatter-*.pid")]


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _env(record: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_")}
    env["FAKE_RECORD_DIR"] = str(record)
    return env


def _cmd(rel: Release, model_root: Path, work: Path, run_id: str, port: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "agent.cli", "run", str(rel.path), "--models", "qwen3", "--model-root",
            str(model_root), "--workdir", str(work), "--run-id", run_id, "--module", "m9", "--server-port",
            str(port), "--sha256", rel.sha256, "--format", "json", *extra]


def _run(rel: Release, model_root: Path, work: Path, run_id: str, port: int, record: Path,
         *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(_cmd(rel, model_root, work, run_id, port, *extra), capture_output=True, text=True,
                          env=_env(record), cwd=ROOT, timeout=120)


@pytest.mark.slow
def test_a_daemon_of_the_release_ends_with_its_run_and_the_next_run_passes(tmp_path, daemon, model_root, record):
    work, port = tmp_path / "w", free_port()
    first = _run(daemon, model_root, work, "d1", port, record)
    assert first.returncode == 0, first.stderr
    pids = squatters(record)
    assert len(pids) == 1, "the start script did not daemonize its squatter"
    assert not alive(pids[0]), f"the release's daemon outlived its run: {procs.command_of(pids[0])}"
    assert not list(record.glob("squatter-*.bound")), "the daemon took the port"
    events = RunStore(work).events("d1")
    stopped = [e for e in events if e["step"] == "cleanup"]
    assert stopped and f"pid {pids[0]}" in stopped[0]["message"] and "squatter.py" in stopped[0]["message"]
    second = _run(daemon, model_root, work, "d2", port, record)
    assert second.returncode == 0, second.stderr
    assert not any(alive(p) for p in squatters(record))


@pytest.mark.slow
def test_a_daemon_of_the_release_ends_when_its_run_is_cancelled(tmp_path, daemon, model_root, record):
    work, port = tmp_path / "w", free_port()
    proc = subprocess.Popen(_cmd(daemon, model_root, work, "c1", port, "--key-env", "qwen3:FAKE_BENCH_MODE=hang"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(record), cwd=ROOT)
    store = RunStore(work)

    def benchmarking() -> bool:
        p = store.progress("c1") if (work / "runs" / "c1" / "progress.json").exists() else None
        return p is not None and p.step == "benchmark" and p.model_key == "qwen3"

    wait_for(benchmarking, 60, "the benchmark of qwen3", interval=0.1)
    wait_for(lambda: squatters(record), 10, "the daemon", interval=0.1)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    cancelled = store.progress("c1")
    assert cancelled is not None and cancelled.state.value == "cancelled"
    assert not any(alive(p) for p in squatters(record)), "the release's daemon outlived the cancel"
    again = _run(daemon, model_root, work, "c2", port, record)
    assert again.returncode == 0, again.stderr


@pytest.mark.slow
def test_a_port_held_by_a_foreign_process_fails_the_key_naming_it(tmp_path, release, model_root, record):
    port = free_port()
    holder = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    try:
        wait_for(lambda: _listening(port), 20, "the foreign server", interval=0.1)
        res = _run(release, model_root, tmp_path / "w", "f1", port, record)
        assert res.returncode == 1, res.stderr
        out = json.loads(res.stdout)
        err = out["progress"]["outcomes"][0]["error"]
        assert err["step"] == "server"
        assert f"held by a process that is not this agent's: pid {holder.pid}" in err["message"]
        assert "http.server" in err["message"]
        assert holder.poll() is None, "a process that is not the agent's was stopped"
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.slow
def test_a_leftover_of_a_killed_agent_holding_the_port_is_freed(tmp_path, daemon, model_root, record):
    """The agent SIGKILLed mid-benchmark: its server, benchmark and daemon live on (orphans of init, the daemon
    with no mark). The next run stops them all (they are in the dead run's cgroup) and passes."""
    if procs.open_run_cgroup(tmp_path / "probe", "probe")[0] is None:
        pytest.skip(f"needs a writable cgroup v2 hierarchy: {procs.open_run_cgroup(tmp_path / 'probe', 'p')[1]}")
    procs.sweep_leftover_cgroups(tmp_path / "probe", 1.0)
    work, port = tmp_path / "w", free_port()
    proc = subprocess.Popen(_cmd(daemon, model_root, work, "k1", port, "--key-env", "qwen3:FAKE_BENCH_MODE=hang"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(record), cwd=ROOT)
    store = RunStore(work)
    wait_for(lambda: (p := store.progress("k1")) is not None and p.step == "benchmark", 60, "the benchmark",
             interval=0.1)
    wait_for(lambda: squatters(record), 10, "the daemon", interval=0.1)
    proc.kill()
    proc.communicate(timeout=30)
    assert _listening(port) and all(alive(p) for p in squatters(record))  # left running by the killed agent
    res = _run(daemon, model_root, work, "k2", port, record)
    assert res.returncode == 0, res.stderr
    assert not any(alive(p) for p in squatters(record))
    assert [e for e in store.events("k2") if e["step"] == "cleanup" and "an earlier run" in e["message"]]


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False
