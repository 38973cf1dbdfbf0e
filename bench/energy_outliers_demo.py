"""False energy (and speed) outliers through the real path: ``fleetctl demo`` on identical simulated modules, no change.

Runs ``fleetctl demo --models KEYS --seed S`` (4 simulated modules, the simulator's noise, device telemetry, the
agent's energy windows, the history) for ``--runs`` seeds, keeps each demo's history, and judges every kept history
with the report of this checkout (``build_report``): how many runs name any module an outlier (energy or speed) of a
fleet of identical devices, with a Wilson 95 % interval. ``--judge-only DIR``: judge the histories already in DIR
(``<seed>.sqlite``), e.g. to judge the same demos with another rule. ``--in-process N``: beside it, N synthetic runs
of 4 identical modules (5 % window noise, 1, 2 and 7 keys) straight through ``energy_outliers``. Issue 46 item 1
(ADR 0040).

Usage: .venv/bin/python bench/energy_outliers_demo.py [--runs 100] [--models qwen3] [--keep DIR] [--judge-only DIR]
"""

from __future__ import annotations

import argparse
import math
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from controller.history import History  # noqa: E402
from controller.report.load import build_report  # noqa: E402


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of k successes in n."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    mid = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, mid - half), min(1.0, mid + half)


def judge(path: Path) -> tuple[list[str], list[str]]:
    """The energy outliers and the speed outliers of the demo's run (the last run in the history)."""
    h = History(str(path))
    run = h.runs(limit=1)[0].run_id
    rep = build_report(h, run)
    energy = [f"{o.module}[{o.model_key}] {1 / o.factor:.2f}x" for o in rep.energy_outliers]
    speed = [f"{o.module}[{o.model_key}] {o.factor:.2f}x" for o in rep.outliers]
    return energy, speed


def run_demo(seed: int, models: str, keep: Path) -> Path | None:
    with tempfile.TemporaryDirectory(prefix="bench-energy-") as tmp:
        out = Path(tmp) / "demo"
        r = subprocess.run([sys.executable, "-m", "controller", "demo", "--models", models, "--seed", str(seed),
                            "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=900)
        if not (out / "history.sqlite").exists():
            print(f"seed {seed}: no history (exit {r.returncode}): {r.stderr[-300:]}", flush=True)
            return None
        dest = keep / f"{seed}.sqlite"
        shutil.copy(out / "history.sqlite", dest)
        return dest


def in_process(runs: int, seed: int = 0) -> None:
    """Runs naming an energy outlier among 4 identical modules, one J/token window per (module, key) at 5 % noise."""
    import numpy as np
    import pandas as pd

    from controller.report.analysis.energy import energy_outliers
    from controller.report.model import Thresholds

    rng = np.random.default_rng(seed)
    for keys in (1, 2, 7):
        hit = 0
        for _ in range(runs):
            rows = [(f"m{i}", f"k{j}", 2.0 * (1 + j) * math.exp(0.05 * rng.standard_normal()))
                    for i in range(4) for j in range(keys)]
            hit += bool(energy_outliers(pd.DataFrame(rows, columns=["module", "model_key", "j_per_token"]),
                                        Thresholds()))
        lo, hi = wilson(hit, runs)
        print(f"in process, 4 identical modules x {keys} key(s), 5 % window noise: runs naming an energy outlier "
              f"{hit}/{runs} = {hit / runs:.2%} (Wilson 95 % {lo:.2%} to {hi:.2%})", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--models", default="qwen3")
    ap.add_argument("--keep", type=Path, default=None, help="folder to keep each demo's history in")
    ap.add_argument("--judge-only", type=Path, default=None, help="judge the histories in this folder, run none")
    ap.add_argument("--in-process", type=int, default=0, help="also N synthetic runs straight through the rule")
    args = ap.parse_args()
    if args.in_process:
        in_process(args.in_process)
    if args.judge_only:
        paths = sorted(args.judge_only.glob("*.sqlite"), key=lambda p: int(p.stem) if p.stem.isdigit() else 0)
    else:
        keep = args.keep or Path(tempfile.mkdtemp(prefix="bench-energy-keep-"))
        keep.mkdir(parents=True, exist_ok=True)
        paths = [p for s in range(1, args.runs + 1) if (p := run_demo(s, args.models, keep)) is not None]
    t0 = time.monotonic()
    any_energy = any_out = 0
    for p in paths:
        energy, speed = judge(p)
        any_energy += bool(energy)
        any_out += bool(energy or speed)
        if energy or speed:
            print(f"{p.name}: energy outliers {energy or '-'}; speed outliers {speed or '-'}", flush=True)
    n = len(paths)
    for what, k in (("an energy outlier", any_energy), ("any outlier (energy or speed)", any_out)):
        lo, hi = wilson(k, n)
        print(f"runs naming {what} of identical devices: {k}/{n} = {k / max(n, 1):.1%} "
              f"(Wilson 95 % {lo:.1%} to {hi:.1%})")
    print(f"judged {n} histories in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
