"""Benchmark: start-up of ``fleetctl`` verbs, next to ``python -c pass`` in the same run.

Each command runs as a fresh process (as a user or a farm script types it), rounds interleaved
so that load on the machine hits every command alike; prints the median and spread of wall
time, CPU time (user + system, from ``wait4``) and peak RSS per command, and the median of
``fleetctl --version``-free anchors:

* ``python -c pass`` (the interpreter's own floor);
* ``fleet-agent --help`` (the agent's CLI: same typer/pydantic stack, no controller imports);
* ``fleetctl --help``, ``fleetctl runs``, ``fleetctl status RUN`` (a running run of 3 modules
  on the embedded broker, in a scratch history).

Goals (issue 18): ``--help`` <= 0.3 s, ``runs`` and ``status`` <= 0.5 s (median wall); exits 1
when one is missed.

Bytecode: an installed package runs from its ``.pyc`` files (pip writes them at install, ``make
install`` too: ``uv pip sync --compile-bytecode``; Python writes the missing ones on first
import). The commands run with ``PYTHONDONTWRITEBYTECODE`` removed from their environment, so
the warm-up run writes any that are missing, as a first run after an install would.
``--without-bytecode`` measures the other case, every module compiled from source at every
start (a ``PYTHONPYCACHEPREFIX`` with no files in it, and ``PYTHONDONTWRITEBYTECODE=1``): what a
read-only install without ``.pyc`` files costs.

Usage: .venv/bin/python bench/cli.py [--rounds 7] [--without-bytecode]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BIN = Path(sys.executable).parent
GOALS = {"fleetctl --help": 0.3, "fleetctl runs": 0.5, "fleetctl status": 0.5}


def run_once(argv: list[str], env: dict[str, str]) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS MiB) of one process."""
    t = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(argv)}: exit {proc.returncode}: {err.strip()[-300:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def scratch(home: Path, *, bytecode: bool = True) -> tuple[dict[str, str], str]:
    """Environment of an embedded-broker controller in ``home`` with one running run; its id.
    ``bytecode``: the commands use (and write) ``.pyc`` files; else every module compiles from source."""
    from controller.history import History

    inv = home / "inventory.toml"
    inv.write_text("".join(f'[[module]]\nname = "m{i}"\naddress = "127.0.0.1"\nuser = "u"\n\n' for i in range(3)))
    env = dict(os.environ, FLEET_DATA_DIR=str(home / "data"), FLEET_BROKER_URL="filesystem://",
               FLEET_INVENTORY=str(inv), FLEET_HISTORY=str(home / "history.sqlite"), COLUMNS="120")
    env.pop("FLEET_CONFIG", None)
    env.pop("PYTHONPYCACHEPREFIX", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if not bytecode:
        (home / "no-pycache").mkdir()
        env.update(PYTHONPYCACHEPREFIX=str(home / "no-pycache"), PYTHONDONTWRITEBYTECODE="1")
    h = History(home / "history.sqlite")
    run_id = "20261130-000000-bench"
    h.create_run(run_id, release="1.4.1", models=["qwen3"], modules=["m0", "m1", "m2"])
    h.close()
    return env, run_id


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7, help="runs of each command (median of these)")
    ap.add_argument("--without-bytecode", action="store_true",
                    help="every module compiled from source at every start (no .pyc files read or written)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as tmp:
        env, run_id = scratch(Path(tmp), bytecode=not args.without_bytecode)
        cmds = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "fleet-agent --help": [str(BIN / "fleet-agent"), "--help"],
            "fleetctl --help": [str(BIN / "fleetctl"), "--help"],
            "fleetctl runs": [str(BIN / "fleetctl"), "runs"],
            "fleetctl status": [str(BIN / "fleetctl"), "status", run_id],
        }
        for argv in cmds.values():  # warm the page cache and the .pyc files once
            run_once(argv, env)
        got: dict[str, list[tuple[float, float, float]]] = {k: [] for k in cmds}
        for _ in range(args.rounds):
            for k, argv in cmds.items():
                got[k].append(run_once(argv, env))
    floor = statistics.median(w for w, _, _ in got["python -c pass"])
    print(f"median [min-max] of {args.rounds} interleaved rounds; fresh process each; "
          + ("no bytecode: every module compiled from source" if args.without_bytecode else
             "bytecode (.pyc) as after an install"))
    print(f"{'command':22s} {'wall s':>22s} {'CPU s':>8s} {'peak RSS':>9s} {'- python':>9s}")
    missed = []
    for k, rows in got.items():
        walls = [w for w, _, _ in rows]
        wall = statistics.median(walls)
        cpu = statistics.median(c for _, c, _ in rows)
        rss = statistics.median(r for _, _, r in rows)
        goal = GOALS.get(k)
        mark = "" if goal is None else (f"  goal <= {goal} s: " + ("met" if wall <= goal else "NOT met"))
        if goal is not None and wall > goal:
            missed.append(k)
        print(f"{k:22s} {wall:7.3f} [{min(walls):.3f}-{max(walls):.3f}] {cpu:8.3f} {rss:6.0f} MiB "
              f"{wall - floor:+8.3f}{mark}")
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(main())
