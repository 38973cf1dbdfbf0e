"""Benchmark: the change-point detector against the one before it (``--before REV``, read from git), side by side.

Both detectors run in one process on the same series: today's (``controller.report.analysis``) and the one of
commit ``REV`` (its ``changepoints.py`` and ``changepoints_batch.py`` taken from git and loaded as modules of their
own; default: the permutation test of ADR 0017 / 0032). Printed per detector:

* **holes** (issue 46): a clean -8 % step (noise 1 %, seeded, no outliers) with at least 3 releases on each side,
  every history length 12..40 and every position: found within one release, in its direction; the places missed;
  the same with almost no noise (a 0.1 % saw-tooth);
* **drift**: +0.5 % a release over 40 releases with 1 % noise (``--drift-seeds`` seeds): how many findings each
  seed gives, and how many seeds give exactly one drift; planted steps named as drifts;
* **--max-pvalue 0.0001**: a 38 % jump 5 releases from the end of 15 (1 % saw-tooth): found or not;
* **detection**: ``planted_series`` (``--n`` releases, 2 outliers of ±15 %, a shift of 2-20 % in the middle half):
  found within one release in its direction, found anywhere, more than one change point; false positives over
  ``--null-seeds`` no-shift seeds per noise level;
* **short histories**: false positives and a 10 % step in the middle, 6 to 20 releases;
* **cost**: the analysis of ``--batch`` series of ``--batch-n`` releases as a trend over a history has them (one
  in 10 shifted by 3-20 %, 2 % noise, two outliers each) by the batch path (``changepoints_batch.analyse_many``,
  what ``trend.changes``, ``new_changes`` and the judging of a run use), both detectors interleaved round by round,
  median of ``--repeat``; and today's per-series ``analyse_series`` of each, compared with the batch path's
  Detections (exits 1 on a difference).

Usage: .venv/bin/python bench/changepoints.py [--before 71487cd] [--seeds 200] [--null-seeds 1000] [--n 30]
       [--batch 1210] [--batch-n 100] [--repeat 5] [--sections holes,drift,strict,cost,detection,short]
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import record  # noqa: E402 - bench/record.py, this script's folder
from controller.report.analysis import changepoints as now_cp  # noqa: E402
from controller.report.analysis import changepoints_batch as now_batch  # noqa: E402
from controller.report.synth import planted_series  # noqa: E402

SHIFTS = (0.02, 0.03, 0.05, 0.07, 0.10, 0.15, 0.20)
NOISES = (0.01, 0.02, 0.03)
BEFORE = "71487cd"  # the permutation test (ADR 0017, 0032): the commit before ADR 0039
PACKAGE = "controller.report.analysis"


def load_before(rev: str, into: Path) -> tuple[ModuleType, ModuleType]:
    """``changepoints`` and ``changepoints_batch`` of commit ``rev`` as modules of their own (the batch one
    importing the old per-series one)."""
    mods = []
    for name in ("changepoints", "changepoints_batch"):
        text = subprocess.run(["git", "show", f"{rev}:controller/report/analysis/{name}.py"], cwd=ROOT, check=True,
                              capture_output=True, text=True).stdout
        text = text.replace(f"from {PACKAGE}.changepoints import", "from before_changepoints import")
        path = into / f"before_{name}.py"
        path.write_text(text)
        spec = importlib.util.spec_from_file_location(f"before_{name}", path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[f"before_{name}"] = mod
        spec.loader.exec_module(mod)
        mods.append(mod)
    return mods[0], mods[1]


class Detector:
    """One detector: its per-series and batch analyses, under its default settings or ``settings`` given."""

    def __init__(self, name: str, cp: ModuleType, batch: ModuleType) -> None:
        self.name, self.cp, self.batch = name, cp, batch

    def settings(self, **given: Any) -> Any:
        return self.cp.DetectorSettings(**{k: v for k, v in given.items() if v is not None})

    def one(self, x: np.ndarray, **given: Any) -> tuple[Any, ...]:
        return tuple(self.cp.analyse_series(x, self.settings(**given)).change_points)

    def many(self, xs: Sequence[np.ndarray], **given: Any) -> list[Any]:
        return list(self.batch.analyse_many(xs, self.settings(**given)))


def _found(cps: Sequence[Any], at: int, sign: float, within: int = 1) -> bool:
    return any(abs(c.index - at) <= within and c.size * sign > 0 for c in cps)


def holes(detectors: Sequence[Detector]) -> None:
    print("\n## holes: a clean -8 % step, >= 3 releases each side, every length 12..40 and position\n")
    cases = [(n, at) for n in range(12, 41) for at in range(3, n - 2)]
    makers: tuple[tuple[str, Callable[[int, int], np.ndarray]], ...] = (
        ("noise 1 % (seeded)", lambda n, at: 1 + 0.01 * np.random.default_rng(1000 * n + at).standard_normal(n)),
        ("0.1 % saw-tooth", lambda n, at: 1 + 0.001 * (np.arange(n) % 3)))
    for label, make in makers:
        series = []
        for n, at in cases:
            x = 100 * make(n, at)
            x[at:] *= 0.92
            series.append(x)
        print(f"{label}, {len(cases)} (length, position) cases:")
        for d in detectors:
            got = d.many(series)
            missed = [(n, at) for (n, at), det in zip(cases, got, strict=True) if not _found(det.change_points, at, -1)]
            where = ", ".join(f"{n}/{n - at} after" for n, at in missed[:12]) + (" ..." if len(missed) > 12 else "")
            print(f"| {d.name} | found {len(cases) - len(missed)} of {len(cases)} | missed (length/releases after):"
                  f" {where or 'none'} |")
        print("  15 releases, the step 4 / 5 / 6 releases from the end: " + "; ".join(
            f"{d.name}: " + " / ".join("found" if _found(d.one(_step(make, 15, 15 - k)), 15 - k, -1) else "MISSED"
                                      for k in (4, 5, 6)) for d in detectors))


def _step(make: Callable[[int, int], np.ndarray], n: int, at: int, size: float = -0.08) -> np.ndarray:
    x = 100 * make(n, at)
    x[at:] *= 1 + size
    return x


def drift(detectors: Sequence[Detector], seeds: int, step_seeds: int) -> None:
    print(f"\n## drift: +0.5 % a release over 40 releases, 1 % noise, {seeds} seeds\n")
    series = [100 * 1.005 ** np.arange(40) * (1 + 0.01 * np.random.default_rng(s).standard_normal(40))
              for s in range(seeds)]
    for d in detectors:
        got = [det.change_points for det in d.many(series)]
        counts = np.bincount([len(c) for c in got], minlength=6)
        one_drift = sum(len(c) == 1 and getattr(c[0], "kind", "step") == "drift" for c in got)
        slopes = [c[0].slope for c in got if len(c) == 1 and getattr(c[0], "kind", "step") == "drift"]
        ex = ", ".join(f"{c.size:+.1%}" + (f" drift {c.slope:+.2%}/release over {c.end - c.index + 1}"
                                          if getattr(c, "kind", "step") == "drift" else f" at {c.index}")
                       for c in got[0])
        print(f"| {d.name} | findings per seed 0/1/2/3/4+: {'/'.join(map(str, counts[:4]))}/{counts[4:].sum()} | "
              f"one drift: {one_drift} of {seeds}"
              + (f" (slope median {np.median(slopes):+.2%}/release)" if slopes else "") + f" | seed 0: {ex} |")
    print(f"\nplanted steps (5-20 %, noise 1-3 %, 30 releases, {step_seeds} seeds a cell) named as a drift:")
    for d in detectors:
        named = total = 0
        for nz in NOISES:
            for sh in (0.05, 0.10, 0.20):
                for seed in range(step_seeds):
                    cps = d.one(planted_series(seed, n=30, shift=-sh, noise=nz)[0])
                    named += any(getattr(c, "kind", "step") == "drift" for c in cps)
                    total += 1
        print(f"| {d.name} | {named} of {total} |")


def strict_p(detectors: Sequence[Detector]) -> None:
    print("\n## --max-pvalue 0.0001: a 38 % jump 5 releases from the end of 15 (1 % saw-tooth)\n")
    x = 100 * (1 + 0.01 * (np.arange(15) % 3))
    x[10:] *= 1.38
    for d in detectors:
        for p in (0.002, 0.0001):
            try:
                cps = d.one(x, max_pvalue=p)
                said = ", ".join(f"{c.size:+.1%} at {c.index} (p {c.p_value:.2g})" for c in cps) or "NOTHING"
            except ValueError as exc:  # a refusal is an answer (SeriesError)
                said = f"refused: {exc}"
            print(f"| {d.name} | --max-pvalue {p} | {said} |")


def detection(detectors: Sequence[Detector], seeds: int, null_seeds: int, n: int) -> None:
    print(f"\n## detection: {n} releases, 2 outliers of ±15 %, shift planted in the middle half, {seeds} seeds a "
          f"cell; false positives over {null_seeds} no-shift seeds\n")
    print("found within one release, right direction | found anywhere, right direction | more than one")
    for d in detectors:
        print(f"\n### {d.name}\n")
        print("| shift | " + " | ".join(f"noise {nz:.0%} | anywhere | >1" for nz in NOISES) + " |")
        print("| ---: |" + " ---: |" * 3 * len(NOISES))
        t0 = time.perf_counter()
        for shift in SHIFTS:
            cells = []
            for nz in NOISES:
                planted = [planted_series(seed, n=n, shift=-shift, noise=nz) for seed in range(seeds)]
                got = d.many([x for x, _ in planted])
                hit = sum(_found(det.change_points, at, -1) for det, (_, at) in zip(got, planted, strict=True))
                anywhere = sum(any(c.size < 0 for c in det.change_points) for det in got)
                extra = sum(len(det.change_points) > 1 for det in got)
                cells.append(f"{hit / seeds:.1%} | {anywhere / seeds:.1%} | {extra}")
            print(f"| {shift:.0%} | " + " | ".join(cells) + " |")
        fps = [sum(bool(det.change_points) for det in d.many(
            [planted_series(10**6 + seed, n=n, shift=0.0, noise=nz)[0] for seed in range(null_seeds)]))
            for nz in NOISES]
        print("\nfalse positives (no-shift seeds with a change point): " +
              ", ".join(f"noise {nz:.0%}: {fp} of {null_seeds}" for nz, fp in zip(NOISES, fps, strict=True)) +
              f"; {time.perf_counter() - t0:.1f} s")


def short(detectors: Sequence[Detector], null_seeds: int, seeds: int) -> None:
    print(f"\n## short histories: false positives over {null_seeds} no-shift seeds (2 outliers of ±15 %), and a 10 %"
          f" step in the middle found within one release ({seeds} seeds), by length and noise\n")
    print("| detector | length | " + " | ".join(f"false, noise {nz:.0%} | 10 % found" for nz in NOISES) + " |")
    print("| --- | ---: |" + " ---: | ---: |" * len(NOISES))
    for d in detectors:
        for n in (6, 8, 10, 12, 16, 20):
            cells = []
            for nz in NOISES:
                fp = sum(bool(det.change_points) for det in d.many(
                    [planted_series(10**6 + seed, n=n, noise=nz, outliers=2 if n >= 8 else 0)[0]
                     for seed in range(null_seeds)]))
                planted = [planted_series(seed, n=n, noise=nz, shift=-0.10, at=n // 2, outliers=0)
                           for seed in range(seeds)]
                hit = sum(_found(det.change_points, at, -1) for det, (_, at) in
                          zip(d.many([x for x, _ in planted]), planted, strict=True))
                cells.append(f"{fp} | {hit / seeds:.0%}")
            print(f"| {d.name} | {n} | " + " | ".join(cells) + " |")


def cost(detectors: Sequence[Detector], count: int, n: int, repeat: int) -> int:
    print(f"\n## cost: {count} series of {n} releases (1 in 10 shifted by 3-20 %, 2 % noise, 2 outliers), the batch "
          f"path, {repeat} interleaved rounds, median [min-max]\n")
    sizes = (0.03, 0.05, 0.07, 0.10, 0.15, 0.20)
    few = [planted_series(seed, n=n, noise=0.02, shift=0.0 if seed % 10 else
                          sizes[seed // 10 % 6] * (-1) ** (seed // 10))[0] for seed in range(count)]
    none = [planted_series(10**6 + seed, n=n, noise=0.02)[0] for seed in range(count)]
    same = True
    for label, series in (("1 in 10 shifted", few), ("none shifted", none)):
        for d in detectors:
            d.many(series[:20])  # imports, scipy loaded: untimed
        times: dict[str, list[float]] = {d.name: [] for d in detectors}
        found: dict[str, int] = {}
        for _ in range(repeat):
            for d in detectors:
                t0 = time.perf_counter()
                got = d.many(series)
                times[d.name].append(time.perf_counter() - t0)
                found[d.name] = sum(len(det.change_points) for det in got)
        print(f"{label}:")
        for d in detectors:
            ts = times[d.name]
            print(f"| {d.name} | {np.median(ts):.3f} s [{min(ts):.3f}-{max(ts):.3f}] | {found[d.name]} change points |")
        base = np.median(times[detectors[-1].name])
        print(f"  {detectors[0].name} / {detectors[-1].name}: {np.median(times[detectors[0].name]) / base:.3f}x")
        one = [now_cp.analyse_series(x) for x in series]
        same &= one == now_batch.analyse_many(series)
    print(f"today's batch path and its per-series path: Detections {'identical' if same else 'DIFFERENT'}")
    return 0 if same else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", default=BEFORE, help="the commit whose detector is measured beside today's")
    ap.add_argument("--seeds", type=int, default=200, help="seeds per (shift, noise) cell")
    ap.add_argument("--null-seeds", type=int, default=1000, help="no-shift seeds per noise level")
    ap.add_argument("--n", type=int, default=30, help="releases per planted series")
    ap.add_argument("--drift-seeds", type=int, default=100, help="seeds of the drift series")
    ap.add_argument("--batch", type=int, default=1210, help="series of the cost measurement")
    ap.add_argument("--batch-n", type=int, default=100, help="releases per series of the cost measurement")
    ap.add_argument("--repeat", type=int, default=5, help="rounds of the cost measurement")
    ap.add_argument("--sections", default="holes,drift,strict,cost,detection,short",
                    help="which to run, comma separated")
    a = ap.parse_args()
    run = set(a.sections.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        before_cp, before_batch = load_before(a.before, Path(tmp))
        detectors = [Detector("now", now_cp, now_batch), Detector(f"before ({a.before})", before_cp, before_batch)]
        print(f"today's settings: {now_cp.DetectorSettings()}\nbefore: {before_cp.DetectorSettings()}")
        rc = 0
        if "holes" in run:
            holes(detectors)
        if "drift" in run:
            drift(detectors, a.drift_seeds, a.seeds // 2)
        if "strict" in run:
            strict_p(detectors)
        if "cost" in run:
            rc = cost(detectors, a.batch, a.batch_n, a.repeat)
        if "detection" in run:
            detection(detectors, a.seeds, a.null_seeds, a.n)
        if "short" in run:
            short(detectors, a.null_seeds, a.seeds)
    return rc


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
