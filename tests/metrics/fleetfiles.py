"""Writes a module's workdir in the layout the pipeline and the worker use (see agent.metrics).

Test helper only: the real writers are ``agent/store.py`` (pipeline) and ``agent/heartbeat.py``
(heartbeat). Records come from ``contract.records``; JSON files are replaced atomically and
JSON lines appended, as the contract says.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agent.tables import parse_seed, stamp
from contract.records import DeviceSample, Heartbeat, ResultRow, RunProgress, RunState

SWEEP_KEYS = ("qwen3", "qwen35", "qwen35_fq", "qwen36_fq", "qwen3vl")


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(tmp, path)


def append_lines(path: Path, items: Iterable[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        for item in items:
            fh.write(item + "\n")


class RunWriter:
    def __init__(self, workdir: Path, run_id: str, module: str, release: str = "1.4.1") -> None:
        self.workdir, self.run_id, self.module, self.release = workdir, run_id, module, release
        self.folder = workdir / "runs" / run_id
        self.folder.mkdir(parents=True, exist_ok=True)
        self.started = time.time()

    def progress(self, **kw: Any) -> RunProgress:
        base: dict[str, Any] = {"run_id": self.run_id, "module": self.module, "release": self.release,
                                "started_at": self.started, "updated_at": time.time()}
        p = RunProgress(**{**base, **kw})
        write_json(self.folder / "progress.json", p.model_dump(mode="json"))
        return p

    def event(self, step: str, status: str, duration_s: float | None = None, model_key: str | None = None,
              exit_code: int | None = None, message: str = "") -> None:
        ev = {"ts": time.time(), "step": step, "model_key": model_key, "status": status,
              "duration_s": duration_s, "exit_code": exit_code, "message": message}
        append_lines(self.folder / "events.jsonl", [json.dumps(ev)])

    def rows(self, rows: Iterable[ResultRow]) -> None:
        append_lines(self.folder / "results.jsonl", [r.model_dump_json() for r in rows])

    def samples(self, samples: Iterable[DeviceSample]) -> None:
        append_lines(self.folder / "telemetry.jsonl", [s.model_dump_json(exclude_none=True) for s in samples])

    def state(self, current: str | None, last: str | None = None) -> None:
        write_json(self.workdir / "state.json", {"current_run": current, "last_run": last, "updated_at": time.time()})


def device_sample(run_id: str, module: str, key: str | None, step: str = "benchmark", ts: float | None = None,
                  **values: Any) -> DeviceSample:
    """A sample as the sampler writes it; values default to an H200 under load (SW power cap)."""
    base: dict[str, Any] = {
        "temperature_c": 59.0, "memory_temperature_c": 50.0, "power_w": 692.1, "power_limit_w": 700.0,
        "sm_clock_mhz": 1455.0, "memory_clock_mhz": 3201.0, "graphics_clock_mhz": 1455.0, "max_sm_clock_mhz": 1980.0,
        "utilization_pct": 100.0, "memory_utilization_pct": 25.0, "memory_used_mib": 1139.0,
        "memory_total_mib": 143771.0, "clock_event_reasons": 0x4, "ecc_uncorrected": 0}
    return DeviceSample.model_validate({**base, **values, "ts": time.time() if ts is None else ts, "gpu": 0,
                                        "run_id": run_id, "module": module, "step": step, "model_key": key})


def heartbeat(workdir: Path, module: str, ts: float | None = None, healthy: bool = True) -> Heartbeat:
    hb = Heartbeat(module=module, agent_version="0.1.0", ts=ts if ts is not None else time.time(), healthy=healthy)
    write_json(workdir / "heartbeat.json", hb.model_dump(mode="json"))
    return hb


def seed_rows(seed_text: str, run_id: str, module: str, release: str, keys: Iterable[str] | None = None,
              scale: float = 1.0) -> dict[str, list[ResultRow]]:
    """The seed's rows per key, stamped; ``scale`` < 1 makes every figure slower by that factor."""
    out: dict[str, list[ResultRow]] = {}
    for key, rows in parse_seed(seed_text).items():
        if keys is not None and key not in keys:
            continue
        scaled = [_scale(r, scale) for r in rows]
        out[key] = stamp(scaled, run_id=run_id, module=module, release=release, model_key=key)
    return out


def _scale(r: ResultRow, s: float) -> ResultRow:
    if s == 1.0:
        return r
    upd: dict[str, Any] = {}
    for f in ("prefill_tps", "decode_tps", "vision_fps"):
        if getattr(r, f) is not None:
            upd[f] = getattr(r, f) * s
    for f in ("ttft_ms", "tpot_ms"):
        if getattr(r, f) is not None:
            upd[f] = getattr(r, f) / s
    return r.model_copy(update=upd)


def finished_run(workdir: Path, seed_text: str, run_id: str, module: str, release: str = "1.4.1",
                 state: RunState = RunState.DONE, scale: float = 1.0, fetched_s: float | None = None) -> RunWriter:
    """A whole run written at once: events per step, every key's rows, final progress. ``fetched_s``: its
    precompile was fetched from the fleet's kernel cache in that time (on every row, as the agent writes it)."""
    w = RunWriter(workdir, run_id, module, release)
    per_key = seed_rows(seed_text, run_id, module, release, scale=scale)
    if fetched_s is not None:
        per_key = {k: [r.model_copy(update={"precompile_source": "fetched", "precompile_fetch_s": fetched_s})
                       for r in rows] for k, rows in per_key.items()}
    for step, d in (("fetch", 0.5), ("unpack", 2.0), ("configure", 0.1), ("generate", 1.0),
                    ("environment", 0.3), ("precompile", 40.0)):
        w.event(step, "start")
        w.event(step, "ok", d)
    for key, rows in per_key.items():
        w.event("benchmark", "start", model_key=key)
        w.event("benchmark", "ok", 120.0, model_key=key)
        w.rows(rows)
        w.samples([device_sample(run_id, module, key)])
    w.progress(state=state, step="publish", keys_total=len(per_key), keys_done=len(per_key), progress=1.0,
               rows=sum(len(r) for r in per_key.values()), finished_at=time.time())
    return w
