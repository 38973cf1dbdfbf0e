"""The agent's Prometheus collector: the series of one workdir, built from its run files per scrape.

Cost per scrape: one ``stat`` per file of each live run, new lines only for the JSON
lines files, re-parse of ``progress.json`` only when it changed, and the merged result
view rebuilt only when some run changed. Finished runs are no longer polled once they
have been seen finished for ``settle_s`` seconds.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from pydantic import ValidationError

from agent.metrics.catalog import KEY_STATUSES, PREFIX, RESULT_FIELDS, SPECS, STEP_BUCKETS, label_value, step_label
from agent.metrics.readers import JsonFile, RunFiles, StepStats
from agent.metrics.system import SystemProbe, SystemSample
from agent.telemetry.exposition import device_families
from contract.records import Heartbeat, ResultRow, RunState
from contract.version import SCHEMA_VERSION
from contract.version import agent_version as agent_version

log = logging.getLogger(__package__)

# device samples older than this are not exposed (the run ended, or the tool fails)
DEVICE_FRESH_S = 60.0
# agent.probe.compare.FLAG (not imported: the exporter stays light)
DISAGREES = "release_benchmark_disagrees"


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
            # device readings while they are fresh: never a card's state of hours ago
            if current is not None:
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
        fams = {name: self._family(name) for _, name, _ in RESULT_FIELDS}
        per_key: dict[tuple[str, str], list[Any]] = {}  # (release, key) -> [rows, correct, answered, ts, disagree,
        # jit kernels, server ready s, first request s]
        precompile: dict[tuple[str, str], tuple[float, float]] = {}  # (release, column) -> (order, seconds)
        for (release, key, profile), (order, row) in sorted(latest.items()):
            if release not in keep:
                continue
            for attr, name, mult in RESULT_FIELDS:
                v = getattr(row, attr)
                if v is not None:
                    fams[name].add_metric((release, key, profile), float(v) * mult)
            agg = per_key.setdefault((release, key), [0, 0, 0, 0.0, 0, 0, None, None])
            agg[0] += 1
            agg[4] += int(DISAGREES in row.flags)
            # every release row of the key carries its benchmark's count, and its start-up costs
            agg[5] = max(agg[5], row.jit_kernels)
            if row.server_ready_s is not None:
                agg[6], agg[7] = row.server_ready_s, row.warmup_s
            for column, v in (("precompile_s", row.precompile_s), ("precompile_fetch_s", row.precompile_fetch_s)):
                if v is not None and order >= precompile.get((release, column), (-1.0, 0.0))[0]:
                    precompile[(release, column)] = (order, v)
            if row.correct is not None:
                agg[1] += int(row.correct)
                agg[2] += 1
            agg[3] = max(agg[3], order)
        yield from fams.values()
        acc = self._family(f"{PREFIX}_result_gsm8k_accuracy_ratio")
        nrows = self._family(f"{PREFIX}_result_rows")
        ts = self._family(f"{PREFIX}_result_timestamp_seconds")
        disagree = self._family(f"{PREFIX}_result_release_benchmark_disagreements")
        jit = self._family(f"{PREFIX}_result_jit_kernels")
        ready = self._family(f"{PREFIX}_result_server_ready_seconds")
        first = self._family(f"{PREFIX}_result_first_request_seconds")
        for (release, key), (n, correct, answered, order, flagged, kernels, up, warm) in sorted(per_key.items()):
            nrows.add_metric((release, key), n)
            ts.add_metric((release, key), order)
            disagree.add_metric((release, key), flagged)
            jit.add_metric((release, key), kernels)
            if up is not None:
                ready.add_metric((release, key), up)
            if warm is not None:
                first.add_metric((release, key), warm)
            if answered:
                acc.add_metric((release, key), correct / answered)
        compiled = self._family(f"{PREFIX}_result_precompile_seconds")
        fetched = self._family(f"{PREFIX}_result_precompile_fetch_seconds")
        for (release, column), (_, v) in sorted(precompile.items()):
            (compiled if column == "precompile_s" else fetched).add_metric((release,), v)
        yield from (acc, nrows, ts, disagree, jit, ready, first, compiled, fetched)
        yield from self._capacity_metrics(runs, keep)

    def _capacity_metrics(self, runs: list[RunFiles], keep: set[str]) -> Iterator[Metric]:
        """The latest SLO sweep per (release, key, profile): its capacity and that capacity's throughput."""
        latest: dict[tuple[str, str, str], ResultRow] = {}
        for rf in runs:
            fallback = rf.progress.release if rf.progress else ""
            for (key, profile), row in rf.capacity.items():
                latest[(label_value(row.release or fallback), label_value(key), label_value(profile))] = row
        conc = self._family(f"{PREFIX}_result_capacity_concurrency")
        tps = self._family(f"{PREFIX}_result_capacity_output_tokens_per_second")
        for labels, row in sorted(latest.items()):
            if labels[0] not in keep:
                continue
            conc.add_metric(labels, float(row.batch or 0))
            if "output_tps" in row.extra:
                tps.add_metric(labels, float(row.extra["output_tps"]))
        yield from (conc, tps)

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
        info.add_metric((), {"version": label_value(self.version), "contract": str(SCHEMA_VERSION), "python": py})
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
        except Exception as exc:  # a probe failure must not break the scrape
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
