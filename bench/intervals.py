"""Benchmark: which 95 % interval for a probe figure repeated N times, Student's t or a percentile bootstrap?

Simulates what a probe repeat gives: each repeat's figure is the p50 (or p90) of 10 requests whose times are
lognormal (sigma 1 %, 3 % and 10 %: a quiet module, a busy one, a server under load) with, per repeat, a shared
lognormal disturbance (sigma 2 %: the machine's load of that moment). For N = 3, 5, 10 repeats, 4,000 trials
each: how often each interval holds the true figure (the median of the repeats' distribution, itself measured
over 200,000 draws), and its mean width. Nominal: 0.95. Side by side in one run, the same draws for both.

Usage: .venv/bin/python bench/intervals.py [--trials 4000]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from agent.probe.intervals import t975
from bench import record


def figures(rng: np.random.Generator, shape: tuple[int, ...], sigma: float, q: float) -> np.ndarray:
    """A repeat's figure: the q-quantile of 10 requests, times the repeat's shared disturbance."""
    req = np.exp(rng.normal(0, sigma, (*shape, 10)))
    return np.quantile(req, q, axis=-1) * np.exp(rng.normal(0, 0.02, shape))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=4000)
    ap.add_argument("--resamples", type=int, default=1000)
    args = ap.parse_args()
    rng = np.random.default_rng(29)
    print("| figure | request sigma | N | t: coverage | t: mean width | bootstrap: coverage | bootstrap: mean width |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    worst_t, worst_b = 1.0, 1.0
    for q, name in ((0.5, "p50"), (0.9, "p90")):
        for sigma in (0.01, 0.03, 0.10):
            truth = float(np.mean(figures(rng, (200_000,), sigma, q)))  # the mean a repeat estimates
            for n in (3, 5, 10):
                x = figures(rng, (args.trials, n), sigma, q)
                mean, sd = x.mean(axis=1), x.std(axis=1, ddof=1)
                half = t975(n - 1) * sd / np.sqrt(n)
                t_cov = np.mean((mean - half <= truth) & (truth <= mean + half))
                idx = rng.integers(0, n, (args.trials, args.resamples, n))
                boot = np.take_along_axis(x[:, None, :], idx, axis=2).mean(axis=2)
                lo, hi = np.quantile(boot, 0.025, axis=1), np.quantile(boot, 0.975, axis=1)
                b_cov = np.mean((lo <= truth) & (truth <= hi))
                worst_t, worst_b = min(worst_t, t_cov), min(worst_b, b_cov)
                print(f"| {name} | {sigma:.0%} | {n} | {t_cov:.3f} | {np.mean(2 * half) / truth:.2%} | {b_cov:.3f} | "
                      f"{np.mean(hi - lo) / truth:.2%} |", flush=True)
    print(f"worst coverage (nominal 0.95): t {worst_t:.3f}, percentile bootstrap {worst_b:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
