"""Processes a test started or may have left behind: stopping a process group; finding leftovers by working folder, by
the agent's mark, by environment text."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil

from agent.procs import MARK  # what agent.worker marks its processes with


def processes_under(path: Path) -> list[psutil.Process]:
    """Live processes whose working folder is inside ``path`` (what a run could leave behind)."""
    out = []
    root = str(path.resolve())
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE or p.pid == os.getpid():
                continue
            if p.cwd().startswith(root):
                out.append(p)
        except psutil.Error:
            continue
    return out


@contextmanager
def nothing_left_under(base: Path) -> Iterator[Path]:
    """Fails if any process started under ``base`` (a release's server, an engine, their children) outlives the
    block (killed)."""
    yield base
    strays = processes_under(base)
    for p in strays:
        p.kill()
    assert not strays, [p.cmdline() for p in strays]


def leftovers(lab) -> list[psutil.Process]:
    """Processes started for the lab's modules that are not part of a live worker's own group."""
    workdirs = {str(lab.base / "modules" / n / "work") for n in lab.names}
    groups = {w.proc.pid for w in lab.workers.values()}
    found = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(MARK) in workdirs and os.getpgid(p.pid) not in groups:
                found.append(p)
        except (psutil.Error, OSError):
            continue
    return found


def env_has(p: psutil.Process, text: str) -> bool:
    try:
        return any(text in v for v in p.environ().values())
    except (psutil.Error, OSError):
        return False


def stop_process(proc: subprocess.Popen[Any], grace: float = 10.0) -> None:
    """Stop one process: SIGTERM, then SIGKILL after ``grace`` seconds; reaped either way."""
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


def stop_group(proc: subprocess.Popen[Any], grace: float = 20.0) -> None:
    """Stop the process group ``proc`` leads (started with ``start_new_session``): SIGTERM, then SIGKILL after
    ``grace`` seconds; reaped either way."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
