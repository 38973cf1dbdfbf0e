"""Parsers and planner of the device telemetry on recorded outputs (fast tier).

``tests/fixtures/h200/``: real ``nvidia-smi`` on an H200 (query CSV with and without header and
units, ``-q`` text, 0.5-s samples under load); ``tests/fixtures/mthreads/``: hand-made
``mthreads-gmi`` outputs with missing and unsupported fields.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.telemetry.fields import BY_NAME, FIELDS, FieldSpec, reason_names
from agent.telemetry.parse import convert, invalid_field, parse_csv, parse_q, q_entries
from agent.telemetry.plan import QueryPlan, choose_tool
from agent.telemetry.summary import summarize
from contract.records import DeviceSample

FIX = Path(__file__).resolve().parents[1] / "fixtures"
H200 = FIX / "h200"
MT = FIX / "mthreads"

# the fields query.csv was recorded with, in order (pcie.link.gen.current is not one of ours)
RECORDED = ["index", "name", "uuid", "temperature.gpu", "temperature.memory", "power.draw", "power.limit",
            "clocks.sm", "clocks.mem", "clocks.gr", "clocks.max.sm", "utilization.gpu", "utilization.memory",
            "memory.used", "memory.total", "clocks_event_reasons.active", "ecc.errors.uncorrected.volatile.total",
            "pcie.link.gen.current"]
BY_QUERY = {q: f for f in FIELDS for q in f.queries}


def columns(names: list[str]) -> list[FieldSpec]:
    return [BY_QUERY.get(q) or FieldSpec(q.replace(".", "_"), (q,), "float") for q in names]


def test_query_csv_with_and_without_header_and_units_gives_the_same_device() -> None:
    lines = (H200 / "query.csv").read_text().splitlines()
    assert lines[0].startswith("index, name, uuid, temperature.gpu")  # the header names are not the ones asked
    assert "clocks.current.sm [MHz]" in lines[0]
    cols = columns(RECORDED)
    units, plain = parse_csv("\n".join(lines[:2]), cols), parse_csv(lines[2], cols)
    assert len(units) == len(plain) == 1
    a, b = units[0], plain[0]
    assert (a.gpu, a.name, a.uuid) == (b.gpu, b.name, b.uuid) == (0, "NVIDIA H200",
                                                                  "GPU-e05da803-69f9-b85c-33e7-746abc16c345")
    assert a.values["power_w"] == 84.26 and b.values["power_w"] == 84.27
    for v in (a.values, b.values):
        assert v["temperature_c"] == 38 and v["memory_temperature_c"] == 38
        assert v["sm_clock_mhz"] == 795 and v["graphics_clock_mhz"] == 795 and v["max_sm_clock_mhz"] == 1980
        assert v["memory_clock_mhz"] == 3201 and v["power_limit_w"] == 700
        assert v["memory_used_mib"] == 0 and v["memory_total_mib"] == 143771
        assert v["utilization_pct"] == 0 and v["memory_utilization_pct"] == 0
        assert v["clock_event_reasons"] == 1 and reason_names(int(v["clock_event_reasons"])) == ("gpu_idle",)
        assert v["ecc_uncorrected"] == 0
    assert not a.absent and not b.absent


def test_header_alone_is_no_device() -> None:
    header = (H200 / "query.csv").read_text().splitlines()[0]
    assert parse_csv(header, columns(RECORDED)) == ()


def test_q_text_of_the_h200_matches_its_query() -> None:
    (r,) = parse_q((H200 / "nvidia-smi-q.txt").read_text())
    assert (r.gpu, r.name, r.uuid) == (0, "NVIDIA H200", "GPU-e05da803-69f9-b85c-33e7-746abc16c345")
    v = r.values
    assert v["temperature_c"] == 38 and v["memory_temperature_c"] == 38
    assert v["power_w"] == 84.87  # instantaneous, as --query-gpu's power.draw
    assert v["power_limit_w"] == 700
    assert v["sm_clock_mhz"] == 795 and v["graphics_clock_mhz"] == 795 and v["memory_clock_mhz"] == 3201
    assert v["max_sm_clock_mhz"] == 1980  # Max Clocks / SM, not Applications Clocks
    assert v["utilization_pct"] == 0 and v["memory_utilization_pct"] == 0
    assert v["memory_used_mib"] == 0 and v["memory_total_mib"] == 143771  # FB, not BAR1
    assert v["clock_event_reasons"] == 0x1  # Idle: Active
    assert v["ecc_uncorrected"] == 0


def test_q_paths_follow_indentation() -> None:
    block = ["    Clocks Event Reasons", "        HW Slowdown      : Not Active",
             "            HW Thermal Slowdown : Active", "    Clocks", "        SM : 100 MHz"]
    assert q_entries(block) == [
        (("clocks event reasons", "hw slowdown"), "Not Active"),
        (("clocks event reasons", "hw slowdown", "hw thermal slowdown"), "Active"),
        (("clocks", "sm"), "100 MHz")]


def test_samples_under_real_load() -> None:
    """0.5-s samples while a real server loaded and served two models: idle 345 MHz, busy 1980 MHz."""
    cols = columns(["timestamp", "temperature.gpu", "power.draw", "clocks.sm", "utilization.gpu", "memory.used"])
    cols[0] = FieldSpec("timestamp", ("timestamp",), "text")
    readings = parse_csv((H200 / "samples.csv").read_text(), cols)
    assert len(readings) == 105
    sm = [r.values["sm_clock_mhz"] for r in readings]
    assert min(sm) == 345 and max(sm) == 1980
    assert max(r.values["power_w"] for r in readings) == pytest.approx(174.06)
    assert max(r.values["memory_used_mib"] for r in readings) == 7487
    samples = [DeviceSample.model_validate({**r.values, "ts": float(i) / 2, "gpu": 0, "run_id": "r", "module": "h200",
                                            "step": "benchmark", "model_key": "qwen3" if i < 52 else "qwen35"})
               for i, r in enumerate(readings)]
    s = summarize(samples, run_id="r", module="h200", tool="nvidia-smi", period_s=0.5)
    assert [k.model_key for k in s.keys] == ["qwen3", "qwen35"] and s.samples == 105
    sm_stats = s.keys[0].fields["sm_clock_mhz"]
    assert sm_stats.min == 345 and sm_stats.max == 1980 and sm_stats.min <= sm_stats.mean <= sm_stats.p95
    assert "clock_event_reasons" not in s.keys[0].fields and s.keys[0].reasons == {}


def test_mthreads_unsupported_fields_are_absent_each_on_its_own() -> None:
    plan = QueryPlan.initial("mthreads-gmi")
    (r,) = parse_csv((MT / "query-unsupported.csv").read_text(), plan.columns)
    assert r.name == "MTT M1000" and r.values["temperature_c"] == 47 and r.values["power_w"] == 38.5
    assert r.absent == {"memory_temperature_c", "max_sm_clock_mhz", "clock_event_reasons", "ecc_uncorrected"}
    assert r.values["sm_clock_mhz"] == 1500 and r.values["memory_total_mib"] == 65536


def test_mthreads_q_fills_what_the_query_lacks() -> None:
    (q,) = parse_q((MT / "q.txt").read_text())
    assert q.gpu == 0 and q.name == "MTT M1000"
    assert q.values["clock_event_reasons"] == 0x8 and reason_names(0x8) == ("hw_slowdown",)
    assert q.values["max_sm_clock_mhz"] == 1800  # Max Clocks / Graphics: no SM line
    assert q.values["ecc_uncorrected"] == 0  # DRAM Uncorrectable, not Correctable
    assert q.values["utilization_pct"] == 35 and q.values["memory_used_mib"] == 2048
    assert "memory_temperature_c" in q.absent
    (r,) = parse_csv((MT / "query-unsupported.csv").read_text(), QueryPlan.initial("mthreads-gmi").columns)
    m = r.merged(q, frozenset({"clock_event_reasons", "max_sm_clock_mhz"}))
    assert m.values["clock_event_reasons"] == 8 and m.values["max_sm_clock_mhz"] == 1800
    assert m.absent == {"memory_temperature_c", "ecc_uncorrected"}


@pytest.mark.parametrize(("raw", "kind", "want"), [
    ("N/A", "float", None), ("[N/A]", "float", None), ("[Not Supported]", "int", None), ("", "float", None),
    ("[Unknown Error]", "float", None), ("84.26 W", "float", 84.26), ("795 MHz", "float", 795.0),
    ("0 %", "float", 0.0), ("143771 MiB", "float", 143771.0), ("38", "float", 38.0), ("47C", "float", 47.0),
    ("0x0000000000000048", "bitmask", 0x48), ("9", "bitmask", 9), ("nonsense", "float", None),
    ("NVIDIA H200", "text", "NVIDIA H200"), ("3", "int", 3),
])
def test_convert(raw: str, kind: str, want: object) -> None:
    assert convert(raw, kind) == want


def test_invalid_field_message() -> None:
    assert invalid_field((MT / "invalid-field.txt").read_text()) == "clocks_event_reasons.active"
    assert invalid_field("0, 45, 30") is None


def test_plan_refuses_a_name_then_the_field() -> None:
    plan = QueryPlan.initial("/usr/bin/nvidia-smi")
    argv = plan.argv()
    assert argv[0] == "/usr/bin/nvidia-smi" and argv[2] == "--format=csv,noheader,nounits"
    assert argv[1].startswith("--query-gpu=index,name,uuid,temperature.gpu,")
    again = plan.refuse("clocks_event_reasons.active")
    assert again is not None and "clocks_throttle_reasons.active" in again.names and not again.dropped
    gone = again.refuse("clocks_throttle_reasons.active")
    assert gone is not None and gone.dropped == ("clock_event_reasons",)
    assert all("reasons" not in n for n in gone.names) and len(gone.columns) == len(FIELDS) - 1
    assert plan.refuse("index") is None and plan.refuse("not.asked") is None
    assert plan.q_argv() == ["/usr/bin/nvidia-smi", "-q"]


def test_choose_tool_prefers_mthreads_gmi(tmp_path: Path) -> None:
    both = {"mthreads-gmi": "/opt/mt/mthreads-gmi", "nvidia-smi": "/usr/bin/nvidia-smi"}
    assert choose_tool(None, both.get) == "/opt/mt/mthreads-gmi"
    assert choose_tool(None, {"nvidia-smi": "/usr/bin/nvidia-smi"}.get) == "/usr/bin/nvidia-smi"
    none: dict[str, str] = {}
    assert choose_tool(None, none.get) is None
    assert choose_tool("nvidia-smi", both.get) == "/usr/bin/nvidia-smi"
    tool = tmp_path / "gmi"
    tool.write_text("#!/bin/sh\n")
    assert choose_tool(str(tool), none.get) is None  # not executable
    tool.chmod(0o755)
    assert choose_tool(str(tool), none.get) == str(tool)


def test_every_numeric_field_is_a_sample_attribute() -> None:
    for f in FIELDS:
        if f.name not in ("gpu", "name", "uuid"):
            assert f.name in DeviceSample.model_fields, f.name
            assert BY_NAME[f.name] is f


def test_real_invalid_field_message_and_load_readings() -> None:
    assert invalid_field((H200 / "invalid-field.txt").read_text()) == "bogus.field"
    cols = QueryPlan.initial("nvidia-smi").columns
    plain, header, units = (H200 / "query-load.csv").read_text().splitlines()
    a, b = parse_csv(plain, cols)[0], parse_csv(header + "\n" + units, cols)[0]
    for r in (a, b):
        assert reason_names(int(r.values["clock_event_reasons"])) == ("sw_power_cap",)
        assert r.values["utilization_pct"] == 100 and r.values["max_sm_clock_mhz"] == 1980
    assert a.values["sm_clock_mhz"] == 1455 and b.values["sm_clock_mhz"] == 1470
    (q,) = parse_q((H200 / "nvidia-smi-q-load.txt").read_text())
    assert q.values["clock_event_reasons"] == 0x4 and q.values["utilization_pct"] == 100


def test_summary_of_the_agents_own_samples_under_load() -> None:
    from agent.telemetry import read_samples

    samples = list(read_samples(H200 / "sampler-matmul.jsonl"))
    assert len(samples) == 96
    s = summarize(samples, run_id="h200-load", module="h200", tool="nvidia-smi")
    by_key = {k.model_key: k for k in s.keys}
    assert list(by_key) == ["idle", "matmul", "cooldown"]
    idle, load = by_key["idle"], by_key["matmul"]
    assert idle.fields["sm_clock_mhz"].max == 345 and idle.reasons["gpu_idle"] == 1.0
    # under a bf16 matmul loop the H200 sits at its 700 W cap: SW power cap, SM clock below its 1980 MHz
    assert load.reasons["sw_power_cap"] > 0.8 and load.fields["power_w"].p95 > 650
    assert load.fields["sm_clock_mhz"].p95 < 1980 * 0.85 and load.fields["max_sm_clock_mhz"].min == 1980
