"""The agent's metric list: every series it exports (name, type, labels, unit, help) and its label rules.

``docs/reference/metrics.md`` is generated from :data:`CATALOG` (``make reference``; a test fails when it is
stale). Labels are bounded: release, model key, profile, state, step, status, window, gpu; never run ids, paths or
free text (:func:`label_value`, :func:`step_label`).
"""

from __future__ import annotations

import re

from agent.telemetry.exposition import DEVICE_METRICS
from contract.vocab import MetricSpec as MetricSpec
from contract.vocab import label_value as label_value

PREFIX = "m1000"
STEP_BUCKETS: tuple[float, ...] = (1, 5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200)
KEY_STATUSES: tuple[str, ...] = ("pending", "running", "passed", "failed", "cancelled", "skipped")
_STEP = re.compile(r"^[a-z][a-z0-9_]{0,31}$")


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
    # energy over the key's benchmark window (agent.telemetry.energy): the same on every profile of a key
    MetricSpec(f"{PREFIX}_result_energy_per_token_joules", "gauge", _R, "joules",
               "Energy per output token over the key's benchmark window of the latest result"),
    MetricSpec(f"{PREFIX}_result_output_tokens_per_joule", "gauge", _R, "tokens_per_joule",
               "Output tokens per joule over the key's benchmark window of the latest result"),
    MetricSpec(f"{PREFIX}_result_average_power_watts", "gauge", _R, "watts",
               "Average power of the module's devices over the key's benchmark window of the latest result"),
    MetricSpec(f"{PREFIX}_result_idle_power_watts", "gauge", _R, "watts",
               "Idle power of the module's devices measured before the key of the latest result"),
    MetricSpec(f"{PREFIX}_result_rows", "gauge", ("release", "model_key"), "count",
               "Result rows behind the latest figures of a model key"),
    MetricSpec(f"{PREFIX}_result_release_benchmark_disagreements", "gauge", ("release", "model_key"), "count",
               "Latest result rows of a model key whose figures the agent's probe contradicts (flag "
               "release_benchmark_disagrees)"),
    MetricSpec(f"{PREFIX}_result_jit_kernels", "gauge", ("release", "model_key"), "count",
               "TileLang kernels compiled while the latest benchmark of a model key measured (0: none; not 0: its "
               "figures include compile time)"),
    # the release's start-up costs (agent.startup): the same on every profile of a key, the precompile's on every key
    MetricSpec(f"{PREFIX}_result_server_ready_seconds", "gauge", ("release", "model_key"), "seconds",
               "Server start until /health answered 200, of the latest result of a model key"),
    MetricSpec(f"{PREFIX}_result_first_request_seconds", "gauge", ("release", "model_key"), "seconds",
               "First request after the server was ready (warm-up), of the latest result of a model key"),
    MetricSpec(f"{PREFIX}_result_precompile_seconds", "gauge", ("release",), "seconds",
               "Precompile of the TileLang kernels, of the latest run of a release that compiled them"),
    MetricSpec(f"{PREFIX}_result_precompile_fetch_seconds", "gauge", ("release",), "seconds",
               "Fetch of a kernel cache another module compiled, of the latest run of a release that fetched one"),
    MetricSpec(f"{PREFIX}_result_capacity_concurrency", "gauge", _R, "count",
               "Highest concurrency at which the probe's SLO sweep met its SLO (0: none did), latest per profile"),
    MetricSpec(f"{PREFIX}_result_capacity_output_tokens_per_second", "gauge", _R, "tokens_per_second",
               "Output throughput at the capacity of the probe's latest SLO sweep"),
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
    MetricSpec(f"{PREFIX}_agent_info", "info", ("version", "contract", "python"), "count",
               "Agent version, and its contract version (the records' schema_version, ADR 0051)"),
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
RESULT_FIELDS: tuple[tuple[str, str, float], ...] = (
    ("ttft_ms", f"{PREFIX}_result_ttft_seconds", 1e-3),
    ("tpot_ms", f"{PREFIX}_result_tpot_seconds", 1e-3),
    ("prefill_tps", f"{PREFIX}_result_prefill_tokens_per_second", 1.0),
    ("decode_tps", f"{PREFIX}_result_decode_tokens_per_second", 1.0),
    ("accept_rate", f"{PREFIX}_result_mtp_accept_ratio", 1.0),
    ("accept_rate_len", f"{PREFIX}_result_mtp_accept_length_ratio", 1.0),
    ("vision_fps", f"{PREFIX}_result_vision_frames_per_second", 1.0),
    ("j_per_token", f"{PREFIX}_result_energy_per_token_joules", 1.0),
    ("tokens_per_j", f"{PREFIX}_result_output_tokens_per_joule", 1.0),
    ("avg_power_w", f"{PREFIX}_result_average_power_watts", 1.0),
    ("idle_power_w", f"{PREFIX}_result_idle_power_watts", 1.0),
)


def step_label(text: str | None) -> str:
    return text if text and _STEP.match(text) else "other"
