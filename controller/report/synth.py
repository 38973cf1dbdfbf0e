"""Synthetic fleets built from reference rows: for tests, the benchmark and trying thresholds.

A module's figures are the reference figures times its speed factor times seeded
multiplicative noise; a release regression scales one metric of one model key. Derived
figures (TPOT, TTFT, accept rate by length) are recomputed from their primaries, as the
benchmark does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import pandas as pd

from contract.records import METRICS, ResultRow
from controller.report.analysis.paired import ABBA
from controller.report.model import Arm

SPEED_METRICS = ("prefill_tps", "decode_tps", "vision_fps")
# an M1000 module's power while decoding, W (the simulated mthreads-gmi's decode phase: simulator/device/)
DECODE_POWER_W = 52.0


def rows_frame(rows: Iterable[ResultRow]) -> pd.DataFrame:
    """ResultRows -> one frame, one column per field (as the run history stores them)."""
    data = [r.model_dump(mode="json") for r in rows]
    df = pd.DataFrame(data, columns=list(ResultRow.model_fields))
    df["flags"] = df["flags"].map(lambda f: "[]" if not f else str(list(f)))
    df["extra"] = "{}"
    return df


def fleet(reference: pd.DataFrame, *, modules: int | Iterable[str] = 6, noise: float = 0.02,
          module_factor: Mapping[str, float] | None = None,
          regress: Mapping[tuple[str, str], float] | None = None,
          seed: int = 0, run_id: str = "run", release: str = "1.4.2", repeat: int = 1,
          energy: bool = False, module_power: Mapping[str, float] | None = None) -> pd.DataFrame:
    """Result rows of one simulated run.

    ``module_factor``: {module: speed} (0.88 = 12 % slower on every speed figure);
    ``regress``: {(model_key, metric): fraction} (0.08 = that metric 8 % worse on every module; ``j_per_token``
    too: 0.10 = 10 % more energy per token);
    ``repeat``: copies of the reference per module (to build large frames for benchmarks);
    ``energy``: rows carry J/token (and tokens/J): :data:`DECODE_POWER_W` times the module's power factor
    (``module_power``: {module: factor}, 1.135 = a hot module's 7 W more) over its decode rate, with noise.
    """
    names = [f"m{i:02d}" for i in range(modules)] if isinstance(modules, int) else list(modules)
    ref = reference.reset_index(drop=True)
    if repeat > 1:
        ref = pd.concat([ref.assign(profile=ref["profile"] + (f"#{i}" if i else "")) for i in range(repeat)],
                        ignore_index=True)
    n = len(ref)
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({c: np.tile(ref[c].to_numpy(), len(names)) for c in ref.columns})
    df["module"] = np.repeat(names, n)
    df["run_id"] = run_id
    df["release"] = release
    speed = np.repeat([float((module_factor or {}).get(m, 1.0)) for m in names], n)
    for metric in SPEED_METRICS:
        v = df[metric].to_numpy(dtype=float)
        df[metric] = v * speed * (1 + noise * rng.standard_normal(len(df)))
    acc = df["accept_rate"].to_numpy(dtype=float)
    df["accept_rate"] = np.clip(acc * (1 + noise * rng.standard_normal(len(df))), 0, 1)
    if energy:
        power = DECODE_POWER_W * np.repeat([float((module_power or {}).get(m, 1.0)) for m in names], n)
        df["j_per_token"] = power / df["decode_tps"].to_numpy(dtype=float) * (1 + noise * rng.standard_normal(len(df)))
    for (key, metric), frac in (regress or {}).items():
        sel = df["model_key"] == key
        higher = METRICS.get(metric, True)
        df.loc[sel, metric] = df.loc[sel, metric] * ((1 - frac) if higher else (1 + frac))
    _derive(df)
    return df


def _derive(df: pd.DataFrame) -> None:
    prefill = df["prefill_tps"].to_numpy(dtype=float)
    has_ttft = df["ttft_ms"].notna().to_numpy()
    df["ttft_ms"] = np.where(has_ttft, df["prefill_len"].to_numpy(dtype=float) / prefill * 1000.0, np.nan)
    has_tpot = df["tpot_ms"].notna().to_numpy()
    df["tpot_ms"] = np.where(has_tpot, 1000.0 / df["decode_tps"].to_numpy(dtype=float), np.nan)
    has_len = df["accept_rate_len"].notna().to_numpy()
    df["accept_rate_len"] = np.where(has_len, (3 * df["accept_rate"].to_numpy(dtype=float) + 1) / 4, np.nan)
    if "j_per_token" in df.columns:
        df["tokens_per_j"] = 1.0 / df["j_per_token"].to_numpy(dtype=float)


def planted_series(seed: int, *, n: int = 30, shift: float = 0.0, at: int | None = None, noise: float = 0.02,
                   outliers: int = 2, outlier_size: float = 0.15, level: float = 100.0) -> tuple[np.ndarray, int]:
    """A series of ``n`` releases: ``level`` times multiplicative normal noise (``noise``: its standard
    deviation, relative), the level times ``1 + shift`` from index ``at`` on (default: a seeded index in the
    middle half), and ``outliers`` values (never the first or the last) off by ``±outlier_size``. Returns the
    series and ``at`` (the first index of the new level)."""
    rng = np.random.default_rng(seed)
    where = int(rng.integers(n // 4, n - n // 4 + 1)) if at is None else at
    x = level * (1 + noise * rng.standard_normal(n))
    x[where:] *= 1 + shift
    if outliers:
        idx = rng.choice(np.arange(1, n - 1), size=outliers, replace=False)
        x[idx] *= 1 + outlier_size * rng.choice([-1.0, 1.0], size=outliers)
    return x, where


def paired_fleet(reference: pd.DataFrame, *, modules: int = 4, rounds: int = 1, noise: float = 0.02,
                 drift: float = 0.03, trend: float = 0.01, regress: Mapping[tuple[str, str], float] | None = None,
                 seed: int = 0) -> tuple[pd.DataFrame, list[tuple[str, Arm, int]]]:
    """Result rows of a paired comparison on one simulated fleet: ``rounds`` rounds of A B B A, release B with
    ``regress`` (as :func:`fleet`). Each module drifts: a speed factor per (module, round) of relative standard
    deviation ``drift``, and within a round a steady trend of ``trend`` per run (a factor ``(1 + trend)`` each run:
    linear in log units). Returns the rows and the runs
    as (run_id, arm, round), in run order."""
    rng = np.random.default_rng(seed)
    names = [f"m{i:02d}" for i in range(modules)]
    frames, runs = [], []
    for rnd in range(rounds):
        level = np.exp(drift * rng.standard_normal(modules))
        for pos, arm in enumerate(ABBA):
            run_id = f"r{rnd}-{pos}-{arm}"
            factor = {m: float(level[i] * (1 + trend) ** pos) for i, m in enumerate(names)}
            frames.append(fleet(reference, modules=names, noise=noise, module_factor=factor,
                                regress=regress if arm == "B" else None, seed=int(rng.integers(2**32)),
                                run_id=run_id, release=arm))
            runs.append((run_id, arm, rnd))
    return pd.concat(frames, ignore_index=True), runs
