"""Reports explain outliers with device telemetry (fast tier: synthetic fleets, a real run history).

Two modules are 12 % slow: m03 because its device throttles (lower SM clock, HW slowdown, hot),
m04 for no reason its device shows. The report names both; it explains m03 by its clock and
says the telemetry of m04 shows nothing unusual; a module without telemetry is said to have none.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent.telemetry import summarize
from contract.records import TelemetrySummary
from controller.history import History
from controller.report import build_report
from controller.report.model import FLEET, Outlier
from controller.report.render import telemetry_line, to_json, to_markdown, write_report
from controller.report.render.html import to_html
from controller.report.synth import fleet
from controller.report.telemetry import explain_outliers, telemetry_rows
from tests.metrics.fleetfiles import device_sample
from tests.support.frames import frame_to_rows

KEYS = ("qwen3", "qwen35", "qwen3vl")
IDLE = {"sm_clock_mhz": 600.0, "utilization_pct": 0.0, "power_w": 18.0, "temperature_c": 45.0,
        "clock_event_reasons": 0x1, "memory_used_mib": 0.0}


def device(module: str, *, sm: float = 1800.0, temp: float = 60.0, reasons: int = 0, jitter: float = 0.0,
           other_process_mib: float = 0.0) -> TelemetrySummary:
    """A module's summary: idle release steps, then per key a few idle and many busy samples."""
    samples = [device_sample("run-1", module, None, step="precompile", ts=float(i),
                             **{**IDLE, "memory_used_mib": other_process_mib}) for i in range(5)]
    t = 10.0
    for key in KEYS:
        for i in range(20):
            t += 1
            busy = i >= 2
            values: dict[str, Any] = (
                {"sm_clock_mhz": sm + jitter * (i % 3), "temperature_c": temp + i % 2, "power_w": 52.0,
                 "clock_event_reasons": reasons, "utilization_pct": 86.0, "memory_used_mib": 21504.0,
                 "max_sm_clock_mhz": 1800.0, "power_limit_w": 75.0, "memory_total_mib": 65536.0}
                if busy else IDLE)
            samples.append(device_sample("run-1", module, key, ts=t, **values))
    return summarize(samples, run_id="run-1", module=module, tool="mthreads-gmi")


def fleet_summaries() -> dict[str, TelemetrySummary]:
    out = {f"m{i:02d}": device(f"m{i:02d}", jitter=float(i)) for i in range(6)}
    out["m03"] = device("m03", sm=1476.0, temp=92.0, reasons=0x8 | 0x40)  # throttling: -18 % SM clock
    return out


def test_throttled_outlier_is_explained_by_its_clock_the_other_by_nothing() -> None:
    outliers = [Outlier(module=m, model_key=FLEET, factor=0.88, cells=90, share_out=0.9, p_value=1e-9)
                for m in ("m03", "m04")]
    m03, m04 = explain_outliers(outliers, fleet_summaries())
    assert m03.status == "explained" and m04.status == "nothing unusual"
    assert m03.findings[0] == "SM clock \u221218 % (1476 vs 1803 MHz)"
    assert "93 °C (fleet 61 °C)" in m03.findings
    assert ("clock-event reasons HW Slowdown 90 %, HW Thermal Slowdown 90 % of samples (fleet at most 0 %)"
            in m03.findings)
    assert [c.text for c in m03.compared if c.what == "reason:hw_slowdown"] == [
        "clock-event reason HW Slowdown in 90 % of samples (fleet 0 %)"]
    assert telemetry_line(m03).startswith("SM clock \u221218 %")
    assert not any(c.what == "power" and c.unusual for c in m03.compared)  # less power follows the lower clock
    assert telemetry_line(m04).startswith("device telemetry shows nothing unusual (SM clock, highest SM clock, "
                                     "temperature")
    assert {c.what for c in m04.compared} >= {"sm_clock", "temperature", "power_limit", "memory_used"}


def test_key_level_outlier_memory_before_the_servers_and_no_telemetry() -> None:
    s = fleet_summaries()
    s["m05"] = device("m05", other_process_mib=8192.0)
    s.pop("m01")
    outliers = [Outlier(module="m05", model_key="qwen35", factor=0.9, cells=30, share_out=0.8, p_value=1e-5),
                Outlier(module="m01", model_key=FLEET, factor=0.9, cells=30, share_out=0.8, p_value=1e-5)]
    m05, m01 = explain_outliers(outliers, s)
    assert m05.status == "explained" and m05.findings == (
        "8192 MiB of device memory in use before the servers started (fleet 0 MiB): another process on the device?",)
    assert m01.status == "no telemetry" and "no device telemetry from m01" in telemetry_line(m01)
    tool_missing = summarize([], run_id="run-1", module="m01", notes=["no device tool: mthreads-gmi or nvidia-smi "
                                                                       "not found; no device telemetry for this run"])
    (m01,) = explain_outliers(outliers[1:], {**s, "m01": tool_missing})
    assert m01.status == "no telemetry" and "mthreads-gmi or nvidia-smi not found" in m01.note


@pytest.mark.slow  # over the fast tier's 2 s CPU budget with a neighbour on the other core
def test_report_from_history_names_and_explains(tmp_path: Path, reference) -> None:
    h = History(tmp_path / "history.sqlite")
    try:
        ref = reference[reference["model_key"].isin(KEYS)]
        h.add_baseline("1.4.1", frame_to_rows(ref.assign(module="", run_id="x")), "seed")
        h.create_run("run-1", release="1.4.1", models=KEYS, modules=[f"m{i:02d}" for i in range(6)])
        h.upsert_rows(frame_to_rows(fleet(ref, module_factor={"m03": 0.88, "m04": 0.88}, seed=4, run_id="run-1",
                                          release="1.4.1")))
        h.set_run_state("run-1", "done")
        for s in fleet_summaries().values():
            if s.module != "m02":
                h.upsert_telemetry(s)
        rep = build_report(h, "run-1")
        assert [o.module for o in rep.outliers] == ["m03", "m04"]
        t = {x.module: x for x in rep.outlier_telemetry}
        assert t["m03"].status == "explained" and t["m03"].findings[0].startswith("SM clock \u221218 %")
        assert t["m04"].status == "nothing unusual"
        md = to_markdown(rep)
        assert "| device telemetry |" in md and "SM clock \u221218 % (1476 vs 1802 MHz)" in md
        assert "### Device telemetry of m03 (explained)" in md and "device telemetry shows nothing unusual" in md
        doc = json.loads(to_json(rep))
        assert [x["status"] for x in doc["outlier_telemetry"]] == ["explained", "nothing unusual"]
        html = to_html(rep)
        assert "clock-event reasons HW Slowdown 90 %" in html and "device telemetry of m04" in html
        files = write_report(rep, "csv", tmp_path / "csv")
        assert any(p.name == "outliers.csv" for p in files)
        rows = telemetry_rows(h.telemetry("run-1"))
        m03 = next(r for r in rows if r["module"] == "m03" and r["model_key"] == "qwen3")
        assert m03["sm_clock_p95_mhz"] == 1476 and m03["slowdown"] == "HW Slowdown 90 %, HW Thermal Slowdown 90 %"
    finally:
        h.close()


@pytest.mark.parametrize("fmt", ["table", "json"])
def test_fleetctl_results_telemetry(tmp_path: Path, fmt: str, monkeypatch) -> None:
    import subprocess
    import sys

    hist = tmp_path / "history.sqlite"
    h = History(hist)
    h.create_run("run-1", release="1.4.1", models=KEYS, modules=["m03"], kind="baseline")
    h.upsert_telemetry(fleet_summaries()["m03"])
    h.close()
    res = subprocess.run([sys.executable, "-m", "controller", "--history", str(hist), "results", "run-1",
                          "--telemetry", "--format", fmt], capture_output=True, text=True, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "COLUMNS": "250", "HOME": str(tmp_path)})
    assert res.returncode == 0, res.stderr
    if fmt == "json":
        assert json.loads(res.stdout)["m03"]["keys"][1]["fields"]["sm_clock_mhz"]["p95"] == 1476
    else:
        assert "1476 / 1800" in res.stdout and "HW Slowdown 90 %" in res.stdout
