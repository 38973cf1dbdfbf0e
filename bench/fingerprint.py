"""Benchmark: the environment fingerprint's cost, side by side in one run (docs/adr/0021-environment-fingerprint.md).

1. Storage: a history of RUNS runs x 6 modules x the seed's rows, each row carrying (a) the fingerprint's
   12-hex digest, the record stored once per run and module (what the history does), or (b) the whole record
   as JSON on every row. Prints the SQLite file sizes and the median time to read every row back (rounds
   interleaved), and their ratios.
2. Gathering, per run on a module: the versions snippet in a fresh ``python3`` next to ``python3 -c pass``
   (the interpreter's floor), and the simulated ``mthreads-gmi --query --json`` (rounds interleaved).

Goal: a run's probes under 0.5 s of wall time here (exits 1 when missed).

Usage: .venv/bin/python bench/fingerprint.py [--runs 20] [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.env_probe import VERSIONS_SNIPPET  # noqa: E402 - after the path
from agent.tables import parse_seed  # noqa: E402
from bench import record  # noqa: E402
from contract.fingerprint import EnvFingerprint  # noqa: E402
from controller.history import History  # noqa: E402
from simulator import DEVICE_TOOL_DIR  # noqa: E402

FP = EnvFingerprint(driver="3.3.5-server", firmware="4.3.41", musa="4.0.0", torch_musa="2.1.0", triton="3.1.0",
                    tilelang="0.1.6", kernel="5.15.0-91-generic", os="Ubuntu 22.04.4 LTS", agent="0.9.0",
                    release="1.4.1")


def _fill(path: Path, runs: int, inline: bool) -> int:
    seed = [r for rows in parse_seed((ROOT / "simulator/data/reference_tables.txt").read_text()).values()
            for r in rows]
    h = History(path)
    if inline:
        h.conn.execute('ALTER TABLE rows ADD COLUMN "env_record" TEXT')
    n = 0
    for i in range(runs):
        for m in range(6):
            rows = [r.model_copy(update={"run_id": f"run-{i}", "module": f"m{m}", "env_digest": None if inline
                                         else FP.digest()}) for r in seed]
            h.upsert_rows(rows)
            if inline:
                h.conn.execute('UPDATE rows SET env_record=? WHERE run_id=? AND module=?',
                               (FP.model_dump_json(), f"run-{i}", f"m{m}"))
            n += len(rows)
    h.close()
    return n


def _read(path: Path) -> float:
    conn = sqlite3.connect(path)
    t0 = time.perf_counter()
    conn.execute("SELECT * FROM rows").fetchall()
    dt = time.perf_counter() - t0
    conn.close()
    return dt


def _wall(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(argv, capture_output=True, check=True, env=env, timeout=60)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        paths = {"digest": Path(tmp) / "digest.sqlite", "inline": Path(tmp) / "inline.sqlite"}
        n = {k: _fill(p, args.runs, k == "inline") for k, p in paths.items()}
        sizes = {k: p.stat().st_size + (Path(str(p) + "-wal").stat().st_size if Path(str(p) + "-wal").exists()
                                         else 0) for k, p in paths.items()}
        reads: dict[str, list[float]] = {k: [] for k in paths}
        for _ in range(args.rounds):
            for k, p in paths.items():
                reads[k].append(_read(p))
    print(f"storage: {n['digest']} rows ({args.runs} runs x 6 modules x the seed's rows)")
    for k in paths:
        print(f"  {k:7s} {sizes[k] / 1e6:7.2f} MB   read all rows: median {statistics.median(reads[k]) * 1e3:7.1f} ms")
    print(f"  inline / digest: size {sizes['inline'] / sizes['digest']:.2f}x, read "
          f"{statistics.median(reads['inline']) / statistics.median(reads['digest']):.2f}x")

    env = {**os.environ}
    cmds = {"python3 -c pass": ["python3", "-c", "pass"],
            "versions snippet": ["python3", "-c", VERSIONS_SNIPPET],
            "mthreads-gmi --query --json (simulated)": [str(DEVICE_TOOL_DIR / "mthreads-gmi"), "--query", "--json"]}
    times: dict[str, list[float]] = {k: [] for k in cmds}
    for argv in cmds.values():  # warm-up
        _wall(argv, env)
    for _ in range(args.rounds):
        for k, argv in cmds.items():
            times[k].append(_wall(argv, env))
    print("gathering (median wall of a fresh process):")
    for k, t in times.items():
        print(f"  {k:42s} {statistics.median(t) * 1e3:7.1f} ms  (min {min(t) * 1e3:.1f}, max {max(t) * 1e3:.1f})")
    snippet, floor = statistics.median(times["versions snippet"]), statistics.median(times["python3 -c pass"])
    print(f"  snippet / python3 -c pass: {snippet / floor:.2f}x")
    total = snippet + statistics.median(times["mthreads-gmi --query --json (simulated)"])
    print(f"a run's probes: {total * 1e3:.0f} ms (goal < 500 ms): {'met' if total < 0.5 else 'MISSED'}")
    return 0 if total < 0.5 else 1


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
