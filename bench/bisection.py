"""Benchmark: ``fleetctl bisect``'s rounds with 1, 2, 4 and 8 modules, and (``--real``) the wall time of a real
bisection on a simulated fleet of 1 and of 4 modules side by side.

* **Rounds** (the planner, :mod:`controller.service.bisect_plan`, with an oracle that never errs): for series of
  ``--releases`` releases (default 16, 32, 64) and every position of the first bad release, the rounds the k-ary
  rounds take with k modules: minimum, mean, maximum, next to ``ceil(log_(k+1)(n - 1))``. Re-measures are not
  rounds (they run within their round; ``--real`` counts them).
* **Wall time** (``--real``): a series of 16 simulated nightly releases (``simulator.series``, a decode regression
  of 8 % planted at a seeded release, 1 % noise, time scale 200 or ``--time-scale``), ``fleetctl bisect --models
  qwen3`` on a lab of 4 modules and then of 1 module (real Celery workers, the embedded broker): rounds, re-runs,
  waves, runs, wall time, and the ratio of the two wall times (one run, the same machine).

Usage: .venv/bin/python bench/bisection.py [--releases 16,32,64] [--real] [--regress-at 10]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import record  # noqa: E402 - bench/record.py, this script's folder
from controller.service.bisect_plan import bounds, next_probes  # noqa: E402

MODULES = (1, 2, 4, 8)


def rounds_for(n: int, first_bad: int, k: int) -> int:
    calls: list = [None] * n
    calls[0], calls[-1] = "good", "bad"
    rounds = 0
    while not bounds(calls).done:
        for p in next_probes(calls, k):
            calls[p] = "bad" if p >= first_bad else "good"
        rounds += 1
    assert bounds(calls).bad == first_bad
    return rounds


def planner_table(sizes: list[int]) -> None:
    print("rounds of the k-ary bisection (planner, every position of the first bad release)")
    print(f"{'releases':>8} {'modules':>7} {'min':>4} {'mean':>5} {'max':>4} {'ceil log_(k+1)(n-1)':>20}")
    for n in sizes:
        for k in MODULES:
            r = [rounds_for(n, fb, k) for fb in range(1, n)]
            bound = math.ceil(math.log(n - 1) / math.log(k + 1))
            print(f"{n:>8} {k:>7} {min(r):>4} {statistics.mean(r):>5.2f} {max(r):>4} {bound:>20}")


def real(regress_at: int, scale: float) -> int:
    from simulator.series import build_series
    from tests.support.lab import make_lab

    with tempfile.TemporaryDirectory(prefix="bench-bisect-") as tmp:
        base = Path(tmp)
        series = build_series(base / "releases", count=16, regress_at=regress_at, regress="qwen3:decode_tps:0.08",
                              noise=0.01, time_scale=scale, seed=11)
        print(f"\nreal bisection: 16 releases, decode -8 % planted at {series[regress_at].version} "
              f"(index {regress_at}), qwen3, time scale {scale:g}; waves: runs dispatched together and waited for (the "
              "two references, each round, each re-run within a round)")
        print(f"{'modules':>7} {'rounds':>6} {'re-runs':>7} {'waves':>5} {'runs':>4} {'wall s':>7}  answer")
        walls = {}
        for k in (4, 1):
            lab = make_lab(base / f"lab{k}", ("filesystem://", None), k)
            lab.start()
            try:
                t = time.monotonic()
                r = lab.fleetctl("bisect", "--good", series[0].version, "--bad", series[-1].version, "--releases",
                                 str(base / "releases"), "--models", "qwen3", "-o", "json", timeout=1800)
                walls[k] = time.monotonic() - t
            finally:
                lab.stop()
            if r.returncode != 0:
                print(f"{k:>7} failed: {r.stderr.strip()[-400:]}")
                return 1
            doc = json.loads(r.stdout)
            ok = "right" if doc["first_bad"] == series[regress_at].version else "WRONG"
            waves = 2 + len({(e["round"], e["outcome"].endswith("(again)")) for e in doc["evidence"]})
            print(f"{k:>7} {doc['rounds']:>6} {doc['again']:>7} {waves:>5} {len(doc['evidence']) + 2:>4} "
                  f"{walls[k]:>7.1f}  {doc['first_bad']} ({ok})")
        print(f"wall time, 4 modules / 1 module: {walls[4] / walls[1]:.2f}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--releases", default="16,32,64", help="series lengths for the planner's table")
    ap.add_argument("--real", action="store_true", help="also bisect on simulated labs of 4 and 1 modules")
    ap.add_argument("--regress-at", type=int, default=10)
    ap.add_argument("--time-scale", type=float, default=200.0, help="the simulated releases' (--real)")
    args = ap.parse_args()
    planner_table([int(x) for x in args.releases.split(",")])
    return real(args.regress_at, args.time_scale) if args.real else 0


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
