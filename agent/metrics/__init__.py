"""The agent's Prometheus exporter: a custom collector over the run files of one workdir (the package's names).

The pipeline and the worker write plain files under the module's workdir; this package
only reads them (one reader per file, incremental), so the same exporter works inside the
Celery worker, as a separate ``fleet-agent exporter`` process and next to ``fleet-agent run``::

    <workdir>/state.json                 {"current_run", "last_run", "updated_at"}
    <workdir>/heartbeat.json             a Heartbeat record (written by the worker)
    <workdir>/runs/<run_id>/progress.json   latest RunProgress (atomically replaced)
    <workdir>/runs/<run_id>/results.jsonl   one ResultRow per line (appended)
    <workdir>/runs/<run_id>/events.jsonl    one step start/end per line (appended)
    <workdir>/runs/<run_id>/telemetry.jsonl one DeviceSample per device and period (appended)

The agent's series carry no ``module`` label: Prometheus adds it as a target label (file_sd)
and the Pushgateway as a grouping key.

One module per job:

* :mod:`agent.metrics.catalog`: the metric list (:data:`CATALOG`) and the label rules;
* :mod:`agent.metrics.readers`: incremental readers of a run's files;
* :mod:`agent.metrics.system`: the module's load, memory, disk and GPU figures;
* :mod:`agent.metrics.collector`: the collector that builds the series per scrape;
* :mod:`agent.metrics.exposition`: the caching registry and the HTTP server;
* :mod:`agent.metrics.push`: the Pushgateway.
"""

from __future__ import annotations

from agent.metrics.catalog import (
    CATALOG,
    KEY_STATUSES,
    PREFIX,
    SPECS,
    STEP_BUCKETS,
    MetricSpec,
    label_value,
    step_label,
)
from agent.metrics.collector import DEVICE_FRESH_S, DISAGREES, AgentCollector, agent_version
from agent.metrics.exposition import DEFAULT_PORT, AgentRegistry, build_registry, metrics_app, start_exporter
from agent.metrics.push import PUSH_JOB, Pusher, push_once, redact_url
from agent.metrics.readers import JsonFile, LineTail, RunFiles, StepStats
from agent.metrics.system import GpuFiles, SystemProbe, SystemSample

__all__ = [
    "CATALOG",
    "DEFAULT_PORT",
    "DEVICE_FRESH_S",
    "DISAGREES",
    "KEY_STATUSES",
    "PREFIX",
    "PUSH_JOB",
    "SPECS",
    "STEP_BUCKETS",
    "AgentCollector",
    "AgentRegistry",
    "GpuFiles",
    "JsonFile",
    "LineTail",
    "MetricSpec",
    "Pusher",
    "RunFiles",
    "StepStats",
    "SystemProbe",
    "SystemSample",
    "agent_version",
    "build_registry",
    "label_value",
    "metrics_app",
    "push_once",
    "redact_url",
    "start_exporter",
    "step_label",
]
