"""Benchmark: ``fleetctl --help`` and ``fleetctl version`` from this tree against the same from an earlier commit,
side by side in one run (issue 50: a change to how the command tree is built must not make ``--help`` slower).

The earlier commit's ``agent``, ``contract`` and ``controller`` are exported (``git archive``) into a scratch
folder; each command runs as a fresh process of this venv's Python with that folder (or this tree) first on
``sys.path``, calling ``controller.cli.app.main`` as the ``fleetctl`` script does, rounds interleaved so that the
machine's load hits both alike; a warm-up round writes each tree's ``.pyc`` files first. Prints the median wall
and CPU time (user + system, from ``wait4``) per command and tree, the ratio this tree / the earlier one, and how
many modules each tree's ``--help`` imports.

Usage: .venv/bin/python bench/cli_tree.py [--base COMMIT] [--rounds 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import record  # noqa: E402 - bench/record.py, this script's folder
from bench.spawn import spawn  # noqa: E402 - bench/spawn.py

LAUNCH = "import sys; sys.path.insert(0, sys.argv[1]); from controller.cli.app import main; main(sys.argv[2:])"
COUNT = ("import sys; sys.path.insert(0, sys.argv[1]); import io, contextlib\n"
         "from controller.cli.app import run\n"
         "with contextlib.redirect_stdout(io.StringIO()): run(['--help'])\n"
         "print(len(sys.modules))")
COMMANDS = {"fleetctl --help": ["--help"], "fleetctl version": ["version"]}


def run_once(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall s, CPU s) of one process."""
    s = spawn(argv, env=env).check()
    return s.wall_s, s.cpu_s


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="HEAD~3", help="the earlier commit (default HEAD~3)")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    base_rev = subprocess.run(["git", "rev-parse", "--short", args.base], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX")}
    env["COLUMNS"] = "120"
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        base.mkdir()
        archive = subprocess.run(["git", "archive", base_rev, "agent", "contract", "controller"], cwd=ROOT,
                                 capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive, check=True)
        trees = {f"base {base_rev}": str(base), "this tree": str(ROOT)}
        for path in trees.values():  # warm-up: each tree's .pyc written, as an installed fleetctl has them
            for cmd in COMMANDS.values():
                run_once([sys.executable, "-c", LAUNCH, path, *cmd], env)
        got: dict[tuple[str, str], list[tuple[float, float]]] = {(c, t): [] for c in COMMANDS for t in trees}
        for _ in range(args.rounds):
            for name, cmd in COMMANDS.items():
                for tree, path in trees.items():
                    got[(name, tree)].append(run_once([sys.executable, "-c", LAUNCH, path, *cmd], env))
        modules = {tree: subprocess.run([sys.executable, "-c", COUNT, path], env=env, capture_output=True,
                                        text=True, check=True).stdout.strip() for tree, path in trees.items()}
    print(f"{args.rounds} rounds, interleaved; load {os.getloadavg()[0]:.1f}")
    print(f"{'command':18} {'tree':16} {'wall s':>8} {'CPU s':>8}")
    for name in COMMANDS:
        cpu = {}
        for tree in trees:
            walls, cpus = zip(*got[(name, tree)], strict=True)
            cpu[tree] = statistics.median(cpus)
            print(f"{name:18} {tree:16} {statistics.median(walls):8.3f} {cpu[tree]:8.3f}")
        a, b = (cpu[t] for t in trees)
        print(f"{name:18} {'this / base':16} {'':8} {b / a:7.2f}x")
    for tree, n in modules.items():
        print(f"modules imported by --help, {tree}: {n}")
    return 0


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
