"""One measured process for the benches: its wall time, its CPU (user + system of the process and of the children
it waited for, from ``wait4``), its peak RSS, its exit code and what it wrote on stderr.

Its stderr goes to a file, not a pipe: a pipe read only after ``wait4`` would block a child that writes more than
the pipe holds (64 KiB) and the bench with it. Each bench decides which exit codes it accepts (:meth:`Spawned.check`).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO


@dataclass(frozen=True)
class Spawned:
    """What one process cost and said."""

    argv: tuple[str, ...]
    wall_s: float
    cpu_s: float
    peak_mib: float
    code: int
    err: str
    timed_out: bool = False

    def check(self, ok: tuple[int, ...] = (0,)) -> Spawned:
        """Itself when its exit code is one of ``ok``; else the bench stops with one line naming the command."""
        if self.code not in ok:
            raise SystemExit(f"{' '.join(self.argv)}: exit {self.code}: {self.err.strip()[-300:]}")
        return self


def spawn(argv: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None,
          stdout: int | IO[bytes] = subprocess.DEVNULL, stderr_to_stdout: bool = False,
          timeout: float | None = None) -> Spawned:
    """Run ``argv`` as a fresh process until it exits (killed after ``timeout`` s: ``timed_out``).

    ``peak_mib`` is the kernel's ``ru_maxrss``: a child forked from a large process counts that process's pages from
    before its exec (a bench that runs beside gigabytes measures the peak with GNU time instead)."""
    with tempfile.TemporaryFile() as err:
        t = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=stdout,
                                stderr=subprocess.STDOUT if stderr_to_stdout else err)
        killer = threading.Timer(timeout, proc.kill) if timeout is not None else None
        if killer is not None:
            killer.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t
        if killer is not None:
            killer.cancel()
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        said = err.read().decode(errors="replace")
    return Spawned(tuple(argv), wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, proc.returncode, said,
                   timed_out=timeout is not None and wall >= timeout)
