"""Benchmark: what ``controller/report/analysis/nulls.py`` saves, and why it calls one private scipy function.

1. The import of ``scipy.special`` (what nulls.py imports) against ``scipy.stats`` (what it stands in for), each
   in a fresh process after numpy, rounds interleaved: median CPU and wall, and their difference, which every
   ``fleetctl report`` / ``compare`` start pays or not.
2. The binomial tails: ``scipy.stats.binom.sf``/``cdf`` run Boost's ``_binom_sf``/``_binom_cdf`` (in the private
   ``scipy.special._ufuncs``); the public ``bdtrc``/``bdtr`` run Cephes'. The largest difference over 100,000
   random (k, n, p) says whether the public ones would give the report the same floats (ADR 0054).

Usage: .venv/bin/python bench/nulls_import.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import record  # bench/record.py, this script's folder
from bench.spawn import spawn  # bench/spawn.py

IMPORTS = {"scipy.special": "import numpy; import scipy.special", "scipy.stats": "import numpy; import scipy.stats",
           "numpy alone": "import numpy"}


def once(code: str) -> tuple[float, float]:
    s = spawn([sys.executable, "-c", code]).check()
    return s.wall_s, s.cpu_s


def tails() -> None:
    import numpy as np
    from scipy import stats
    from scipy.special import _ufuncs, bdtr, bdtrc

    rng = np.random.default_rng(1)
    n = rng.integers(1, 200, 100_000)
    k = np.floor(rng.random(100_000) * n)
    for p in (0.5, 0.3, 0.05):
        via_stats = stats.binom.sf(k, n, p)
        print(f"p={p}: binom.sf == _binom_sf: {np.array_equal(via_stats, _ufuncs._binom_sf(k, n, p))}; "
              f"binom.sf - bdtrc: max |diff| {np.abs(via_stats - bdtrc(k, n, p)).max():.3g}; "
              f"binom.cdf - bdtr: max |diff| {np.abs(stats.binom.cdf(k, n, p) - bdtr(k, n, p)).max():.3g}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    for code in IMPORTS.values():  # warm the page cache
        once(code)
    got: dict[str, list[tuple[float, float]]] = {k: [] for k in IMPORTS}
    for _ in range(args.rounds):
        for name, code in IMPORTS.items():
            got[name].append(once(code))
    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in got.items()}
    print(f"median of {args.rounds} interleaved rounds, fresh process each; load {os.getloadavg()[0]:.1f}")
    for name, (wall, cpu) in med.items():
        print(f"{name:14s} wall {wall:.3f} s  CPU {cpu:.3f} s")
    print(f"scipy.stats - scipy.special: CPU {med['scipy.stats'][1] - med['scipy.special'][1]:+.3f} s, "
          f"ratio {med['scipy.stats'][1] / med['scipy.special'][1]:.2f}x")
    tails()
    return 0


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
