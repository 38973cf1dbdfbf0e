"""The device series of the agent's /metrics, read from a workdir in the pipeline's layout (fast tier)."""

from __future__ import annotations

import time
from pathlib import Path

from agent.metrics import SystemSample, build_registry
from agent.telemetry.exposition import DEVICE_METRICS
from contract.records import RunState
from tests.metrics.fleetfiles import RunWriter, device_sample


def registry(workdir: Path):
    return build_registry(workdir, "m-a", process=False, system=SystemSample)


def test_latest_sample_in_base_units_with_bounded_labels(tmp_path: Path) -> None:
    w = RunWriter(tmp_path, "r1", "m-a")
    w.progress(state=RunState.BENCHMARKING, step="benchmark", model_key="qwen3")
    w.state("r1")
    w.samples([device_sample("r1", "m-a", None, step="precompile", sm_clock_mhz=345.0),
               device_sample("r1", "m-a", "qwen3", clock_event_reasons=0x4 | 0x8)])
    reg = registry(tmp_path)
    lbl = {"gpu": "0", "model_key": "qwen3"}
    assert reg.get_sample_value("m1000_device_sm_clock_hertz", lbl) == 1455e6
    assert reg.get_sample_value("m1000_device_sm_clock_max_hertz", lbl) == 1980e6
    assert reg.get_sample_value("m1000_device_memory_used_bytes", lbl) == 1139 * 1024**2
    assert reg.get_sample_value("m1000_device_utilization_ratio", lbl) == 1.0
    assert reg.get_sample_value("m1000_device_power_watts", lbl) == 692.1
    assert reg.get_sample_value("m1000_device_temperature_celsius", lbl) == 59.0
    assert reg.get_sample_value("m1000_device_ecc_uncorrected_errors_total", lbl) == 0
    for reason, want in (("sw_power_cap", 1.0), ("hw_slowdown", 1.0), ("gpu_idle", 0.0)):
        assert reg.get_sample_value("m1000_device_clock_event_active", {**lbl, "reason": reason}) == want
    assert reg.get_sample_value("m1000_device_sm_clock_hertz", {"gpu": "0", "model_key": "none"}) is None
    names = {f.name for f in reg.collect()}
    assert {m.name.removesuffix("_total") for m in DEVICE_METRICS} <= names
    # the next sample replaces the last (one series set per device)
    w.samples([device_sample("r1", "m-a", "qwen35", sm_clock_mhz=1600.0)])
    assert reg.get_sample_value("m1000_device_sm_clock_hertz", {"gpu": "0", "model_key": "qwen35"}) == 1600e6
    assert reg.get_sample_value("m1000_device_sm_clock_hertz", lbl) is None


def test_stale_samples_and_unreadable_lines(tmp_path: Path) -> None:
    w = RunWriter(tmp_path, "r1", "m-a")
    w.progress(state=RunState.DONE, step="publish")
    w.state(None, "r1")
    w.samples([device_sample("r1", "m-a", "qwen3", ts=time.time() - 3600)])
    (w.folder / "telemetry.jsonl").open("a").write('{"torn": \n')
    reg = registry(tmp_path)
    assert reg.get_sample_value("m1000_device_sm_clock_hertz", {"gpu": "0", "model_key": "qwen3"}) is None
    assert reg.get_sample_value("m1000_exporter_read_errors_total", {"file": "telemetry"}) == 1
