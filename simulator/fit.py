"""Fit the simulated release's performance model and benchmark config to the reference tables.

Pure: seed text in, two JSON-able dicts out.

* ``model.json`` (read by the simulated *server* only): per model key, the points of the
  seed's tables that the server interpolates through (see :class:`simulator.runtime.core.Setup`):
  TTFT of the no-prefix rows over the uncached length, TTFT of the shared-prefix rows over
  the context, TPOT over the context (no-prefix and shared-prefix curves separately), the VL
  vision table's prefill / decode / fps, and for MTP setups the GSM8K prompts the simulated
  model "knows" (output length, verify steps, step time, its answer).
* ``bench_config.json`` (read by the simulated *benchmark* only): titles, columns and model
  names of each table, the sweep profiles, the GSM8K-style prompt set (index, length,
  ground truth). No measured figure is in it: the benchmark measures everything.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from functools import lru_cache
from pathlib import Path
from typing import Any

from agent.tables import Table, parse_tables, seed_key_for
from contract.records import MODEL_KEYS, ResultRow
from simulator.runtime.core import gsm8k_prompt_ids, prompt_hash

DATA_DIR = Path(__file__).resolve().parent / "data"
REFERENCE = DATA_DIR / "reference_tables.txt"

MAX_TOTAL_TOKENS = 16384
DRAFT_TOKENS = 4
# Module-time costs of the release's other steps (not in the seed's tables; chosen, documented).
TIMINGS_MS = {
    "server_load": 20000.0,  # weights loaded and server ready
    "jit_compile_per_model": 40000.0,  # start without precompiled kernels
    "precompile_base": 6000.0,
    "precompile_per_model": 12000.0,
}
VISION = {"new": 250, "output": 50, "frames_lo": 2, "frames_hi": 18}
MTP_MAX_TOKENS = 1024


class FitError(ValueError):
    pass


def seed_tables(text: str) -> dict[str, list[Table]]:
    out: dict[str, list[Table]] = defaultdict(list)
    prev: str | None = None
    for table in parse_tables(text, "reference tables"):
        key = seed_key_for(table, prev)
        out[key].append(table)
        prev = key
    missing = [k for k in MODEL_KEYS if k not in out]
    if missing:
        raise FitError(f"reference tables lack model key(s) {', '.join(missing)}")
    return dict(out)


def _pts(rows: list[ResultRow], x: str, y: str) -> list[list[float]]:
    """Points (x, y) sorted by x, duplicates of x averaged."""
    acc: dict[float, list[float]] = defaultdict(list)
    for r in rows:
        acc[float(getattr(r, x))].append(float(getattr(r, y)))
    return [[k, statistics.fmean(v)] for k, v in sorted(acc.items())]


def _sweep_setup(table: Table) -> dict[str, Any]:
    np_rows = [r for r in table.rows if not r.prefix_tokens]
    sp_rows = [r for r in table.rows if r.prefix_tokens]
    new = {r.prefill_len for r in sp_rows}
    if len(new) != 1 or not np_rows or not sp_rows:
        raise FitError(f"sweep table {table.title!r}: expected no-prefix rows and shared rows of one PrefillLen")
    return {
        "prefill_np": _pts(np_rows, "input_tokens", "ttft_ms"),
        "decode_np": _pts(np_rows, "input_tokens", "tpot_ms"),
        "prefill_sp": _pts(sp_rows, "input_tokens", "ttft_ms"),
        "decode_sp": _pts(sp_rows, "input_tokens", "tpot_ms"),
        "sp_new": new.pop(),
    }


def _vision_setup(table: Table) -> dict[str, Any]:
    return {
        "fps": statistics.fmean(float(r.vision_fps or 0) for r in table.rows),
        "prefill_tps": _pts(list(table.rows), "input_tokens", "prefill_tps"),
        "decode_tps": _pts(list(table.rows), "input_tokens", "decode_tps"),
    }


def _mtp_setup(table: Table) -> dict[str, Any]:
    prompts: dict[str, dict[str, Any]] = {}
    steps_ms: list[float] = []
    acc: list[float] = []
    for r in table.rows:
        assert r.output_tokens and r.accept_rate_len and r.tpot_ms and r.input_tokens and r.prompt_index is not None
        n = r.output_tokens
        steps = round(n / (DRAFT_TOKENS * r.accept_rate_len))
        step_ms = r.tpot_ms * (n - 1) / steps
        ids = gsm8k_prompt_ids(r.prompt_index, r.input_tokens)
        prompts[prompt_hash(ids)] = {
            "index": r.prompt_index,
            "n": n,
            "accept_len": n / (DRAFT_TOKENS * steps),
            "step_ms": step_ms,
            "answer": r.prediction,
        }
        steps_ms.append(step_ms)
        acc.append(n / (DRAFT_TOKENS * steps))
    rows = list(table.rows)
    return {
        "prefill": _pts(rows, "input_tokens", "ttft_ms"),
        "ms_per_token": statistics.fmean(float(r.ttft_ms or 0) / float(r.input_tokens or 1) for r in rows),
        "step_ms": statistics.median(steps_ms),
        "accept_len": statistics.fmean(acc),
        "draft_tokens": DRAFT_TOKENS,
        "prompts": prompts,
    }


def _columns_model(table: Table) -> dict[str, Any]:
    first = table.rows[0]
    out: dict[str, Any] = {"kind": table.kind, "title": table.title, "columns": list(table.columns),
                           "model": first.model, "size": first.size}
    if first.precision:
        out["precision"] = first.precision
    return out


def fit(text: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(model.json, bench_config.json) fitted to the reference document's tables."""
    tables = seed_tables(text)
    setups: dict[str, dict[str, Any]] = {}
    bench_keys: dict[str, dict[str, Any]] = {}
    models: dict[str, dict[str, Any]] = {}
    for key, spec in MODEL_KEYS.items():
        ts = tables[key]
        data: dict[str, Any] = {"model_dir": spec.model_dir}
        for t in ts:
            if t.kind == "sweep":
                data.update(_sweep_setup(t))
            elif t.kind == "vision":
                data["vision"] = _vision_setup(t)
            else:
                data["mtp"] = _mtp_setup(t)
        setups[key] = data
        is_mtp = "mtp" in data
        entry = models.setdefault(spec.model_dir, {"key": None, "mtp_key": None})
        entry["mtp_key" if is_mtp else "key"] = key
        bench_keys[key] = {
            "model_dir": spec.model_dir,
            "start_script": spec.start_script,
            "mtp": is_mtp,
            "tables": [_columns_model(t) for t in ts],
        }
    gsm8k = _gsm8k_set(tables)
    sweep = tables["qwen3"][0]
    np_inputs = sorted({int(r.input_tokens or 0) for r in sweep.rows if not r.prefix_tokens})
    sp_inputs = sorted({int(r.input_tokens or 0) for r in sweep.rows if r.prefix_tokens})
    vision_inputs = sorted({int(r.input_tokens or 0) for r in tables["qwen3vl"][1].rows})
    model = {
        "schema": 1,
        "max_total_tokens": MAX_TOTAL_TOKENS,
        "timings_ms": TIMINGS_MS,
        "models": models,
        "setups": setups,
    }
    bench = {
        "schema": 1,
        "keys": bench_keys,
        "profiles": {
            "no_prefix": np_inputs,
            "shared_prefix": sp_inputs,
            "prefix_new": int(sweep.rows[-1].prefill_len or 0),
            "output": int(sweep.rows[0].output_tokens or 0),
        },
        "gsm8k": gsm8k,
        "mtp_max_tokens": MTP_MAX_TOKENS,
        "vision": {**VISION, "inputs": vision_inputs},
    }
    return model, bench


def _gsm8k_set(tables: dict[str, list[Table]]) -> list[dict[str, Any]]:
    seen: dict[int, dict[str, Any]] = {}
    for key in ("qwen35_mtp", "qwen35_fq_mtp"):
        for r in tables[key][0].rows:
            assert r.prompt_index is not None
            item = {"index": r.prompt_index, "input": r.input_tokens, "truth": r.ground_truth}
            if seen.setdefault(r.prompt_index, item) != item:
                raise FitError(f"GSM8K prompt {r.prompt_index} differs between the MTP tables")
    return [seen[i] for i in sorted(seen)]


@lru_cache(maxsize=4)
def fitted(path: str = str(REFERENCE)) -> tuple[dict[str, Any], dict[str, Any]]:
    return fit(Path(path).read_text(encoding="utf-8"))
