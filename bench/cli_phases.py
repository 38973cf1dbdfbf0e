"""Benchmark: where ``fleetctl runs`` spends its CPU beyond ``fleetctl --help``, phase by phase, per virtualenv.

Each command runs as a fresh process (rounds interleaved) under a small harness that reads the process's CPU
time (``getrusage``) at: the interpreter's start, ``controller.cli.app`` imported, the verb entered (typer has
parsed the options: typer 0.2x builds a pydantic ``TypeAdapter`` per parameter), the session opened (settings,
inventory, history), the table written (rich), exit. ``--venv`` may name several virtualenvs holding this
project (e.g. one with another typer), compared side by side in one run. Prints the median of each phase and
``runs``' CPU over ``--help``'s (issue 47's figure, also measured by ``bench/cli.py``).

Usage: .venv/bin/python bench/cli_phases.py [--rounds 7] [--venv .venv --venv /tmp/other]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import record  # noqa: E402 - bench/record.py, this script's folder

HARNESS = r"""
import atexit, json, resource, sys
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return (r.ru_utime + r.ru_stime) * 1000
marks = [("start", cpu())]
def report():
    sys.stderr.write("PHASES " + json.dumps(dict(marks + [("exit", cpu())])) + "\n")
atexit.register(report)
import controller.cli.app as app
marks.append(("app imported", cpu()))
import controller.cli.runs as runs
_session, _emit = runs.session, runs.emit
def session(ctx):
    marks.append(("verb entered", cpu()))
    s = _session(ctx)
    marks.append(("session opened", cpu()))
    return s
def emit(*a, **k):
    _emit(*a, **k)
    marks.append(("table written", cpu()))
runs.session, runs.emit = session, emit
sys.argv = ["fleetctl", *sys.argv[1:]]
app.main()
"""
PHASES = ("start", "app imported", "verb entered", "session opened", "table written", "exit")


def once(python: str, argv: list[str], env: dict[str, str]) -> dict[str, float]:
    proc = subprocess.run([python, "-c", HARNESS, *argv], env=env, capture_output=True, text=True, timeout=120)
    line = next((x for x in proc.stderr.splitlines() if x.startswith("PHASES ")), None)
    if proc.returncode or line is None:
        raise SystemExit(f"{python} fleetctl {' '.join(argv)}: exit {proc.returncode}: {proc.stderr[-500:]}")
    return {k: float(v) for k, v in json.loads(line[7:]).items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--venv", action="append", help="a virtualenv holding this project (repeatable; default .venv)")
    args = ap.parse_args()
    venvs = args.venv or [str(ROOT / ".venv")]
    with tempfile.TemporaryDirectory(prefix="bench-cli-phases-") as tmp:
        from bench.cli import scratch  # bench/cli.py's scratch history: one running run, one ended (judged) run

        env, _, _ = scratch(Path(tmp))
        env["PYTHONPATH"] = str(ROOT)
        cmds = {"--help": ["--help"], "runs, ended": ["--history", str(Path(tmp) / "ended.sqlite"), "runs"]}
        got: dict[tuple[str, str], list[dict[str, float]]] = {(v, c): [] for v in venvs for c in cmds}
        for (v, c) in got:
            once(str(Path(v) / "bin" / "python"), cmds[c], env)  # .pyc files and page cache warm
        load = os.getloadavg()[0]
        t = time.time()
        for _ in range(args.rounds):
            for (v, c) in got:
                got[(v, c)].append(once(str(Path(v) / "bin" / "python"), cmds[c], env))
    print(f"median of {args.rounds} interleaved rounds (CPU ms, cumulative at each phase); load average {load:.1f} "
          f"before, {os.getloadavg()[0]:.1f} after ({time.time() - t:.0f} s), {os.cpu_count()} CPUs")
    for v in venvs:
        python = str(Path(v) / "bin" / "python")
        typer_version = subprocess.run([python, "-c", "import typer; print(typer.__version__)"],
                                       capture_output=True, text=True).stdout.strip()
        print(f"\n{v} (typer {typer_version})")
        print(f"{'command':14s} " + " ".join(f"{p:>15s}" for p in PHASES))
        totals = {}
        for c in cmds:
            rows = got[(v, c)]
            med = {p: statistics.median([r[p] for r in rows]) for p in PHASES if all(p in r for r in rows)}
            totals[c] = med["exit"]
            print(f"{c:14s} " + " ".join(f"{med[p]:15.1f}" if p in med else f"{'-':>15s}" for p in PHASES))
        print(f"runs, ended: {totals['runs, ended'] / totals['--help']:.2f}x the CPU of --help "
              f"({totals['runs, ended']:.0f} ms vs {totals['--help']:.0f} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
