"""CPU of the agent's hold on a run's processes (issue 25, item 5), per key and per run.

In a fresh interpreter made a subreaper (:func:`agent.procs.hold_orphans`, as ``fleet-agent worker`` and
``fleet-agent run`` are), with a run cgroup where the machine has one, it times (``time.process_time``, the
agent's own CPU) what the pipeline adds:

* per key: :meth:`Executor.sweep` with nothing left (the common case: read the run's ``cgroup.procs``, walk
  this process's children in the process table), and with one daemon left (it is stopped: SIGTERM, reaped);
* per run: :meth:`Executor.open_run` + :meth:`Executor.close_run` (cgroup made, leftovers looked for, removed);
* the reaper: one pass with a zombie to reap.

Usage: flock /tmp/bench.lock .venv/bin/python bench/procs.py [--n 200]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from agent import procs  # noqa: E402
from agent.executor import Executor  # noqa: E402
from bench import record  # noqa: E402 - bench/record.py, this script's folder


def cpu_ms(fn: Callable[[], object], n: int) -> tuple[float, float]:
    """Median and p90 CPU of one call of ``fn``, ms."""
    times = []
    for _ in range(n):
        t0 = time.process_time()
        fn()
        times.append((time.process_time() - t0) * 1000)
    times.sort()
    return statistics.median(times), times[int(0.9 * (len(times) - 1))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=200)
    n = ap.parse_args().n
    why = procs.hold_orphans()
    work = Path(tempfile.mkdtemp(prefix="bench-procs-"))
    ex = Executor(poll_interval=0.1, stop_grace=3.0)
    _, no_cgroup = ex.open_run(work, "bench")
    import psutil

    print(f"processes on the machine: {len(psutil.pids())}; subreaper: {why or 'yes'}; "
          f"run cgroup: {ex.cgroup.path if ex.cgroup else no_cgroup}")
    med, p90 = cpu_ms(ex.sweep, n)
    print(f"sweep at a key's end, nothing left:     median {med:.2f} ms CPU, p90 {p90:.2f} ms")

    def with_daemon() -> None:
        # a daemonized process (its parent exits at once), as a release's start script leaves one
        subprocess.run(procs.spawn_into(ex.cgroup, ["setsid", "-f", "sleep", "60"]), check=True)
        time.sleep(0.05)
        assert ex.sweep(), "the daemon was not found"

    spawn = cpu_ms(lambda: subprocess.run(procs.spawn_into(ex.cgroup, ["setsid", "-f", "true"]), check=True), 20)
    med, p90 = cpu_ms(with_daemon, 20)
    print(f"sweep at a key's end, one daemon left:  median {med - spawn[0]:.2f} ms CPU (spawning it excluded)")
    ex.close_run()

    def run_cycle() -> None:
        ex.open_run(work, "bench")
        ex.close_run()

    med, p90 = cpu_ms(run_cycle, n)
    print(f"open_run + close_run (once per run):    median {med:.2f} ms CPU, p90 {p90:.2f} ms")

    def reap_one() -> None:
        subprocess.run(["sh", "-c", "sleep 0.01 & exit 0"])
        time.sleep(0.05)
        procs.REAPER.reap()  # seen young
        time.sleep(procs.ZOMBIE_GRACE)
        procs.REAPER.reap()  # reaped

    before = procs.REAPER.reaped
    t0 = time.process_time()
    for _ in range(10):
        reap_one()
    print(f"reaper passes with an orphan to reap:   {(time.process_time() - t0) * 100:.2f} ms CPU per orphan "
          f"(incl. spawning it), reaped {procs.REAPER.reaped - before}")
    import shutil

    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
