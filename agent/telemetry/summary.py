"""Pure summary of a run's device samples: per model key and device, min / mean / max / p95.

A run re-delivered or resumed appends to the same ``telemetry.jsonl``; a key's figures come
from the latest attempt that sampled it (an earlier, failed attempt of the key is not mixed
in, and a key that passed earlier and was not re-run keeps its earlier figures).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path

from pydantic import ValidationError

from agent.telemetry.fields import NUMERIC, REASONS
from contract.records import DeviceInfo, DeviceSample, FieldStats, KeyTelemetry, TelemetrySummary

# fields summarised as statistics (the bitmask is summarised as shares of samples per reason)
STAT_FIELDS: tuple[str, ...] = tuple(n for n in NUMERIC if n != "clock_event_reasons")


def stats(values: list[float]) -> FieldStats | None:
    """min / mean / max / p95 (nearest rank) of ``values``; None when empty."""
    if not values:
        return None
    s = sorted(values)
    n = len(s)
    p95 = s[max(0, math.ceil(0.95 * n) - 1)]
    return FieldStats(n=n, min=s[0], mean=round(math.fsum(s) / n, 4), max=s[-1], p95=p95)


class _Group:
    __slots__ = ("count", "first", "last", "masks", "values")

    def __init__(self) -> None:
        self.count = 0
        self.first = math.inf
        self.last = -math.inf
        self.values: dict[str, list[float]] = {f: [] for f in STAT_FIELDS}
        self.masks: list[int] = []

    def add(self, s: DeviceSample) -> None:
        self.count += 1
        self.first = min(self.first, s.ts)
        self.last = max(self.last, s.ts)
        for f in STAT_FIELDS:
            v = getattr(s, f)
            if v is not None:
                self.values[f].append(float(v))
        if s.clock_event_reasons is not None:
            self.masks.append(s.clock_event_reasons)

    def result(self, key: str, gpu: int) -> KeyTelemetry:
        fields = {f: st for f in STAT_FIELDS if (st := stats(self.values[f])) is not None}
        reasons = {}
        if self.masks:
            for bit, name, _ in REASONS:
                reasons[name] = round(sum(1 for m in self.masks if m & bit) / len(self.masks), 4)
        return KeyTelemetry(model_key=key, gpu=gpu, samples=self.count, first_ts=self.first, last_ts=self.last,
                            fields=fields, reasons=reasons)


def summarize(samples: Iterable[DeviceSample], *, run_id: str, module: str, tool: str = "",
              period_s: float = 1.0, devices: Iterable[DeviceInfo] = (),
              notes: Iterable[str] = ()) -> TelemetrySummary:
    """The summary of a run's samples (any order; several attempts allowed)."""
    groups: dict[tuple[int, str, int], _Group] = {}  # (attempt, key, gpu)
    for s in samples:
        k = (s.attempt, s.model_key or "", s.gpu)
        g = groups.get(k)
        if g is None:
            g = groups[k] = _Group()
        g.add(s)
    latest: dict[str, int] = {}
    for attempt, key, _ in groups:
        latest[key] = max(latest.get(key, 0), attempt)
    keys = [g.result(key, gpu) for (attempt, key, gpu), g in groups.items() if attempt == latest[key]]
    keys.sort(key=lambda k: (k.first_ts, k.model_key, k.gpu))
    return TelemetrySummary(run_id=run_id, module=module, tool=tool, period_s=period_s,
                            samples=sum(k.samples for k in keys), devices=tuple(sorted(devices, key=lambda d: d.gpu)),
                            keys=tuple(keys), notes=tuple(dict.fromkeys(notes)))


def read_samples(path: Path) -> Iterable[DeviceSample]:
    """The samples of a ``telemetry.jsonl`` (a torn or unreadable line is skipped)."""
    try:
        fh = path.open(encoding="utf-8")
    except FileNotFoundError:
        return
    with fh:
        for line in fh:
            if not line.strip():
                continue
            try:
                yield DeviceSample.model_validate(json.loads(line))
            except (ValueError, ValidationError):
                continue
