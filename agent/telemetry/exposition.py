"""The device series of the agent's ``/metrics``: the latest sample of each device of the current run.

Names follow the project's convention (``m1000_`` prefix, base units: hertz, bytes, ratios,
watts, Celsius) rather than DCGM exporter's (``DCGM_FI_DEV_*`` in MHz, MiB and percent); each
series names the DCGM field it stands for (:attr:`DeviceMetric.dcgm`), and the device table of
docs/reference/metrics.md (generated from :data:`DEVICE_METRICS`) gives both, so a DCGM dashboard's query
converts one to one. Labels: ``gpu`` (device index), ``model_key`` (``none`` outside a key) and, for clock-event
reasons, ``reason`` (a fixed list); Prometheus adds ``module``. Present while a run samples (the current or last
run's latest samples, up to a minute old).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from agent.telemetry.fields import REASONS
from contract.records import DeviceSample

MIB = 1024.0 * 1024.0
_L = ("gpu", "model_key")


class DeviceMetric(NamedTuple):
    name: str
    type: str
    labels: tuple[str, ...]
    unit: str
    help: str
    # the DeviceSample attribute, its scale to the base unit, and the DCGM exporter field it stands for
    field: str
    scale: float
    dcgm: str


DEVICE_METRICS: tuple[DeviceMetric, ...] = (
    DeviceMetric("m1000_device_temperature_celsius", "gauge", _L, "celsius", "Device temperature",
                 "temperature_c", 1.0, "DCGM_FI_DEV_GPU_TEMP"),
    DeviceMetric("m1000_device_memory_temperature_celsius", "gauge", _L, "celsius", "Device memory temperature",
                 "memory_temperature_c", 1.0, "DCGM_FI_DEV_MEMORY_TEMP"),
    DeviceMetric("m1000_device_power_watts", "gauge", _L, "watts", "Device power draw",
                 "power_w", 1.0, "DCGM_FI_DEV_POWER_USAGE"),
    DeviceMetric("m1000_device_power_limit_watts", "gauge", _L, "watts", "Device power limit in force",
                 "power_limit_w", 1.0, "DCGM_FI_DEV_ENFORCED_POWER_LIMIT"),
    DeviceMetric("m1000_device_sm_clock_hertz", "gauge", _L, "hertz", "SM (graphics) clock",
                 "sm_clock_mhz", 1e6, "DCGM_FI_DEV_SM_CLOCK (MHz)"),
    DeviceMetric("m1000_device_sm_clock_max_hertz", "gauge", _L, "hertz", "Highest SM clock the device allows",
                 "max_sm_clock_mhz", 1e6, "DCGM_FI_DEV_MAX_SM_CLOCK (MHz)"),
    DeviceMetric("m1000_device_memory_clock_hertz", "gauge", _L, "hertz", "Memory clock",
                 "memory_clock_mhz", 1e6, "DCGM_FI_DEV_MEM_CLOCK (MHz)"),
    DeviceMetric("m1000_device_utilization_ratio", "gauge", _L, "ratio", "Share of time the device was busy",
                 "utilization_pct", 0.01, "DCGM_FI_DEV_GPU_UTIL (%)"),
    DeviceMetric("m1000_device_memory_utilization_ratio", "gauge", _L, "ratio",
                 "Share of time device memory was read or written", "memory_utilization_pct", 0.01,
                 "DCGM_FI_DEV_MEM_COPY_UTIL (%)"),
    DeviceMetric("m1000_device_memory_used_bytes", "gauge", _L, "bytes", "Device memory in use",
                 "memory_used_mib", MIB, "DCGM_FI_DEV_FB_USED (MiB)"),
    DeviceMetric("m1000_device_memory_total_bytes", "gauge", _L, "bytes", "Device memory",
                 "memory_total_mib", MIB, "DCGM_FI_DEV_FB_TOTAL (MiB)"),
    DeviceMetric("m1000_device_clock_event_active", "gauge", (*_L, "reason"), "count",
                 "1 while the clock-event (throttle) reason is active", "clock_event_reasons", 1.0,
                 "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS (one series per bit)"),
    DeviceMetric("m1000_device_ecc_uncorrected_errors_total", "counter", _L, "count",
                 "Volatile uncorrected ECC errors", "ecc_uncorrected", 1.0, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"),
    DeviceMetric("m1000_device_sample_timestamp_seconds", "gauge", ("gpu",), "timestamp_seconds",
                 "Time of the device's latest sample", "ts", 1.0, "-"),
)


def device_families(samples: Iterable[DeviceSample], label: Callable[[str | None, str], str]) -> list[Metric]:
    """Families of the latest samples (one per device); ``label(text, fallback)`` bounds label values."""
    latest = sorted(samples, key=lambda s: s.gpu)
    if not latest:
        return []
    out: list[Metric] = []
    for m in DEVICE_METRICS:
        fam = (CounterMetricFamily if m.type == "counter" else GaugeMetricFamily)(m.name, m.help, labels=m.labels)
        for s in latest:
            value = getattr(s, m.field)
            if value is None:
                continue
            base = (str(s.gpu),) if m.labels == ("gpu",) else (str(s.gpu), label(s.model_key, "none"))
            if m.field == "clock_event_reasons":
                for bit, reason, _ in REASONS:
                    fam.add_metric((*base, reason), 1.0 if value & bit else 0.0)
            else:
                fam.add_metric(base, float(value) * m.scale)
        if fam.samples:
            out.append(fam)
    return out
