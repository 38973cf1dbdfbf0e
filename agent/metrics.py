"""The agent's Prometheus exporter: a custom collector over the run files of one workdir.

The pipeline and the worker write plain files under the module's workdir; this module
only reads them (one reader per file, incremental), so the same exporter works inside the
Celery worker, as a separate ``fleet-agent exporter`` process and next to ``fleet-agent run``::

    <workdir>/state.json                 {"current_run", "last_run", "updated_at"}
    <workdir>/heartbeat.json             a Heartbeat record (written by the worker)
    <workdir>/runs/<run_id>/progress.json   latest RunProgress (atomically replaced)
    <workdir>/runs/<run_id>/results.jsonl   one ResultRow per line (appended)
    <workdir>/runs/<run_id>/events.jsonl    one step start/end per line (appended)
    <workdir>/runs/<run_id>/telemetry.jsonl one DeviceSample per device and period (appended)

Every series is listed in :data:`CATALOG` (name, type, labels, unit); ``README.md`` (Metric list)
is kept in step with it by a test. Labels are bounded: release, model key, profile, state,
step, status, window, gpu; never run ids, paths or free text. The agent's series carry no
``module`` label: Prometheus adds it as a target label (file_sd) and the Pushgateway as a
grouping key.

Cost per scrape: one ``stat`` per file of each live run, new lines only for the JSON
lines files, re-parse of ``progress.json`` only when it changed, and the merged result
view rebuilt only when some run changed. Finished runs are no longer polled once they
have been seen finished for ``settle_s`` seconds.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
import shutil
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any, NamedTuple
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, ProcessCollector, make_wsgi_app, push_to_gateway
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from pydantic import ValidationError

from agent.telemetry import SAMPLES_FILE
from agent.telemetry.exposition import DEVICE_METRICS, device_families
from contract.records import DeviceSample, Heartbeat, ResultRow, RunProgress, RunState
from contract.redact import redact_url
from contract.version import agent_version

log = logging.getLogger(__name__)

PREFIX = "m1000"
DEFAULT_PORT = 9400
PUSH_JOB = "m1000-agent"
STEP_BUCKETS: tuple[float, ...] = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200)
DEVICE_FRESH_S = 60.0  # device samples older than this are not exposed (the run ended, or the tool fails)
KEY_STATUSES: tuple[str, ...] = ("pending", "running", "passed", "failed", "cancelled", "skipped")
_SAFE = re.compile(r"^[A-Za-z0-9_.:+-]{1,64}$")
DISAGREES = "release_benchmark_disagrees"  # agent.probe.compare.FLAG (not imported: the exporter stays light)
_STEP = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


# -- the metric list ------------------------------------------------------------------------
class MetricSpec(NamedTuple):
    name: str  # as exposed (histograms: the base name; counters: with _total)
    type: str  # gauge | counter | histogram | info
    labels: tuple[str, ...]
    unit: str  # seconds | bytes | ratio | tokens_per_second | frames_per_second | celsius | timestamp_seconds | count
    help: str


_R = ("release", "model_key", "profile")
CATALOG: tuple[MetricSpec, ...] = (
    # latest results per (release, model key, profile)
    MetricSpec(f"{PREFIX}_result_ttft_seconds", "gauge", _R, "seconds", "Time to first token of the latest result"),
    MetricSpec(f"{PREFIX}_result_tpot_seconds", "gauge", _R, "seconds", "Time per output token of the latest result"),
    MetricSpec(f"{PREFIX}_result_prefill_tokens_per_second", "gauge", _R, "tokens_per_second",
               "Prefill throughput of the latest result"),
    MetricSpec(f"{PREFIX}_result_decode_tokens_per_second", "gauge", _R, "tokens_per_second",
               "Decode throughput of the latest result"),
    MetricSpec(f"{PREFIX}_result_mtp_accept_ratio", "gauge", _R, "ratio",
               "MTP accept rate (acclen-1)/(4-1) of the latest GSM8K prompt result"),
    MetricSpec(f"{PREFIX}_result_mtp_accept_length_ratio", "gauge", _R, "ratio",
               "MTP accept rate acclen/4 of the latest GSM8K prompt result"),
    MetricSpec(f"{PREFIX}_result_gsm8k_accuracy_ratio", "gauge", ("release", "model_key"), "ratio",
               "Share of GSM8K prompts answered correctly in the latest results"),
    MetricSpec(f"{PREFIX}_result_vision_frames_per_second", "gauge", _R, "frames_per_second",
               "Vision frames per second of the latest result"),
    MetricSpec(f"{PREFIX}_result_rows", "gauge", ("release", "model_key"), "count",
               "Result rows behind the latest figures of a model key"),
    MetricSpec(f"{PREFIX}_result_release_benchmark_disagreements", "gauge", ("release", "model_key"), "count",
               "Latest result rows of a model key whose figures the agent's probe contradicts"),
    MetricSpec(f"{PREFIX}_result_timestamp_seconds", "gauge", ("release", "model_key"), "timestamp_seconds",
               "Start time of the run that produced the latest figures of a model key"),
    # the current (or last) run
    MetricSpec(f"{PREFIX}_run_state", "gauge", ("state",), "count", "1 for the state of the current or last run"),
    MetricSpec(f"{PREFIX}_run_step_info", "info", ("release", "step", "model_key"), "count",
               "Release, step and model key of the current or last run"),
    MetricSpec(f"{PREFIX}_run_active", "gauge", (), "count", "1 while a run is in progress"),
    MetricSpec(f"{PREFIX}_run_progress_ratio", "gauge", (), "ratio", "Progress of the current or last run"),
    MetricSpec(f"{PREFIX}_run_model_keys", "gauge", (), "count", "Model keys planned in the current or last run"),
    MetricSpec(f"{PREFIX}_run_model_keys_done", "gauge", (), "count", "Model keys finished in the current or last run"),
    MetricSpec(f"{PREFIX}_run_model_key_outcomes", "gauge", ("status",), "count",
               "Model keys of the current or last run by status"),
    MetricSpec(f"{PREFIX}_run_rows", "gauge", (), "count", "Result rows of the current or last run"),
    MetricSpec(f"{PREFIX}_run_attempt", "gauge", (), "count", "Delivery attempt of the current or last run"),
    MetricSpec(f"{PREFIX}_run_started_timestamp_seconds", "gauge", (), "timestamp_seconds",
               "Start time of the current or last run"),
    MetricSpec(f"{PREFIX}_run_updated_timestamp_seconds", "gauge", (), "timestamp_seconds",
               "Last progress update of the current or last run"),
    MetricSpec(f"{PREFIX}_run_finished_timestamp_seconds", "gauge", (), "timestamp_seconds",
               "End time of the last run (absent while it runs)"),
    MetricSpec(f"{PREFIX}_step_duration_seconds", "histogram", ("step",), "seconds",
               "Duration of finished pipeline steps, all runs kept in the workdir"),
    MetricSpec(f"{PREFIX}_step_failures_total", "counter", ("step",), "count",
               "Failed pipeline steps, all runs kept in the workdir"),
    # the agent
    MetricSpec(f"{PREFIX}_agent_up", "gauge", (), "count", "1 while the agent's exporter serves"),
    MetricSpec(f"{PREFIX}_agent_info", "info", ("version", "python"), "count", "Agent version"),
    MetricSpec(f"{PREFIX}_agent_healthy", "gauge", (), "count", "Health the worker reported in its last heartbeat"),
    MetricSpec(f"{PREFIX}_agent_last_heartbeat_timestamp_seconds", "gauge", (), "timestamp_seconds",
               "Time of the worker's last heartbeat (the module's clock)"),
    MetricSpec(f"{PREFIX}_agent_heartbeat_age_seconds", "gauge", (), "seconds",
               "Age of the worker's last heartbeat, both ends on the module's clock (whatever its skew)"),
    MetricSpec(f"{PREFIX}_exporter_read_errors_total", "counter", ("file",), "count",
               "Lines or files of the workdir the exporter could not read"),
    # the module
    MetricSpec(f"{PREFIX}_module_load_average", "gauge", ("window",), "count", "System load average"),
    MetricSpec(f"{PREFIX}_module_memory_total_bytes", "gauge", (), "bytes", "Total memory"),
    MetricSpec(f"{PREFIX}_module_memory_available_bytes", "gauge", (), "bytes", "Available memory"),
    MetricSpec(f"{PREFIX}_module_workdir_free_bytes", "gauge", (), "bytes", "Free disk space of the work folder"),
    MetricSpec(f"{PREFIX}_module_workdir_size_bytes", "gauge", (), "bytes", "Size of the work folder's filesystem"),
    MetricSpec(f"{PREFIX}_module_gpu_utilization_ratio", "gauge", ("gpu",), "ratio",
               "GPU busy share where sysfs exposes it without root (absent otherwise)"),
    MetricSpec(f"{PREFIX}_module_gpu_temperature_celsius", "gauge", ("gpu",), "celsius",
               "GPU temperature where sysfs exposes it without root (absent otherwise)"),
    # the module's devices, sampled by the device tool while a run is in progress (agent.telemetry)
    *(MetricSpec(m.name, m.type, m.labels, m.unit, m.help) for m in DEVICE_METRICS),
)
SPECS: dict[str, MetricSpec] = {s.name: s for s in CATALOG}

# ResultRow field -> (metric name, multiplier to the metric's base unit)
_RESULT_FIELDS: tuple[tuple[str, str, float], ...] = (
    ("ttft_ms", f"{PREFIX}_result_ttft_seconds", 1e-3),
    ("tpot_ms", f"{PREFIX}_result_tpot_seconds", 1e-3),
    ("prefill_tps", f"{PREFIX}_result_prefill_tokens_per_second", 1.0),
    ("decode_tps", f"{PREFIX}_result_decode_tokens_per_second", 1.0),
    ("accept_rate", f"{PREFIX}_result_mtp_accept_ratio", 1.0),
    ("accept_rate_len", f"{PREFIX}_result_mtp_accept_length_ratio", 1.0),
    ("vision_fps", f"{PREFIX}_result_vision_frames_per_second", 1.0),
)


def label_value(text: str | None, fallback: str = "unknown") -> str:
    """A bounded, safe label value: the text if it is a short plain token, else ``fallback``."""
    return text if text and _SAFE.match(text) else fallback


def step_label(text: str | None) -> str:
    return text if text and _STEP.match(text) else "other"


# -- incremental file readers -------------------------------------------------------------
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
    devices: dict[int, DeviceSample] = field(default_factory=dict)  # gpu -> latest sample
    rows: dict[tuple[str, str], ResultRow] = field(default_factory=dict)  # (model_key, profile) -> row
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
        for line in lines:
            try:
                row = ResultRow.model_validate_json(line)
            except ValidationError:
                errors["results"] = errors.get("results", 0) + 1
                continue
            if row.source == "release":  # the probe's rows only show through the release rows' flags
                self.rows[(row.model_key, row.profile)] = row
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


# -- module probes ------------------------------------------------------------------------
@dataclass(frozen=True)
class SystemSample:
    load: tuple[float, float, float] | None = None
    mem_total: int | None = None
    mem_available: int | None = None
    disk_free: int | None = None
    disk_total: int | None = None
    gpu_util: dict[str, float] = field(default_factory=dict)  # gpu -> 0..1
    gpu_temp: dict[str, float] = field(default_factory=dict)  # gpu -> degrees Celsius


def _read_number(path: Path) -> float | None:
    try:
        return float(path.read_text(encoding="ascii").strip())
    except (OSError, ValueError):
        return None


@dataclass(frozen=True)
class GpuFiles:
    """sysfs files that give GPU figures without root, found once at start."""

    util: tuple[tuple[str, Path], ...] = ()  # percent files
    temp: tuple[tuple[str, Path], ...] = ()  # millidegree files

    @classmethod
    def discover(cls, sys_root: Path = Path("/sys")) -> GpuFiles:
        util: list[tuple[str, Path]] = []
        temp: list[tuple[str, Path]] = []
        for card in sorted((sys_root / "class" / "drm").glob("card[0-9]*")):
            if "-" in card.name:  # connectors (card0-HDMI-A-1)
                continue
            dev = card / "device"
            busy = dev / "gpu_busy_percent"
            if _read_number(busy) is not None:
                util.append((card.name, busy))
            for t in sorted(dev.glob("hwmon/hwmon*/temp1_input")):
                if _read_number(t) is not None:
                    temp.append((card.name, t))
                    break
        for zone in sorted((sys_root / "class" / "thermal").glob("thermal_zone*")):
            try:
                kind = (zone / "type").read_text(encoding="ascii").strip()
            except OSError:
                continue
            if "gpu" in kind.lower() and _read_number(zone / "temp") is not None:
                temp.append((label_value(kind, zone.name), zone / "temp"))
        return cls(tuple(util), tuple(temp))


class SystemProbe:
    """Load, memory, disk of the work folder, GPU where readable. Absent figures stay None."""

    def __init__(self, workdir: Path, sys_root: Path = Path("/sys")) -> None:
        self.workdir = workdir
        self.gpus = GpuFiles.discover(sys_root)

    def __call__(self) -> SystemSample:
        import psutil

        try:
            load: tuple[float, float, float] | None = os.getloadavg()
        except OSError:
            load = None
        vm = psutil.virtual_memory()
        try:
            du = shutil.disk_usage(self.workdir)
            free, total = int(du.free), int(du.total)
        except OSError:
            free = total = None  # type: ignore[assignment]
        util = {g: v / 100.0 for g, p in self.gpus.util if (v := _read_number(p)) is not None}
        temp = {g: v / 1000.0 for g, p in self.gpus.temp if (v := _read_number(p)) is not None}
        return SystemSample(load, int(vm.total), int(vm.available), free, total, util, temp)


# -- the collector ------------------------------------------------------------------------
class AgentCollector(Collector):
    """Everything the agent exports, read from one workdir. Thread-safe; one per workdir."""

    def __init__(self, workdir: str | Path, module: str = "", *, version: str | None = None,
                 system: Callable[[], SystemSample] | None = None, keep_releases: int = 3,
                 settle_s: float = 60.0, clock: Callable[[], float] = time.time) -> None:
        self.workdir = Path(workdir)
        self.module = module
        self.version = version or agent_version()
        self.system = system if system is not None else SystemProbe(self.workdir)
        self.keep_releases = keep_releases
        self.settle_s = settle_s
        self.clock = clock
        self._lock = threading.Lock()
        self._runs: dict[str, RunFiles] = {}
        self._state = JsonFile(self.workdir / "state.json")
        self._heartbeat = JsonFile(self.workdir / "heartbeat.json")
        self._errors: dict[str, int] = {}
        self._latest: list[Metric] = []
        self._steps: list[Metric] = []
        self._version = 0

    # -- intake ----------------------------------------------------------------------------
    def _scan(self) -> tuple[bool, bool]:
        runs_dir = self.workdir / "runs"
        try:
            names = {e.name for e in os.scandir(runs_dir) if e.is_dir(follow_symlinks=False)}
        except OSError:
            names = set()
        rows_changed = steps_changed = False
        for gone in set(self._runs) - names:
            del self._runs[gone]
            rows_changed = steps_changed = True
        now = self.clock()
        for name in names:
            rf = self._runs.get(name)
            if rf is None:
                rf = self._runs[name] = RunFiles(name, runs_dir / name)
            elif rf.terminal_since is not None and now - rf.terminal_since > self.settle_s:
                continue  # finished and settled: no more polling
            r, s = rf.refresh(self._errors)
            rows_changed |= r
            steps_changed |= s
            if rf.progress is not None and rf.progress.state.terminal:
                rf.terminal_since = rf.terminal_since or now
            else:
                rf.terminal_since = None
        return rows_changed, steps_changed

    def _current(self) -> RunFiles | None:
        _, state, err = self._state.read()
        if err:
            self._errors["state"] = self._errors.get("state", 0) + 1
        if isinstance(state, dict):
            for key in ("current_run", "last_run"):
                rid = state.get(key)
                if isinstance(rid, str) and rid in self._runs:
                    return self._runs[rid]
        with_progress = [r for r in self._runs.values() if r.progress is not None]
        return max(with_progress, key=lambda r: r.order, default=None)

    # -- exposition --------------------------------------------------------------------------
    def snapshot(self) -> tuple[int, list[Metric], list[Metric]]:
        """(version, slow-changing families, per-scrape families); the version moves when the first change."""
        with self._lock:
            rows_changed, steps_changed = self._scan()
            if rows_changed or not self._latest:
                self._latest = list(self._result_metrics())
                self._version += 1
            if steps_changed or not self._steps:
                self._steps = list(self._step_metrics())
                self._version += 1
            current = self._current()
            dynamic = [*self._run_metrics(current), *self._agent_metrics()]
            if current is not None:  # device readings while they are fresh: never a card's state of hours ago
                current.read_devices(self._errors)
                since = self.clock() - DEVICE_FRESH_S
                dynamic.extend(device_families([d for d in current.devices.values() if d.ts >= since], label_value))
            version, static = self._version, [*self._latest, *self._steps]
        dynamic.extend(self._module_metrics())
        return version, static, dynamic

    def collect(self) -> Iterable[Metric]:
        _, static, dynamic = self.snapshot()
        return [*static, *dynamic]

    def _family(self, name: str, **kw: Any) -> Any:
        spec = SPECS[name]
        labels = None if "value" in kw else spec.labels
        if spec.type == "gauge":
            return GaugeMetricFamily(name, spec.help, labels=labels, **kw)
        if spec.type == "counter":
            return CounterMetricFamily(name, spec.help, labels=labels, **kw)
        return HistogramMetricFamily(name, spec.help, labels=labels, **kw)

    def _result_metrics(self) -> Iterator[Metric]:
        runs = sorted(self._runs.values(), key=lambda r: r.order)
        latest: dict[tuple[str, str, str], tuple[float, ResultRow]] = {}
        release_seen: dict[str, float] = {}
        for rf in runs:
            fallback = rf.progress.release if rf.progress else ""
            for (key, profile), row in rf.rows.items():
                release = label_value(row.release or fallback)
                latest[(release, label_value(key), label_value(profile))] = (rf.order, row)
                release_seen[release] = max(release_seen.get(release, 0.0), rf.order)
        keep = set(sorted(release_seen, key=lambda r: release_seen[r], reverse=True)[: self.keep_releases])
        fams = {name: self._family(name) for _, name, _ in _RESULT_FIELDS}
        per_key: dict[tuple[str, str], list[Any]] = {}  # (release, key) -> [rows, correct, answered, ts, disagree]
        for (release, key, profile), (order, row) in sorted(latest.items()):
            if release not in keep:
                continue
            for attr, name, mult in _RESULT_FIELDS:
                v = getattr(row, attr)
                if v is not None:
                    fams[name].add_metric((release, key, profile), float(v) * mult)
            agg = per_key.setdefault((release, key), [0, 0, 0, 0.0, 0])
            agg[0] += 1
            agg[4] += int(DISAGREES in row.flags)
            if row.correct is not None:
                agg[1] += int(row.correct)
                agg[2] += 1
            agg[3] = max(agg[3], order)
        yield from fams.values()
        acc = self._family(f"{PREFIX}_result_gsm8k_accuracy_ratio")
        nrows = self._family(f"{PREFIX}_result_rows")
        ts = self._family(f"{PREFIX}_result_timestamp_seconds")
        disagree = self._family(f"{PREFIX}_result_release_benchmark_disagreements")
        for (release, key), (n, correct, answered, order, flagged) in sorted(per_key.items()):
            nrows.add_metric((release, key), n)
            ts.add_metric((release, key), order)
            disagree.add_metric((release, key), flagged)
            if answered:
                acc.add_metric((release, key), correct / answered)
        yield from (acc, nrows, ts, disagree)

    def _step_metrics(self) -> Iterator[Metric]:
        total: dict[str, StepStats] = {}
        for rf in self._runs.values():
            for step, st in rf.steps.items():
                agg = total.setdefault(step, StepStats())
                agg.count += st.count
                agg.total += st.total
                agg.failures += st.failures
                agg.buckets = [a + b for a, b in zip(agg.buckets, st.buckets, strict=True)]
        hist = self._family(f"{PREFIX}_step_duration_seconds")
        fails = self._family(f"{PREFIX}_step_failures_total")
        for step, st in sorted(total.items()):
            buckets = [(_le(le), float(c)) for le, c in zip(STEP_BUCKETS, st.buckets, strict=True)]
            buckets.append(("+Inf", float(st.count)))
            hist.add_metric((step,), buckets, st.total)
            fails.add_metric((step,), st.failures)
        yield from (hist, fails)

    def _run_metrics(self, rf: RunFiles | None) -> Iterator[Metric]:
        if rf is None or rf.progress is None:
            return
        p = rf.progress
        state = self._family(f"{PREFIX}_run_state")
        for s in RunState:
            state.add_metric((s.value,), 1.0 if p.state is s else 0.0)
        yield state
        info = InfoMetricFamily(f"{PREFIX}_run_step", SPECS[f"{PREFIX}_run_step_info"].help)
        info.add_metric((), {"release": label_value(p.release), "step": step_label(p.step or p.state.value),
                             "model_key": label_value(p.model_key, "none")})
        yield info
        simple = {
            "run_active": 0.0 if p.state.terminal else 1.0,
            "run_progress_ratio": p.progress,
            "run_model_keys": p.keys_total,
            "run_model_keys_done": p.keys_done,
            "run_rows": max(p.rows, len(rf.rows)),
            "run_attempt": p.attempt,
            "run_started_timestamp_seconds": p.started_at,
            "run_updated_timestamp_seconds": p.updated_at or None,
            "run_finished_timestamp_seconds": p.finished_at,
        }
        for short, value in simple.items():
            if value is not None:
                yield self._family(f"{PREFIX}_{short}", value=float(value))
        outcomes = self._family(f"{PREFIX}_run_model_key_outcomes")
        counts = dict.fromkeys(KEY_STATUSES, 0)
        for o in p.outcomes:
            counts[o.status] = counts.get(o.status, 0) + 1
        for status, n in counts.items():
            outcomes.add_metric((status,), n)
        yield outcomes

    def _agent_metrics(self) -> Iterator[Metric]:
        yield self._family(f"{PREFIX}_agent_up", value=1.0)
        _, raw, err = self._heartbeat.read()
        if err:
            self._errors["heartbeat"] = self._errors.get("heartbeat", 0) + 1
        hb: Heartbeat | None = None
        if raw is not None:
            try:
                hb = Heartbeat.model_validate(raw)
            except ValidationError:
                self._errors["heartbeat"] = self._errors.get("heartbeat", 0) + 1
        info = InfoMetricFamily(f"{PREFIX}_agent", SPECS[f"{PREFIX}_agent_info"].help)
        py = f"{sys.version_info.major}.{sys.version_info.minor}"
        info.add_metric((), {"version": label_value(self.version), "python": py})
        yield info
        if hb is not None:
            yield self._family(f"{PREFIX}_agent_healthy", value=1.0 if hb.healthy else 0.0)
            yield self._family(f"{PREFIX}_agent_last_heartbeat_timestamp_seconds", value=hb.ts)
            # on the module's own clock at both ends: `time() - timestamp` would add the module's clock skew
            yield self._family(f"{PREFIX}_agent_heartbeat_age_seconds", value=max(0.0, time.time() - hb.ts))
        errs = self._family(f"{PREFIX}_exporter_read_errors_total")
        for name in ("state", "heartbeat", "progress", "results", "events", "telemetry"):
            errs.add_metric((name,), self._errors.get(name, 0))
        yield errs

    def _module_metrics(self) -> Iterator[Metric]:
        try:
            s = self.system()
        except Exception as exc:  # noqa: BLE001 - a probe failure must not break the scrape
            log.warning("module probe failed: %s", exc)
            return
        if s.load is not None:
            load = self._family(f"{PREFIX}_module_load_average")
            for window, v in zip(("1m", "5m", "15m"), s.load, strict=True):
                load.add_metric((window,), v)
            yield load
        for short, value in (("memory_total_bytes", s.mem_total), ("memory_available_bytes", s.mem_available),
                             ("workdir_free_bytes", s.disk_free), ("workdir_size_bytes", s.disk_total)):
            if value is not None:
                yield self._family(f"{PREFIX}_module_{short}", value=float(value))
        for short, values in (("gpu_utilization_ratio", s.gpu_util), ("gpu_temperature_celsius", s.gpu_temp)):
            if values:
                fam = self._family(f"{PREFIX}_module_{short}")
                for gpu, v in sorted(values.items()):
                    fam.add_metric((gpu,), v)
                yield fam


def _le(v: float) -> str:
    return str(float(v))


# -- API -----------------------------------------------------------------------------------
class _Families:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


class AgentRegistry(CollectorRegistry):
    """A registry of its own whose exposition caches the rendering of the result and step series.

    ``collect()`` / ``get_sample_value()`` behave as in any registry; :meth:`render` (what
    the HTTP server calls) re-encodes only the series that change per scrape.
    """

    def __init__(self, agent: AgentCollector, process: bool = True) -> None:
        super().__init__(auto_describe=False)
        self.agent = agent
        self.register(agent)
        self.others: list[Collector] = []
        if process:
            pc = ProcessCollector(registry=None)
            self.register(pc)
            self.others.append(pc)
        self._cache: dict[tuple[int, str, bool], bytes] = {}

    def render(self, accept: str = "", gzip_ok: bool = False) -> tuple[bytes, str]:
        """(body, content type) for a scrape with this Accept header; gzip as concatenated members."""
        encoder, ctype = choose_encoder(accept)
        version, static, dynamic = self.agent.snapshot()
        for c in self.others:
            dynamic.extend(c.collect())
        key = (version, ctype, gzip_ok)
        head = self._cache.get(key)
        if head is None:
            head = encoder(_Families(static))
            if head.endswith(_EOF):
                head = head[: -len(_EOF)]
            if gzip_ok:
                head = gzip.compress(head, compresslevel=6)
            self._cache = {k: v for k, v in self._cache.items() if k[0] == version}
            self._cache[key] = head
        tail = encoder(_Families(dynamic))
        return head + (gzip.compress(tail, compresslevel=1) if gzip_ok else tail), ctype


_EOF = b"# EOF\n"


def build_registry(workdir: str | Path, module: str = "", *, process: bool = True,
                   **kwargs: Any) -> AgentRegistry:
    """A registry of its own with the agent's collector (and this process's CPU/RSS)."""
    return AgentRegistry(AgentCollector(workdir, module, **kwargs), process=process)


class _SilentHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - signature of the base class
        pass


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


def metrics_app(registry: CollectorRegistry) -> Callable[..., Any]:
    """WSGI app serving ``/metrics`` (and ``/``) from ``registry``; cached rendering for an AgentRegistry."""
    fallback = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO", "/") not in ("/", "/metrics"):
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found: try /metrics\n"]
        if not isinstance(registry, AgentRegistry) or environ.get("QUERY_STRING"):
            return fallback(environ, start_response)  # type: ignore[no-any-return]
        gz = "gzip" in environ.get("HTTP_ACCEPT_ENCODING", "")
        body, ctype = registry.render(environ.get("HTTP_ACCEPT", ""), gz)
        headers = [("Content-Type", ctype), ("Content-Length", str(len(body)))]
        if gz:
            headers.append(("Content-Encoding", "gzip"))
        start_response("200 OK", headers)
        return [body]

    return app


def start_exporter(workdir: str | Path, module: str = "", host: str = "127.0.0.1", port: int = DEFAULT_PORT,
                   registry: CollectorRegistry | None = None, **kwargs: Any) -> tuple[WSGIServer, threading.Thread]:
    """Serve ``/metrics`` on ``host:port`` (loopback unless told otherwise) in a daemon thread.

    Returns ``(server, thread)`` like prometheus_client's ``start_http_server``;
    ``server.shutdown(); server.server_close()`` stops it. ``port=0`` picks a free port
    (``server.server_port``).
    """
    reg = registry if registry is not None else build_registry(workdir, module, **kwargs)
    cls = _Server6 if ":" in host else _Server
    server = make_server(host, port, metrics_app(reg), cls, handler_class=_SilentHandler)
    thread = threading.Thread(target=server.serve_forever, name="m1000-exporter", daemon=True)
    thread.start()
    return server, thread


def push_once(registry: CollectorRegistry, gateway: str, module: str, *, job: str = PUSH_JOB,
              timeout: float = 2.0) -> bool:
    """Push the registry to a Pushgateway once (grouping key ``module``). Never raises.

    Returns True when the gateway took it. A slow or absent gateway costs at most ``timeout``
    seconds and a warning in the log (the URL without credentials); the run goes on.
    """
    try:
        push_to_gateway(gateway, job=job, registry=registry, grouping_key={"module": module}, timeout=timeout)
    except Exception as exc:  # noqa: BLE001 - the push is optional: it must never fail a run
        log.warning("push to %s failed: %s", redact_url(gateway), type(exc).__name__)
        return False
    return True


class Pusher:
    """Pushes every ``interval`` seconds from a daemon thread; ``stop()`` pushes a last time."""

    def __init__(self, registry: CollectorRegistry, gateway: str, module: str, *, interval: float = 15.0,
                 timeout: float = 2.0, job: str = PUSH_JOB) -> None:
        self.args = (registry, gateway, module)
        self.kw: dict[str, Any] = {"timeout": timeout, "job": job}
        self.interval = interval
        self.pushes = 0
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="m1000-pusher", daemon=True)

    def start(self) -> Pusher:
        self._thread.start()
        return self

    def _once(self) -> None:
        if push_once(*self.args, **self.kw):
            self.pushes += 1
        else:
            self.failures += 1

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._once()
            self._stop.wait(self.interval)

    def stop(self, final_push: bool = True) -> None:
        self._stop.set()
        self._thread.join(timeout=self.kw["timeout"] + 1.0)
        if final_push:
            self._once()
