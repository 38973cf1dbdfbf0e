"""Incremental readers of one run's files: new lines of the JSON lines files, JSON files only when changed.

``LineTail`` and ``JsonFile`` cost one ``stat`` per file and call when nothing changed;
``RunFiles`` keeps what one run's files said (progress, latest release rows, step statistics,
latest device samples) and reads only what was appended since the last call.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import ValidationError

from agent.metrics.catalog import STEP_BUCKETS, step_label
from agent.telemetry import SAMPLES_FILE
from contract.records import DeviceSample, ResultRow, RunProgress
from contract.vocab import CAPACITY_PREFIX


class _Sig(NamedTuple):
    ino: int
    size: int
    mtime_ns: int


def _sig(path: Path) -> _Sig | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return _Sig(st.st_ino, st.st_size, st.st_mtime_ns)


class LineTail:
    """New complete lines of an appended file; starts over when the file is replaced or shrinks."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.ino: int | None = None

    def read(self) -> tuple[bool, list[str]]:
        """(restarted, new complete lines). A half-written last line waits for the next call."""
        sig = _sig(self.path)
        if sig is None:
            restarted = self.offset > 0
            self.offset, self.ino = 0, None
            return restarted, []
        restarted = False
        if sig.ino != self.ino or sig.size < self.offset:
            restarted = self.offset > 0
            self.offset, self.ino = 0, sig.ino
        if sig.size == self.offset:
            return restarted, []
        try:
            with self.path.open("rb") as fh:
                fh.seek(self.offset)
                data = fh.read(sig.size - self.offset)
        except OSError:
            return restarted, []
        end = data.rfind(b"\n")
        if end < 0:
            return restarted, []
        self.offset += end + 1
        return restarted, [ln for ln in data[:end].decode("utf-8", "replace").split("\n") if ln.strip()]


class JsonFile:
    """A small JSON file re-read only when its (inode, size, mtime) changed."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sig: _Sig | None = None
        self.value: Any = None

    def read(self) -> tuple[bool, Any, bool]:
        """(changed, value, error)."""
        sig = _sig(self.path)
        if sig == self.sig:
            return False, self.value, False
        self.sig = sig
        if sig is None:
            self.value = None
            return True, None, False
        try:
            self.value = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            self.sig = None  # try again next scrape (a writer that does not rename)
            return False, self.value, True
        return True, self.value, False


# -- per-run state ------------------------------------------------------------------------
@dataclass
class StepStats:
    buckets: list[int] = field(default_factory=lambda: [0] * len(STEP_BUCKETS))
    count: int = 0
    total: float = 0.0
    failures: int = 0

    def add(self, duration: float | None, failed: bool) -> None:
        if failed:
            self.failures += 1
        if duration is None or duration != duration or duration < 0:
            return
        self.count += 1
        self.total += duration
        for i, le in enumerate(STEP_BUCKETS):
            if duration <= le:
                self.buckets[i] += 1


@dataclass
class RunFiles:
    run_id: str
    folder: Path
    progress_file: JsonFile = field(init=False)
    results: LineTail = field(init=False)
    events: LineTail = field(init=False)
    telemetry: LineTail = field(init=False)
    progress: RunProgress | None = None
    # gpu -> latest sample; (model_key, profile) -> row; the SLO sweep's rows by swept profile
    devices: dict[int, DeviceSample] = field(default_factory=dict)
    rows: dict[tuple[str, str], ResultRow] = field(default_factory=dict)
    capacity: dict[tuple[str, str], ResultRow] = field(default_factory=dict)
    steps: dict[str, StepStats] = field(default_factory=dict)
    folder_mtime: float = 0.0
    terminal_since: float | None = None

    def __post_init__(self) -> None:
        self.progress_file = JsonFile(self.folder / "progress.json")
        self.results = LineTail(self.folder / "results.jsonl")
        self.events = LineTail(self.folder / "events.jsonl")
        self.telemetry = LineTail(self.folder / SAMPLES_FILE)
        try:
            self.folder_mtime = self.folder.stat().st_mtime
        except OSError:
            self.folder_mtime = 0.0

    @property
    def order(self) -> float:
        p = self.progress
        if p is not None:
            return p.started_at or p.updated_at or self.folder_mtime
        return self.folder_mtime

    def refresh(self, errors: dict[str, int]) -> tuple[bool, bool]:
        """Read what changed; returns (results changed, steps changed)."""
        changed_p, raw, err = self.progress_file.read()
        if err:
            errors["progress"] = errors.get("progress", 0) + 1
        if changed_p:
            self.progress = None
            if raw is not None:
                try:
                    self.progress = RunProgress.model_validate(raw)
                except ValidationError:
                    errors["progress"] = errors.get("progress", 0) + 1
        rows_changed = self._read_rows(errors)
        steps_changed = self._read_events(errors)
        return rows_changed or changed_p, steps_changed

    def read_devices(self, errors: dict[str, int]) -> None:
        """The latest sample of each device (read for the current run only; the last new lines parsed)."""
        restarted, lines = self.telemetry.read()
        if restarted:
            self.devices.clear()
        for line in lines[-64:]:
            try:
                s = DeviceSample.model_validate_json(line)
            except ValidationError:
                errors["telemetry"] = errors.get("telemetry", 0) + 1
                continue
            self.devices[s.gpu] = s

    def _read_rows(self, errors: dict[str, int]) -> bool:
        restarted, lines = self.results.read()
        if restarted:
            self.rows.clear()
            self.capacity.clear()
        for line in lines:
            try:
                row = ResultRow.model_validate_json(line)
            except ValidationError:
                errors["results"] = errors.get("results", 0) + 1
                continue
            if row.source == "release":  # the probe's rows only show through the release rows' flags
                self.rows[(row.model_key, row.profile)] = row
            elif row.profile.startswith(CAPACITY_PREFIX):  # and the SLO sweep's, as the capacity series
                self.capacity[(row.model_key, row.profile[len(CAPACITY_PREFIX):])] = row
        return restarted or bool(lines)

    def _read_events(self, errors: dict[str, int]) -> bool:
        restarted, lines = self.events.read()
        if restarted:
            self.steps.clear()
        for line in lines:
            try:
                ev = json.loads(line)
                if not isinstance(ev, dict):
                    raise ValueError("not an object")
                status = str(ev.get("status", ""))
                dur = ev.get("duration_s")
                duration = float(dur) if dur is not None else None
            except (ValueError, TypeError):
                errors["events"] = errors.get("events", 0) + 1
                continue
            if status == "start":
                continue
            stats = self.steps.setdefault(step_label(ev.get("step")), StepStats())
            stats.add(duration if status in ("ok", "failed") else None, status == "failed")
        return restarted or bool(lines)
