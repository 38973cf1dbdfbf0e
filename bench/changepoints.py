"""Benchmark: the change-point detector on series with planted shifts, and candidate detectors side by side.

Series (``controller.report.synth.planted_series``): ``--n`` releases (default 30) of a level times
multiplicative normal noise (1, 2, 3 %), two outliers off by ±15 % (never the first or last release), a
level shift of 2-20 % planted at a seeded release in the middle half (or none). Printed per detector:

* detection rate per shift size and noise: a change point within one release of the planted one, in its
  direction (``--seeds`` seeds a cell); a change point in its direction anywhere (the gap between the two is
  where the step was placed more than one release off); how many seeds reported more than one change point;
* false-positive rate: seeds of no-shift series (``--null-seeds``, default 1,000 per noise level) with any
  change point;
* the seconds the detector took over all of it;
* first, the ceiling of "within one release" on the same series: the least-squares place of the one change each
  is known to have (no test): what no detector that must also decide whether there is a change can beat.

Candidates, all pruned and judged by the same rule (``changepoints.prune``: Welch t-test against the
neighbouring segments, Bonferroni over the positions, ``max_pvalue`` and ``min_magnitude``), so they differ
only in where they look:

* ``binseg`` (the detector, ``changepoints.locate``): binary segmentation on the squared-error cost;
* ``pelt`` (``ruptures.Pelt``, l2 cost, ``min_size`` = the detector's, ``jump=1``, penalty ``3 sigma^2 log n``
  with sigma from the median absolute difference of neighbours): measured when ruptures is importable
  (``uv pip install ruptures`` into a scratch venv; it is not a dependency of the project);
* ``pelt+binseg``: the union of both candidate sets.

``--batch 1210 --n 100 [--repeat 5] [--shift-every 10]`` instead times the analysis of that many series as a
trend over a history has them (one per model key, profile, metric and scope; 1 in 10, or 1 in ``--shift-every``,
with a planted shift of 3-20 % up or down; 2 % noise, two outliers each): ``analyse_series`` of each, one at a
time, against ``changepoints_batch.analyse_many`` of all, interleaved round by round, and compares their
Detections (exits 1 on a difference).

Usage: .venv/bin/python bench/changepoints.py [--seeds 200] [--null-seeds 1000] [--n 30]
       [--batch N [--repeat R] [--shift-every K]]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import record  # noqa: E402 - bench/record.py, this script's folder

from controller.report.analysis.changepoints import DetectorSettings, hampel, locate, prune  # noqa: E402
from controller.report.synth import planted_series  # noqa: E402

SHIFTS = (0.02, 0.03, 0.05, 0.07, 0.10, 0.15, 0.20)
NOISES = (0.01, 0.02, 0.03)
Locate = Callable[[np.ndarray, DetectorSettings], list[int]]


def _pelt(x: np.ndarray, s: DetectorSettings) -> list[int]:
    import ruptures

    sigma = float(np.median(np.abs(np.diff(x)))) / (0.6745 * math.sqrt(2)) or 1e-9
    bkps = ruptures.Pelt(model="l2", min_size=s.min_segment, jump=1).fit(x).predict(pen=3 * sigma**2 * math.log(len(x)))
    return [int(b) for b in bkps[:-1]]


def candidates() -> dict[str, Locate]:
    out: dict[str, Locate] = {"binseg": lambda x, s: locate(x, s)}
    try:
        import ruptures  # noqa: F401
    except ImportError:
        print("ruptures not importable: pelt not measured")
        return out
    out["pelt"] = _pelt
    out["pelt+binseg"] = lambda x, s: sorted(set(_pelt(x, s)) | set(locate(x, s)))
    return out


def oracle_table(seeds: int, n: int, s: DetectorSettings) -> None:
    """The ceiling of "within one release": the least-squares place of the one change each series is known to
    have (the best split of the Hampel-cleaned series, segments of ``min_segment`` or more), no test at all. No
    detector that must also decide whether there is a change places it better on these series."""
    print("\n## oracle (one change known to exist, least-squares place): within one release\n")
    print("| shift | " + " | ".join(f"noise {nz:.0%}" for nz in NOISES) + " |")
    print("| ---: |" + " ---: |" * len(NOISES))
    m = s.min_segment
    for shift in SHIFTS:
        cells = []
        for nz in NOISES:
            hit = 0
            for seed in range(seeds):
                x, at = planted_series(seed, n=n, shift=-shift, noise=nz)
                x = hampel(x, s.outlier_sigmas)[0]
                c = np.cumsum(x)
                k = np.arange(m, n - m + 1)
                gain = (c[k - 1] - k * c[-1] / n) ** 2 / (k * (n - k))
                hit += abs(int(k[np.argmax(gain)]) - at) <= 1
            cells.append(f"{hit / seeds:.1%}")
        print(f"| {shift:.0%} | " + " | ".join(cells) + " |")


def batch(count: int, n: int, repeat: int, every: int, s: DetectorSettings) -> int:
    """``analyse_series`` of each of ``count`` series against ``analyse_many`` of all, interleaved, compared."""
    from controller.report.analysis.changepoints import analyse_series
    from controller.report.analysis.changepoints_batch import analyse_many

    sizes = (0.03, 0.05, 0.07, 0.10, 0.15, 0.20)
    series = [planted_series(seed, n=n, noise=0.02, shift=0.0 if seed % every else
                             sizes[seed // every % 6] * (-1) ** (seed // every))[0] for seed in range(count)]
    print(f"settings: {s}; {count} series of {n} releases, 1 in {every} with a shift of 3-20 %, 2 % noise, "
          "2 outliers")
    analyse_many(series[:10], s)  # imports and scipy loaded, untimed
    times: dict[str, list[float]] = {"one at a time": [], "all at once": []}
    same = True
    for _ in range(repeat):
        t0 = time.perf_counter()
        one = [analyse_series(x, s) for x in series]
        t1 = time.perf_counter()
        many = analyse_many(series, s)
        t2 = time.perf_counter()
        times["one at a time"].append(t1 - t0)
        times["all at once"].append(t2 - t1)
        same &= one == many
    found = sum(len(d.change_points) for d in one)
    print(f"{found} change points, {sum(len(d.outliers) for d in one)} outliers; {repeat} interleaved rounds, "
          "median [min-max]")
    for name, ts in times.items():
        print(f"| {name} | {np.median(ts):.3f} s [{min(ts):.3f}-{max(ts):.3f}] |")
    print(f"all at once / one at a time: {np.median(times['all at once']) / np.median(times['one at a time']):.3f}x; "
          f"Detections {'identical' if same else 'DIFFERENT'}")
    return 0 if same else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=200, help="seeds per (shift, noise) cell")
    ap.add_argument("--null-seeds", type=int, default=1000, help="no-shift seeds per noise level")
    ap.add_argument("--n", type=int, default=30, help="releases per series")
    ap.add_argument("--max-pvalue", type=float, default=None, help="the detector's setting (default: its default)")
    ap.add_argument("--min-magnitude", type=float, default=None, help="the detector's setting (default: its default)")
    ap.add_argument("--permutations", type=int, default=None, help="the detector's setting (default: its default)")
    ap.add_argument("--batch", type=int, default=0, help="time the analysis of this many series, one by one and "
                    "all at once")
    ap.add_argument("--repeat", type=int, default=5, help="--batch: rounds")
    ap.add_argument("--shift-every", type=int, default=10, help="--batch: 1 series in this many has a shift")
    a = ap.parse_args()
    given = {"max_pvalue": a.max_pvalue, "min_magnitude": a.min_magnitude, "permutations": a.permutations}
    s = DetectorSettings(**{k: v for k, v in given.items() if v is not None})
    if a.batch:
        return batch(a.batch, a.n, a.repeat, a.shift_every, s)
    print(f"settings: {s}; {a.n} releases, 2 outliers of ±15 %, shift planted in the middle half")
    oracle_table(a.seeds, a.n, s)
    for name, loc in candidates().items():
        t0 = time.perf_counter()
        print(f"\n## {name}\n")
        print("detection: found within one release, right direction | found anywhere, right direction | more "
              "than one change point")
        print("| shift | " + " | ".join(f"noise {nz:.0%} | anywhere | >1" for nz in NOISES) + " |")
        print("| ---: |" + " ---: |" * 3 * len(NOISES))
        worst_5 = 1.0
        for shift in SHIFTS:
            cells = []
            for nz in NOISES:
                hit = anywhere = extra = 0
                for seed in range(a.seeds):
                    x, at = planted_series(seed, n=a.n, shift=-shift, noise=nz)
                    x = hampel(x, s.outlier_sigmas)[0]
                    cps = prune(x, loc(x, s), s)
                    hit += any(abs(c.index - at) <= 1 and c.size < 0 for c in cps)
                    anywhere += any(c.size < 0 for c in cps)
                    extra += len(cps) > 1
                rate = hit / a.seeds
                if shift >= 0.05:
                    worst_5 = min(worst_5, rate)
                cells.append(f"{rate:.1%} | {anywhere / a.seeds:.1%} | {extra}")
            print(f"| {shift:.0%} | " + " | ".join(cells) + " |")
        fps = []
        for nz in NOISES:
            fp = 0
            for seed in range(a.null_seeds):
                x, _ = planted_series(10**6 + seed, n=a.n, shift=0.0, noise=nz)
                x = hampel(x, s.outlier_sigmas)[0]
                fp += bool(prune(x, loc(x, s), s))
            fps.append(fp)
        print("\nfalse positives (no-shift seeds with a change point): " +
              ", ".join(f"noise {nz:.0%}: {fp} of {a.null_seeds}" for nz, fp in zip(NOISES, fps, strict=True)))
        print(f"worst detection rate of a shift >= 5 %: {worst_5:.1%}; "
              f"worst false-positive rate: {max(fps) / a.null_seeds:.2%}; {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
