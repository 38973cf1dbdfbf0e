"""Wall time of ``make demo``: ``fleetctl demo`` (4 simulated modules x 7 keys, embedded broker) from its start to
its verdict, after installation.

Runs ``fleetctl demo --out DIR`` as a fresh process (as ``make demo`` runs it, into a scratch folder), ``--rounds``
times, and prints each round's wall time, the CPU of the demo and everything it started (``wait4``), and the demo's
last lines (its summary and verdict); then the median. Goal (issue 27's first hour): under 2 minutes (``--goal-s``);
exits 1 when the median misses it or a demo does not pass.

Usage: .venv/bin/python bench/demo.py [--rounds 1] [--modules 4] [--goal-s 120]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import record  # noqa: E402 - bench/record.py, this script's folder
from bench.spawn import spawn  # noqa: E402 - bench/spawn.py

FLEETCTL = Path(sys.executable).parent / "fleetctl"


def one(modules: int, out: Path) -> tuple[float, float, int, list[str]]:
    """Wall s, CPU s (the demo and every process it waited for), exit status, the output's last lines."""
    with tempfile.TemporaryFile() as log:
        s = spawn([str(FLEETCTL), "demo", "--modules", str(modules), "--out", str(out)], cwd=ROOT, stdout=log,
                  stderr_to_stdout=True)
        log.seek(0)
        lines = log.read().decode(errors="replace").splitlines()
    return s.wall_s, s.cpu_s, s.code, [line for line in lines if line.strip()][-12:]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--modules", type=int, default=4)
    ap.add_argument("--goal-s", type=float, default=120.0)
    args = ap.parse_args()
    walls, failed = [], False
    for i in range(args.rounds):
        with tempfile.TemporaryDirectory(prefix="bench-demo-") as tmp:
            load = os.getloadavg()[0]
            wall, cpu, code, tail = one(args.modules, Path(tmp) / "demo-out")
        walls.append(wall)
        failed |= code != 0
        print(f"round {i + 1}: wall {wall:.1f} s, CPU {cpu:.1f} s (the demo and its processes), exit {code}, "
              f"load average {load:.1f} at its start; its last lines:")
        print("\n".join(f"    {line}" for line in tail), flush=True)
    wall = statistics.median(walls)
    met = wall < args.goal_s and not failed
    print(f"fleetctl demo, {args.modules} modules x 7 keys: median wall {wall:.1f} s over {args.rounds} round(s); "
          f"goal < {args.goal_s:g} s and every demo passes: {'met' if met else 'NOT met'}")
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
