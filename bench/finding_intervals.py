"""Benchmark: the 95 % intervals of the findings a verdict names (ADR 0018), exact order statistics against a
percentile bootstrap of the median, on synthetic fleets with a planted change.

Three findings, each planted in ``--seeds`` seeds (2 % noise per figure, ``controller.report.synth.fleet``):

* one profile, fleet-wide: prefill of one qwen3 profile 20 % slower on every one of 8 modules (the cell's fleet
  median over the modules, against the baseline);
* one module against its previous run: decode of qwen35_fq 15 % slower on one of 2 modules (the median over
  the key's profiles);
* an outlier: one of 6 modules 0.88x on every primary figure (the median of its deviations from the fleet).

For each: how often the report finds it, how often its interval (the report's own: the order statistics the
sign test does not reject) holds the planted change, its mean width, and the same for a percentile bootstrap of
the median (``--resamples`` resamples) over the same values, with the bootstrap's time per finding.

Usage: .venv/bin/python bench/finding_intervals.py [--seeds 1000] [--resamples 2000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from agent.tables import parse_seed
from bench import record
from controller.report import analyse
from controller.report.model import PRIMARY_METRICS
from controller.report.synth import fleet, rows_frame

KEY, PROFILE = "qwen3", "250:16000"


def bootstrap(x: np.ndarray, rng: np.random.Generator, resamples: int) -> tuple[float, float]:
    """Percentile bootstrap 95 % interval of the median of ``x`` (log ratios) as an interval of the ratio."""
    idx = rng.integers(0, len(x), (resamples, len(x)))
    med = np.median(x[idx], axis=1)
    lo, hi = np.quantile(med, [0.025, 0.975])
    return float(np.exp(lo)), float(np.exp(hi))


class Tally:
    def __init__(self, name: str, truth: float) -> None:
        self.name, self.truth = name, truth
        self.found = self.exact_held = self.boot_held = 0
        self.exact_width: list[float] = []
        self.boot_width: list[float] = []
        self.boot_s = 0.0

    def add(self, exact: tuple[float | None, float | None], boot: tuple[float, float], took: float) -> None:
        self.found += 1
        lo, hi = exact
        if lo is not None and hi is not None:
            self.exact_held += lo <= self.truth <= hi
            self.exact_width.append(hi - lo)
        self.boot_held += boot[0] <= self.truth <= boot[1]
        self.boot_width.append(boot[1] - boot[0])
        self.boot_s += took

    def row(self, seeds: int) -> str:
        f = max(self.found, 1)
        return (f"| {self.name} | {self.found} of {seeds} | {self.exact_held / f:.1%} | "
                f"{np.mean(self.exact_width):.2%} | {self.boot_held / f:.1%} | {np.mean(self.boot_width):.2%} | "
                f"{self.boot_s / f * 1000:.2f} ms |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=1000)
    ap.add_argument("--resamples", type=int, default=2000)
    args = ap.parse_args()
    seed_file = next(p for p in (Path(__file__).resolve().parents[2] / "shared" / "seeds" / "000_29a7ee896c0fa7ef.txt",
                                 Path(__file__).resolve().parents[1] / "simulator" / "data" / "reference_tables.txt")
                     if p.exists())
    ref = rows_frame([r for rs in parse_seed(seed_file.read_text(encoding="utf-8")).values() for r in rs])
    rng = np.random.default_rng(0)
    # the truths as ratios (value / reference) or factors; the report's change intervals are value / ref - 1
    prof, mod, out = Tally("one profile, 8 modules, 0.80", 0.80), Tally("a module vs its previous run, 0.85", 0.85), \
        Tally("an outlier, 6 modules, 0.88x", 0.88)
    t0 = time.perf_counter()
    for seed in range(args.seeds):
        cur = fleet(ref, modules=8, seed=1000 + seed)
        sel = (cur["model_key"] == KEY) & (cur["profile"] == PROFILE)
        cur.loc[sel, "prefill_tps"] *= 0.8
        cur.loc[sel, "ttft_ms"] /= 0.8
        rep = analyse(cur, baseline=ref, baseline_id="b")
        for r in rep.regressions:
            if (r.profile, r.metric) == (PROFILE, "prefill_tps"):
                base = float(ref.loc[(ref["model_key"] == KEY) & (ref["profile"] == PROFILE), "prefill_tps"].iloc[0])
                x = np.log(cur.loc[sel, "prefill_tps"].to_numpy(dtype=float) / base)
                t = time.perf_counter()
                boot = bootstrap(x, rng, args.resamples)
                prof.add((None if r.ci_low is None else 1 + r.ci_low, None if r.ci_high is None else 1 + r.ci_high),
                         boot, time.perf_counter() - t)
        prev = fleet(ref, modules=["a", "b"], seed=2000 + seed, run_id="p")
        cur = fleet(ref, modules=["a", "b"], seed=3000 + seed, run_id="c")
        sel = (cur["module"] == "b") & (cur["model_key"] == "qwen35_fq")
        cur.loc[sel, "decode_tps"] *= 0.85
        cur.loc[sel, "tpot_ms"] /= 0.85
        rep = analyse(cur, previous=prev)
        for r in rep.regressions:
            if (r.module, r.metric) == ("b", "decode_tps"):
                psel = (prev["module"] == "b") & (prev["model_key"] == "qwen35_fq")
                x = np.log(cur.loc[sel, "decode_tps"].to_numpy(dtype=float) / prev.loc[psel, "decode_tps"].to_numpy(
                    dtype=float))
                x = x[~np.isnan(x)]
                t = time.perf_counter()
                boot = bootstrap(x, rng, args.resamples)
                mod.add((None if r.ci_low is None else 1 + r.ci_low, None if r.ci_high is None else 1 + r.ci_high),
                        boot, time.perf_counter() - t)
        cur = fleet(ref, seed=4000 + seed)
        slow = cur["module"] == "m03"
        for m in PRIMARY_METRICS:
            cur.loc[slow, m] *= 0.88
        rep = analyse(cur, baseline=ref, baseline_id="b")
        for o in rep.outliers:
            if o.module == "m03":
                devs = []
                for m in PRIMARY_METRICS:  # the module's figure against the median of the others, per cell
                    logs = np.log(cur.pivot_table(index=["model_key", "profile"], columns="module", values=m))
                    devs.append((logs["m03"] - logs.drop(columns="m03").median(axis=1)).to_numpy())
                x = np.concatenate(devs)
                x = x[~np.isnan(x)]
                t = time.perf_counter()
                boot = bootstrap(x, rng, args.resamples)
                out.add((o.ci_low, o.ci_high), boot, time.perf_counter() - t)
    print(f"{args.seeds} seeds per finding, {args.resamples} bootstrap resamples; {time.perf_counter() - t0:.0f} s")
    print("| finding, planted | found | exact: holds it | mean width | bootstrap: holds it | mean width | "
          "bootstrap time |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for tally in (prof, mod, out):
        print(tally.row(args.seeds), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
