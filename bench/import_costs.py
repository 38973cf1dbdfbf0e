"""Benchmark: what importing each third-party library costs a fresh process, beside ``python -c pass``.

The product imports these inside functions (``tests/unit/test_code_prose.py``'s ``LAZY_LIBRARIES``; ADR 0059)
so that a verb or an idle agent that does not use one does not pay for it. Each import runs in a fresh
process, rounds interleaved so that load hits each alike; prints the median CPU (user + system, from
``wait4``) and peak RSS over the interpreter's floor. A library missing from this environment says so.

Usage: .venv/bin/python bench/import_costs.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
from bench import record  # bench/record.py, this script's folder
from bench.spawn import spawn  # bench/spawn.py

LIBRARIES = (
    "pandas", "pyarrow", "numpy", "scipy.special", "celery.app.base", "kombu.connection", "redis", "fastapi",
    "starlette.applications", "uvicorn", "psycopg", "psycopg_pool", "paramiko", "fabric", "jinja2", "rich.console",
    "rich.table", "prometheus_client", "tokenizers", "transformers", "psutil", "httpx", "matplotlib.pyplot", "pynvml",
    "pydantic",
)


def once(code: str) -> tuple[float, float]:
    s = spawn([sys.executable, "-c", code]).check()
    return s.cpu_s, s.peak_mib


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    present = [lib for lib in LIBRARIES if importlib.util.find_spec(lib.split(".")[0]) is not None]
    codes = {"python -c pass": "pass", **{lib: f"import {lib}" for lib in present}}
    got: dict[str, list[tuple[float, float]]] = {k: [] for k in codes}
    for code in codes.values():
        once(code)  # page cache and .pyc files warm
    for _ in range(args.rounds):
        for k, code in codes.items():
            got[k].append(once(code))
    cpu0 = statistics.median(c for c, _ in got["python -c pass"])
    rss0 = statistics.median(r for _, r in got["python -c pass"])
    print(f"median of {args.rounds} interleaved rounds, fresh process each; load average {os.getloadavg()[0]:.1f}, "
          f"{os.cpu_count()} CPUs; floor python -c pass: {cpu0 * 1000:.0f} ms CPU, {rss0:.0f} MiB")
    print(f"{'import':22s} {'CPU ms over floor':>18s} {'RSS MiB over floor':>19s}")
    for k in present:
        cpu = statistics.median(c for c, _ in got[k]) - cpu0
        rss = statistics.median(r for _, r in got[k]) - rss0
        print(f"{k:22s} {cpu * 1000:18.0f} {rss:19.1f}")
    for lib in LIBRARIES:
        if lib not in present:
            print(f"{lib:22s} {'not installed here':>18s}")
    return 0


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
