"""Benchmark: a report over 1,000,000 result rows, next to a bare pandas groupby of the same rows.

Builds a synthetic fleet from the reference tables (92 rows per module, ~10,870 modules, 2 %
noise, one slow module, one 8 % decode regression), then times in the same run:

* bare   ``df.groupby(["model_key", "profile"])[metrics].median()`` (the floor of any analysis);
* report ``analyse(...)``: outliers, fleet vs baseline, summary, verdict (target <= 3 s);
* report with the previous run of every module (another 1,000,000 rows);
* Markdown and JSON rendering of the result.

Prints each figure (best of ``--repeat``) and the ratio to the bare groupby.

``--power N`` instead measures the verdicts' error rates on N seeds of the acceptance scenario
(6 modules, 2 % noise, one module 0.88x): false alarms with no change, and how often an 8 %
decode regression on each model key is named exactly (that regression, that module, nothing else).

Usage: .venv/bin/python bench/report.py [--rows 1000000] [--repeat 3] [--strict] [--power 20]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from agent.records import METRICS  # noqa: E402
from agent.tables import parse_seed  # noqa: E402
from controller.report import analyse  # noqa: E402
from controller.report.synth import fleet, rows_frame  # noqa: E402

TARGET_S = 3.0


def best(fn: Callable[[], object], repeat: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return min(times), out


def seed_path() -> Path:
    for p in (ROOT.parent / "shared" / "seeds" / "000_29a7ee896c0fa7ef.txt",
              ROOT / "simulator" / "data" / "reference_tables.txt"):
        if p.exists():
            return p
    raise SystemExit("reference document not found")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--strict", action="store_true", help=f"exit 1 if the report takes more than {TARGET_S} s")
    ap.add_argument("--power", type=int, default=0, help="measure error rates over this many seeds instead")
    args = ap.parse_args()

    ref = rows_frame([r for rows in parse_seed(seed_path().read_text(encoding="utf-8")).values() for r in rows])
    if args.power:
        return power(ref, args.power)
    modules = max(6, round(args.rows / len(ref)))
    t = time.perf_counter()
    cur = fleet(ref, modules=modules, module_factor={"m03": 0.88}, regress={("qwen3", "decode_tps"): 0.08},
                seed=1, run_id="run-b")
    prev = fleet(ref, modules=modules, module_factor={"m03": 0.88}, seed=2, run_id="run-a")
    print(f"rows: {len(cur):,} per run ({modules:,} modules x {len(ref)} rows); built in "
          f"{time.perf_counter() - t:.1f} s")

    metrics = list(METRICS)
    bare, _ = best(lambda: cur.groupby(["model_key", "profile"])[metrics].median(), args.repeat)
    rep_t, rep = best(lambda: analyse(cur, run_id="run-b", baseline=ref, baseline_id="b"), args.repeat)
    prev_t, rep2 = best(lambda: analyse(cur, run_id="run-b", baseline=ref, baseline_id="b", previous=prev),
                        args.repeat)
    md_t, _ = best(lambda: (rep2.to_markdown(), rep2.to_json()), args.repeat)  # type: ignore[attr-defined]

    print(f"bare groupby median (7 metrics)        {bare:7.3f} s   1.0x")
    print(f"report (baseline)                      {rep_t:7.3f} s  {rep_t / bare:5.1f}x")
    print(f"report (baseline + previous run)       {prev_t:7.3f} s  {prev_t / bare:5.1f}x")
    print(f"markdown + json rendering              {md_t:7.3f} s  {md_t / bare:5.1f}x")
    print(f"verdict: {rep2.verdict_line}")  # type: ignore[attr-defined]
    ok = rep_t <= TARGET_S
    print(f"target: report over {len(cur):,} rows <= {TARGET_S} s: {'met' if ok else 'NOT met'} ({rep_t:.2f} s)")
    return 0 if ok or not args.strict else 1


def power(ref, seeds: int) -> int:  # type: ignore[no-untyped-def]
    slow = {"m03": 0.88}
    false_reg = false_out = 0
    for seed in range(seeds):
        rep = analyse(fleet(ref, module_factor=slow, seed=10_000 + seed), baseline=ref)
        false_reg += len(rep.regressions) > 0
        false_out += [o.module for o in rep.outliers] != ["m03"]
    print(f"no change, {seeds} seeds: runs with any regression {false_reg}/{seeds}; runs where the outliers "
          f"are not exactly [m03] {false_out}/{seeds}")
    for key in sorted(set(ref["model_key"])):
        exact = 0
        for seed in range(seeds):
            rep = analyse(fleet(ref, module_factor=slow, regress={(key, "decode_tps"): 0.08}, seed=20_000 + seed),
                          baseline=ref)
            named = [(r.module, r.model_key, r.profile, r.metric) for r in rep.regressions]
            exact += named == [("*", key, "*", "decode_tps")] and [o.module for o in rep.outliers] == ["m03"]
        print(f"8 % decode regression on {key:14s}: named exactly in {exact}/{seeds} seeds")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
