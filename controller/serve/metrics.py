"""The controller's Prometheus collector: fleet state, runs by verdict, deviation from baselines, queues,
change points across the release history.

``fleetctl serve`` registers a :class:`ControllerCollector` in a registry of its own and
serves it. Module states and queue lengths come from callables the caller supplies (the
fleet's heartbeats and broker), and so do the reservations; the rest is read from the run history (SQLite).

Deviation from the baseline, per module, for that module's latest run with rows: for each
model key and metric, the geometric mean over the profiles both have of the *performance
ratio* — value / baseline for higher-is-better figures (tok/s, fps, accept rates),
baseline / value for lower-is-better ones (TTFT, TPOT). 1 is on par, below 1 is worse:
0.9 means 10 % slower. The baseline is the newest baseline of the run's release, else the
newest baseline of any release. The baseline's own figures are exported too
(``m1000_baseline_*``, same units as the agents' ``m1000_result_*``) so that dashboards can
draw each module's figures against them.

Change points in force (``m1000_trend_change_points``) are those of ``fleetctl trend`` with the default
settings over the whole history, counted per (model key, metric, scope), read from the findings the history
keeps (:mod:`controller.report.kept`, ADR 0043): when the history changed since they were computed, a scrape
starts their computation in a thread of its own and waits for it at most ``trend_wait`` seconds, then answers with
the findings kept (of the history before the change, until the computation ends): the search over a long history
takes minutes, a scrape must answer within Prometheus' timeout.

Lazy imports: the findings' modules (:mod:`controller.report.kept`, :mod:`~controller.report.model`) load pandas
(462 ms of CPU, 88 MiB: ``bench/import_costs.py``, bench/results/import_costs_20261207_0346_lazy-libraries.txt) at
the first scrape that reads change points, not when ``fleetctl serve`` starts its collector.
"""

from __future__ import annotations

import logging
import math
import statistics
import threading
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NamedTuple

from prometheus_client.metrics_core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from contract.records import METRICS, STARTUP_METRICS, ResultRow
from contract.vocab import MetricSpec, label_value
from controller.history import DatabaseError, History, RunInfo

log = logging.getLogger(__name__)

MODULE_STATES: tuple[str, ...] = ("idle", "busy", "unreachable", "offline", "bad")
RECENT_RUNS = 50

CATALOG: tuple[MetricSpec, ...] = (
    MetricSpec("m1000_fleet_modules", "gauge", ("state",), "count", "Modules per state"),
    MetricSpec("m1000_fleet_module_state", "gauge", ("module", "state"), "count", "1 for the state a module is in"),
    MetricSpec("m1000_fleet_module_clock_skew_seconds", "gauge", ("module",), "seconds",
               "A module's clock minus the controller's, measured from its last heartbeat (whose age is the"
               " broker's)"),
    MetricSpec("m1000_fleet_module_reserved", "gauge", ("module", "user"), "count",
               "1 while a user holds a reservation of the module (fleetctl reserve); absent when none"),
    MetricSpec("m1000_fleet_runs", "gauge", ("verdict",), "count",
               "Runs in the history by verdict ('none' while running)"),
    MetricSpec("m1000_fleet_power_cycles", "gauge", ("module", "result"), "count",
               "Power cycles of a hung module the recovery policy asked of its PDU, in the history, by result (done:"
               " pdudaemon did it; failed: it did not answer, the module needed attention)"),
    MetricSpec("m1000_fleet_queue_length", "gauge", ("queue", "priority"), "count",
               "Messages waiting in a broker queue, by priority (urgent, high, normal, low)"),
    MetricSpec("m1000_fleet_run_wait_seconds", "histogram", ("priority",), "seconds",
               "How long each module's part of a run waited on its queue, from the run's dispatch to the module's"
               " start (the module's clock), by the priority it was dispatched at; every part in the history"),
    MetricSpec("m1000_fleet_baseline_ratio", "gauge", ("module", "release", "model_key", "metric"), "ratio",
               "Performance against the baseline of the module's latest run (geometric mean over profiles;"
               " below 1 is worse)"),
    MetricSpec("m1000_fleet_baseline_regressions", "gauge", ("module", "release"), "count",
               "Cells (model key, profile, metric) of the module's latest run worse than the baseline by more"
               " than the tolerance (a start-up cost: one cell a model key, past the start-up tolerance)"),
    MetricSpec("m1000_fleet_latest_run_timestamp_seconds", "gauge", ("module", "release"), "timestamp_seconds",
               "Creation time of the module's latest run with results"),
    MetricSpec("m1000_fleet_history_up", "gauge", (), "count", "1 when the run history could be read"),
    MetricSpec("m1000_fleet_serve_part_up", "gauge", ("part",), "count",
               "1 while fleetctl serve reaches the part (history, broker) in its passes; 0 while it serves degraded"
               " without it, trying again with backoff (GET /health says why)"),
    MetricSpec("m1000_trend_change_points", "gauge", ("model_key", "metric", "scope"), "count",
               "Change points across the release history still in force (fleetctl trend), per model key and"
               " metric: scope 'fleet' counts the fleet series (one per profile), 'module' every module's own;"
               " 0 for a series without one"),
    MetricSpec("m1000_baseline_ttft_seconds", "gauge", ("baseline", "model_key", "profile"), "seconds",
               "Baseline time to first token"),
    MetricSpec("m1000_baseline_tpot_seconds", "gauge", ("baseline", "model_key", "profile"), "seconds",
               "Baseline time per output token"),
    MetricSpec("m1000_baseline_prefill_tokens_per_second", "gauge", ("baseline", "model_key", "profile"),
               "tokens_per_second", "Baseline prefill throughput"),
    MetricSpec("m1000_baseline_decode_tokens_per_second", "gauge", ("baseline", "model_key", "profile"),
               "tokens_per_second", "Baseline decode throughput"),
    MetricSpec("m1000_baseline_vision_frames_per_second", "gauge", ("baseline", "model_key", "profile"),
               "frames_per_second", "Baseline vision frames per second"),
)
SPECS: dict[str, MetricSpec] = {s.name: s for s in CATALOG}
_BASELINE_FIELDS: tuple[tuple[str, str, float], ...] = (
    ("ttft_ms", "m1000_baseline_ttft_seconds", 1e-3),
    ("tpot_ms", "m1000_baseline_tpot_seconds", 1e-3),
    ("prefill_tps", "m1000_baseline_prefill_tokens_per_second", 1.0),
    ("decode_tps", "m1000_baseline_decode_tokens_per_second", 1.0),
    ("vision_fps", "m1000_baseline_vision_frames_per_second", 1.0),
)


WAIT_BUCKETS: tuple[float, ...] = (1, 10, 60, 300, 900, 1800, 3600, 7200, 14400, 28800, 86400)  # 1 s .. 1 day


def wait_buckets(waits: Iterable[float]) -> list[tuple[str, float]]:
    """Cumulative histogram buckets of ``waits`` (seconds) over :data:`WAIT_BUCKETS`, ``+Inf`` last (pure)."""
    ws = sorted(waits)
    return [(floatToGoString(b), float(bisect_right(ws, b))) for b in WAIT_BUCKETS] + [("+Inf", float(len(ws)))]


class ModuleReading(NamedTuple):
    """What the collector shows of one module: its state and its measured clock skew (s; None: unknown)."""

    state: str
    clock_skew: float | None = None


class Deviation(NamedTuple):
    ratios: dict[tuple[str, str], float]  # (model_key, metric) -> geometric mean performance ratio
    regressions: int


def performance_ratio(metric: str, value: float | None, base: float | None) -> float | None:
    """value against base, oriented so that above 1 is better; None when either is missing or not positive."""
    if value is None or base is None or not (value > 0 and base > 0) or math.isinf(value) or math.isinf(base):
        return None
    return value / base if METRICS[metric] else base / value


def baseline_figures(rows: Iterable[ResultRow]) -> dict[tuple[str, str], dict[str, float]]:
    """(model_key, profile) -> metric -> median over the baseline's rows (one per module, or the seed's one)."""
    acc: dict[tuple[str, str], dict[str, list[float]]] = {}
    for r in rows:
        cell = acc.setdefault((r.model_key, r.profile), {})
        for m in METRICS:
            v = getattr(r, m)
            if v is not None and v == v:
                cell.setdefault(m, []).append(float(v))
    return {k: {m: statistics.median(vs) for m, vs in cell.items()} for k, cell in acc.items()}


def deviation(rows: Iterable[ResultRow], base: Mapping[tuple[str, str], Mapping[str, float]],
              tolerance: float = 0.05, startup_tolerance: float = 0.15) -> Deviation:
    """Pure: per (model key, metric) geometric mean performance ratio, and the cells worse than tolerance. A start-up
    cost (one start a key, on each of its rows) is one cell per key, worse than ``startup_tolerance``
    (docs/adr/0029-start-up-costs-judged.md)."""
    logs: dict[tuple[str, str], list[float]] = {}
    regressions = 0
    starts: set[tuple[str, str]] = set()  # (model key, start-up metric) counted
    for r in rows:
        ref = base.get((r.model_key, r.profile))
        if not ref:
            continue
        for m in METRICS:
            ratio = performance_ratio(m, getattr(r, m), ref.get(m))
            if ratio is None:
                continue
            logs.setdefault((r.model_key, m), []).append(math.log(ratio))
            if m in STARTUP_METRICS:
                if (r.model_key, m) not in starts and ratio < 1.0 / (1.0 + startup_tolerance):
                    starts.add((r.model_key, m))
                    regressions += 1
            elif ratio < 1.0 - tolerance:
                regressions += 1
    return Deviation({k: math.exp(sum(v) / len(v)) for k, v in logs.items()}, regressions)


def trend_counts(history: History) -> dict[tuple[str, str, str], int]:
    """(model key, metric, 'fleet' or 'module') -> change points in force over the history (0: a series
    without one; every (key, metric) with a value in some release, both scopes), of the history as it is now
    (the kept findings, computed and kept when the history changed: :mod:`controller.report.kept`)."""
    from controller.report.kept import current_findings, in_force_counts

    return in_force_counts(current_findings(history))


# s a scrape waits for the findings it started computing (then answers with those kept)
TREND_WAIT = 0.5


class ControllerCollector(Collector):
    """Collector of the controller's series; ``states()`` gives module -> idle|busy|offline|bad (or a
    :class:`ModuleReading`, with the module's clock skew), ``queue_depths()`` queue -> priority -> messages
    waiting, ``reserved()`` (optional) module -> the user holding it. Safe to call from the HTTP server's thread."""

    def __init__(self, history: History, states: Callable[[], Mapping[str, str | ModuleReading]],
                 queue_depths: Callable[[], Mapping[str, Mapping[str, int]]], *, tolerance: float = 0.05,
                 recent_runs: int = RECENT_RUNS, reserved: Callable[[], Mapping[str, str]] | None = None,
                 trend_wait: float = TREND_WAIT, open_history: Callable[[], History] | None = None,
                 parts: Callable[[], Mapping[str, bool]] | None = None) -> None:
        self.history = history
        # fleetctl serve's parts: reached (True) or not (controller.serve.health)
        self.parts = parts
        self.states = states
        self.queue_depths = queue_depths
        self.reserved = reserved
        self.tolerance = tolerance
        self.recent_runs = recent_runs
        self._lock = threading.Lock()
        self._dev_cache: dict[tuple[str, str, int, str], Deviation] = {}
        self.trend_wait = trend_wait
        # the background computation's own connection (None: this history's, shared with the scrapes)
        self.open_history = open_history
        self._trend_cache: tuple[str, dict[tuple[str, str, str], int]] | None = None  # (version, counts)
        self._trend_thread: threading.Thread | None = None
        self._base_cache: dict[str, dict[tuple[str, str], dict[str, float]]] = {}

    def _family(self, name: str) -> GaugeMetricFamily:
        spec = SPECS[name]
        return GaugeMetricFamily(name, spec.help, labels=spec.labels)

    def collect(self) -> Iterator[Metric]:
        yield from self._state_metrics()
        yield from self._queue_metrics()
        yield from self._reserved_metrics()
        with self._lock:
            try:
                fams = list(self._history_metrics())
                up = 1.0
            except DatabaseError as exc:
                log.warning("run history unreadable: %s", exc)
                fams, up = [], 0.0
        yield from fams
        yield GaugeMetricFamily("m1000_fleet_history_up", SPECS["m1000_fleet_history_up"].help, value=up)
        if self.parts is not None:
            fam = self._family("m1000_fleet_serve_part_up")
            for part, reached in sorted(self.parts().items()):
                fam.add_metric((part,), 1.0 if reached else 0.0)
            yield fam

    def _state_metrics(self) -> Iterator[Metric]:
        try:
            readings = {m: r if isinstance(r, ModuleReading) else ModuleReading(r) for m, r in self.states().items()}
        except Exception as exc:  # a broker outage must not break the scrape
            log.warning("module states unavailable: %s", exc)
            return
        counts = dict.fromkeys(MODULE_STATES, 0)
        per = self._family("m1000_fleet_module_state")
        skew = self._family("m1000_fleet_module_clock_skew_seconds")
        for module, reading in sorted(readings.items()):
            if reading.clock_skew is not None:
                skew.add_metric((label_value(module),), reading.clock_skew)
            st = label_value(reading.state)
            counts[st] = counts.get(st, 0) + 1
            for s in (*MODULE_STATES, *([st] if st not in MODULE_STATES else [])):
                per.add_metric((label_value(module), s), 1.0 if s == st else 0.0)
        total = self._family("m1000_fleet_modules")
        for s, n in counts.items():
            total.add_metric((s,), n)
        yield total
        yield per
        yield skew

    @staticmethod
    def _broker_read(read: Callable[[], Mapping[str, Any]], what: str) -> dict[str, Any] | None:
        """What ``read`` gives, or None (logged) when the broker cannot say: an outage must not break the scrape."""
        try:
            return dict(read())
        except Exception as exc:
            log.warning("%s unavailable: %s", what, exc)
            return None

    def _queue_metrics(self) -> Iterator[Metric]:
        queues = self._broker_read(self.queue_depths, "queue lengths")
        if queues is None:
            return
        fam = self._family("m1000_fleet_queue_length")
        for q, by in sorted(queues.items()):
            for priority, n in by.items():
                fam.add_metric((label_value(q), label_value(priority)), n)
        yield fam

    def _reserved_metrics(self) -> Iterator[Metric]:
        held = self._broker_read(self.reserved, "reservations") if self.reserved is not None else None
        if held is None:
            return
        fam = self._family("m1000_fleet_module_reserved")
        for module, user in sorted(held.items()):
            fam.add_metric((label_value(module), label_value(user)), 1.0)
        yield fam

    def _history_metrics(self) -> Iterator[Metric]:
        runs = self._family("m1000_fleet_runs")
        for verdict, n in sorted(self.history.verdict_counts()):
            runs.add_metric((label_value(str(verdict), "other"),), n)
        yield runs
        cycles = self._family("m1000_fleet_power_cycles")
        for (module, result), n in sorted(self.history.power_cycle_counts().items()):
            cycles.add_metric((label_value(module), result), n)
        yield cycles
        ratio = self._family("m1000_fleet_baseline_ratio")
        regs = self._family("m1000_fleet_baseline_regressions")
        stamp = self._family("m1000_fleet_latest_run_timestamp_seconds")
        used_baselines: dict[str, str] = {}
        for module, run in sorted(self._latest_runs().items()):
            rel = label_value(run.release)
            stamp.add_metric((label_value(module), rel), run.created_at)
            base_id = self.history.baseline_run_id(release=run.release) if run.release else None
            base_id = base_id or self.history.baseline_run_id()
            if base_id is None:
                continue
            base_run = self.history.run(base_id)
            used_baselines[base_id] = label_value(base_run.release if base_run else "")
            dev = self._deviation(run.run_id, module, base_id)
            for (key, metric), value in sorted(dev.ratios.items()):
                ratio.add_metric((label_value(module), rel, label_value(key), metric), value)
            regs.add_metric((label_value(module), rel), dev.regressions)
        yield from (ratio, regs, stamp)
        yield from self._baseline_metrics(used_baselines)
        yield self._trend_metric()
        yield self._wait_metric()

    def _wait_metric(self) -> Metric:
        """The waits of every module's part of a run in the history, by the priority it was dispatched at."""
        waits: dict[str, list[float]] = {}
        for _, _, priority, w in self.history.waits():
            waits.setdefault(priority, []).append(w)
        spec = SPECS["m1000_fleet_run_wait_seconds"]
        fam = HistogramMetricFamily(spec.name, spec.help, labels=spec.labels)
        for priority, ws in sorted(waits.items()):
            fam.add_metric((label_value(priority),), wait_buckets(ws), sum(ws))
        return fam

    def _trend_metric(self) -> Metric:
        """Change points in force per (model key, metric, scope), 0 for every series without one: the kept
        findings, their computation started when the history changed since (see the module's docstring)."""
        from controller.report.kept import NAME, decode, in_force_counts

        version = self.history.trend_version()
        if self._trend_cache is None or self._trend_cache[0] != version:
            got = self.history.trend_findings(NAME)
            if got is None or got[0] != version:
                self.start_trend()
                self._trend_thread.join(self.trend_wait)  # type: ignore[union-attr]  # started
                got = self.history.trend_findings(NAME)
            kept = decode(*got) if got is not None and (self._trend_cache is None
                                                          or self._trend_cache[0] != got[0]) else None
            if kept is not None:
                self._trend_cache = (kept.version, in_force_counts(kept))
        fam = self._family("m1000_trend_change_points")
        for (key, metric, scope), n in sorted(self._trend_cache[1].items() if self._trend_cache else ()):
            fam.add_metric((label_value(key), metric, scope), n)
        return fam

    def start_trend(self) -> None:
        """Start computing and keeping the history's findings in a thread of its own, unless one is at it."""
        if not self.trend_computing():
            self._trend_thread = threading.Thread(target=self._compute_trend, name="trend-findings", daemon=True)
            self._trend_thread.start()

    def trend_computing(self) -> bool:
        """Whether the history's findings are being computed now."""
        return self._trend_thread is not None and self._trend_thread.is_alive()

    def _compute_trend(self) -> None:
        from controller.report.kept import keep_findings
        from controller.report.model import ReportError

        failures: tuple[type[Exception], ...] = (*DatabaseError, ReportError)
        h = self.open_history() if self.open_history is not None else self.history
        try:
            keep_findings(h)
        except failures as exc:  # said, and tried again at the next scrape
            log.warning("change points across the history not computed: %s", exc)
        finally:
            if h is not self.history:
                h.close()

    def _latest_runs(self) -> dict[str, RunInfo]:
        """module -> its newest run (of the recent ones) that has rows for it."""
        out: dict[str, RunInfo] = {}
        for run in self.history.runs(limit=self.recent_runs):
            for module in self.history.modules_with_rows(run.run_id):
                out.setdefault(str(module), run)
        return out

    def _baseline(self, base_id: str) -> dict[tuple[str, str], dict[str, float]]:
        if base_id not in self._base_cache:  # baseline versions never change once stored
            self._base_cache = {base_id: baseline_figures(self.history.rows(base_id)), **self._base_cache}
        return self._base_cache[base_id]

    def _deviation(self, run_id: str, module: str, base_id: str) -> Deviation:
        key = (run_id, module, self.history.stored_row_count(run_id, module), base_id)
        if key not in self._dev_cache:
            self._dev_cache = {k: v for k, v in self._dev_cache.items() if k[:2] != (run_id, module)}
            self._dev_cache[key] = deviation(self.history.rows(run_id, module), self._baseline(base_id),
                                             self.tolerance)
        return self._dev_cache[key]

    def _baseline_metrics(self, baselines: Mapping[str, str]) -> Iterator[Metric]:
        fams = {name: self._family(name) for _, name, _ in _BASELINE_FIELDS}
        seen: set[tuple[str, str, str]] = set()
        for base_id, release in sorted(baselines.items()):
            for (key, profile), figures in sorted(self._baseline(base_id).items()):
                if (release, key, profile) in seen:
                    continue
                seen.add((release, key, profile))
                for attr, name, mult in _BASELINE_FIELDS:
                    if attr in figures:
                        fams[name].add_metric((release, label_value(key), label_value(profile)), figures[attr] * mult)
        yield from fams.values()
