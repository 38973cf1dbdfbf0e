"""Benchmark: start-up of ``fleetctl`` verbs, next to ``python -c pass`` in the same run.

Each command runs as a fresh process (as a user or a farm script types it), rounds interleaved
so that load on the machine hits every command alike; prints the median and spread of wall
time, CPU time (user + system, from ``wait4``) and peak RSS per command, and the median of
``fleetctl --version``-free anchors:

* ``python -c pass`` (the interpreter's own floor);
* ``fleet-agent --help`` (the agent's CLI: same typer/pydantic stack, no controller imports);
* ``fleetctl --help``, ``fleetctl version``, ``fleetctl runs``, ``fleetctl status RUN`` (a running run
  of 3 modules on the embedded broker, in a scratch history), ``fleetctl devices`` (3 modules);
* ``fleetctl runs, ended``: ``runs`` of a history whose runs all ended (the broker is read only for a run
  the history holds as running);
* ``fleetctl status ENDED``: an ended run of 3 modules whose verdict was recorded when it was judged
  (shown as recorded: no report is built again, nothing read from the broker).

Goals (issue 18): ``--help`` <= 0.3 s, ``runs`` and ``status`` <= 0.5 s (median wall); (issue 47)
``version`` and ``runs, ended`` at most 2x the CPU of ``--help`` (the ``x help`` column: each command's
median CPU over ``--help``'s, same run); exits 1 when one is missed.

Bytecode: an installed package runs from its ``.pyc`` files (pip writes them at install, ``make
install`` too: ``uv pip sync --compile-bytecode``; Python writes the missing ones on first
import). The commands run with ``PYTHONDONTWRITEBYTECODE`` removed from their environment, so
the warm-up run writes any that are missing, as a first run after an install would; without
them every start compiles each module it imports from source (``fleetctl status``: about twice
the CPU time here).

Usage: .venv/bin/python bench/cli.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import record  # noqa: E402 - bench/record.py, this script's folder
from bench.spawn import spawn  # noqa: E402 - bench/spawn.py

BIN = Path(sys.executable).parent
GOALS = {"fleetctl --help": 0.3, "fleetctl runs": 0.5, "fleetctl status": 0.5, "fleetctl status ended": 0.5}
CPU_GOALS = {"fleetctl version": 2.0, "fleetctl runs, ended": 2.0}  # x the CPU of fleetctl --help (issue 47)


def run_once(argv: list[str], env: dict[str, str]) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS MiB) of one process."""
    s = spawn(argv, env=env).check((0, 1))
    return s.wall_s, s.cpu_s, s.peak_mib


def scratch(home: Path) -> tuple[dict[str, str], str, str]:
    """Environment of an embedded-broker controller in ``home`` with one running run and one ended,
    judged run; their ids (the commands read and write ``.pyc`` files, as an installed fleetctl does)."""
    from contract.records import RunProgress, RunState
    from controller.history import History

    inv = home / "inventory.toml"
    inv.write_text("".join(f'[[module]]\nname = "m{i}"\nhost = "127.0.0.1"\nssh_user = "u"\n\n' for i in range(3)))
    # FLEET_LOST_AFTER: the run stays running however long the bench takes (a module given up would end
    # it, and status of an ended run builds the report: another command)
    env = dict(os.environ, FLEET_DATA_DIR=str(home / "data"), FLEET_BROKER_URL="filesystem://",
               FLEET_INVENTORY=str(inv), FLEET_HISTORY=str(home / "history.sqlite"), COLUMNS="120",
               FLEET_LOST_AFTER="86400")
    env.pop("FLEET_CONFIG", None)
    env.pop("PYTHONPYCACHEPREFIX", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    h = History(home / "history.sqlite")
    run_id = "20261130-000000-bench"
    h.create_run(run_id, release="1.4.1", models=["qwen3"], modules=["m0", "m1", "m2"])
    ended = "20261130-000000-ended"
    h.create_run(ended, release="1.4.1", models=["qwen3"], modules=["m0", "m1", "m2"])
    now = time.time()
    h.upsert_progress_many(RunProgress(run_id=ended, module=m, release="1.4.1", state=RunState.DONE, step="done",
                                       keys_total=1, keys_done=1, updated_at=now, started_at=now - 5,
                                       finished_at=now) for m in ("m0", "m1", "m2"))
    h.set_run_state(ended, "done", verdict="pass", line=f"PASS {ended} (1.4.1 vs baseline:1.4.1:v1)")
    h.close()
    # a second history holding the ended run only: ``fleetctl runs`` with no run running reads no broker
    import shutil

    shutil.copy(home / "history.sqlite", home / "ended.sqlite")
    h = History(home / "ended.sqlite")
    h.conn.execute("DELETE FROM runs WHERE run_id = ?", (run_id,))
    h.conn.commit()
    h.close()
    return env, run_id, ended


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7, help="runs of each command (median of these)")
    args = ap.parse_args()
    load = os.getloadavg()  # wall time on a busy machine: compare the CPU column too
    with tempfile.TemporaryDirectory(prefix="bench-cli-") as tmp:
        env, run_id, ended = scratch(Path(tmp))
        cmds = {
            "python -c pass": [sys.executable, "-c", "pass"],
            "fleet-agent --help": [str(BIN / "fleet-agent"), "--help"],
            "fleetctl --help": [str(BIN / "fleetctl"), "--help"],
            "fleetctl version": [str(BIN / "fleetctl"), "version"],
            "fleetctl runs": [str(BIN / "fleetctl"), "runs"],
            "fleetctl runs, ended": [str(BIN / "fleetctl"), "--history", str(Path(tmp) / "ended.sqlite"), "runs"],
            "fleetctl status": [str(BIN / "fleetctl"), "status", run_id],
            "fleetctl status ended": [str(BIN / "fleetctl"), "status", ended],
            "fleetctl devices": [str(BIN / "fleetctl"), "devices"],
        }
        for argv in cmds.values():  # warm the page cache and the .pyc files once
            run_once(argv, env)
        got: dict[str, list[tuple[float, float, float]]] = {k: [] for k in cmds}
        for _ in range(args.rounds):
            for k, argv in cmds.items():
                got[k].append(run_once(argv, env))
    floor = statistics.median(w for w, _, _ in got["python -c pass"])
    help_cpu = statistics.median(c for _, c, _ in got["fleetctl --help"])
    print(f"median [min-max] of {args.rounds} interleaved rounds; fresh process each, .pyc as after an install; "
          f"load average {load[0]:.1f} before, {os.getloadavg()[0]:.1f} after, {os.cpu_count()} CPUs")
    print(f"{'command':22s} {'wall s':>22s} {'CPU s':>8s} {'x help':>7s} {'peak RSS':>9s} {'- python':>9s}")
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
        ratio = cpu / help_cpu
        cgoal = CPU_GOALS.get(k)
        if cgoal is not None:
            mark += f"  goal CPU <= {cgoal:g}x help: " + ("met" if ratio <= cgoal else "NOT met")
            if ratio > cgoal:
                missed.append(k)
        print(f"{k:22s} {wall:7.3f} [{min(walls):.3f}-{max(walls):.3f}] {cpu:8.3f} {ratio:6.2f}x {rss:6.0f} MiB "
              f"{wall - floor:+8.3f}{mark}")
    return 1 if missed else 0


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
