"""``mthreads-gmi --query --json``: the published S5000 output and variants made from it, and the sampler's
fallback from JSON to the query CSV and ``-q`` (fast tier).

``tests/fixtures/mthreads/published/query-json-s5000.json`` is real output (two of eight cards kept); each
variant changes one thing of it: a section missing, ``N/A`` values, the trailing-space key without its space,
one card or two, a card without ``"Index"``.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from agent.telemetry import SAMPLES_FILE, Sampler, TelemetryConfig, ToolResult, read_samples
from agent.telemetry.gmi_json import NotGmiJson, parse_json
from agent.telemetry.plan import QueryPlan

FIX = Path(__file__).resolve().parents[1] / "fixtures"
SAMPLE = (FIX / "mthreads" / "published" / "query-json-s5000.json").read_text()
DOC: dict[str, Any] = json.loads(SAMPLE)
MT_ROW = (FIX / "mthreads" / "query-unsupported.csv").read_text()
MT_Q = (FIX / "mthreads" / "q.txt").read_text()


def variant(change: Any) -> str:
    doc = copy.deepcopy(DOC)
    change(doc)
    return json.dumps(doc)


def test_the_published_sample() -> None:
    got = parse_json(SAMPLE)
    assert got.driver == "3.3.5-server" and dict(got.firmware) == {0: "4.3.41", 1: "4.3.41"}
    a, b = got.readings
    assert (a.gpu, a.name, a.uuid) == (0, "MTT S5000", "399282a8-ba01-1475-893c-2eeca9e302f5")
    assert dict(a.values) == {"temperature_c": 27, "power_w": 96.66, "power_limit_w": 950, "utilization_pct": 0,
                              "memory_utilization_pct": 0, "memory_used_mib": 0, "memory_total_mib": 81920}
    assert a.absent == {"memory_temperature_c", "sm_clock_mhz", "memory_clock_mhz", "graphics_clock_mhz",
                        "max_sm_clock_mhz", "clock_event_reasons", "ecc_uncorrected"}
    # the second card lacks "Product Brand", "PCI", "Utilization/Memory" and "Current Power Limit"
    assert (b.gpu, b.name, b.uuid) == (1, "MTT S5000", "5ebdeb63-ba7a-5904-4f16-495b3e1de6c8")
    assert dict(b.values) == {"temperature_c": 26, "power_w": 97.09, "utilization_pct": 0, "memory_used_mib": 0,
                              "memory_total_mib": 81920}
    assert {"power_limit_w", "memory_utilization_pct"} <= b.absent


def test_a_missing_section_is_absent_for_its_fields_only() -> None:
    def drop(doc: dict[str, Any]) -> None:
        del doc["GPU"][0]["Temperature"]
        del doc["GPU"][0]["FB Memory Usage"]["Total"]

    (a, _) = parse_json(variant(drop)).readings
    assert {"temperature_c", "memory_total_mib"} <= a.absent
    assert a.values["power_w"] == 96.66 and a.values["memory_used_mib"] == 0


def test_n_a_values_are_absent_and_the_rest_is_kept() -> None:
    def na(doc: dict[str, Any]) -> None:
        doc["GPU"][0]["Power Readings"]["Power Draw "] = "N/A"
        doc["GPU"][0]["Temperature"]["GPU Current Temp"] = "[N/A]"
        doc["GPU"][0]["MTBios Version"] = "N/A"
        doc["Driver Version"] = "N/A"

    got = parse_json(variant(na))
    a = got.readings[0]
    assert {"power_w", "temperature_c"} <= a.absent and "power_w" not in a.values
    assert a.values["power_limit_w"] == 950 and a.values["memory_total_mib"] == 81920
    assert got.driver is None and dict(got.firmware) == {1: "4.3.41"}


@pytest.mark.parametrize("key", ["Power Draw ", "Power Draw", "power draw", "Power  Draw "])
def test_the_power_key_with_or_without_its_trailing_space(key: str) -> None:
    def rename(doc: dict[str, Any]) -> None:
        for card in doc["GPU"]:
            card["Power Readings"] = {key: card["Power Readings"].pop("Power Draw "), **card["Power Readings"]}

    a, b = parse_json(variant(rename)).readings
    assert (a.values["power_w"], b.values["power_w"]) == (96.66, 97.09)


def test_two_cards_one_card_and_a_card_as_an_object() -> None:
    assert [r.gpu for r in parse_json(SAMPLE).readings] == [0, 1]
    (one,) = parse_json(variant(lambda d: d["GPU"].pop())).readings
    assert one.gpu == 0 and one.values["power_w"] == 96.66

    def as_object(doc: dict[str, Any]) -> None:
        doc["GPU"] = doc["GPU"][1]

    (only,) = parse_json(variant(as_object)).readings
    assert only.gpu == 1 and only.values["power_w"] == 97.09


def test_cards_without_index_are_numbered_in_order() -> None:
    def no_index(doc: dict[str, Any]) -> None:
        for card in doc["GPU"]:
            del card["Index"]
        doc["GPU"].reverse()

    a, b = parse_json(variant(no_index)).readings
    assert (a.gpu, a.values["power_w"]) == (0, 97.09) and (b.gpu, b.values["power_w"]) == (1, 96.66)


@pytest.mark.parametrize(("text", "why"), [
    ("", "not JSON (JSONDecodeError): 'nothing'"),
    (MT_Q, "not JSON (JSONDecodeError): '==============GMI LOG=============='"),
    ('{"Driver Version": "3.3.5-server"}', 'JSON without a "GPU" list of cards'),
    ('{"GPU": []}', 'JSON without a "GPU" list of cards'),
    ('[1, 2]', 'JSON without a "GPU" list of cards'),
])
def test_what_is_not_the_json_answer_says_what_it_was(text: str, why: str) -> None:
    with pytest.raises(NotGmiJson) as info:
        parse_json(text)
    assert str(info.value) == why


def test_the_plan_asks_for_json_first() -> None:
    assert QueryPlan.initial("/usr/bin/mthreads-gmi").json_argv() == ["/usr/bin/mthreads-gmi", "--query", "--json"]


# -- the sampler's fallback chain: JSON, then the query CSV, then -q for what the CSV lacks ------------------
class Tool:
    """A device tool that answers ``--json`` with ``json`` (on stderr when it exits ``json_exit`` > 0), the query
    with the hand-made row (it refuses the clock-event reasons), ``-q`` with the hand-made text."""

    def __init__(self, json: str, json_exit: int = 0) -> None:
        self.json, self.json_exit = json, json_exit
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], timeout: float, stop: threading.Event) -> ToolResult:
        self.calls.append(list(argv))
        if "--json" in argv:
            if self.json_exit:
                return ToolResult("failed", self.json_exit, "", self.json)
            return ToolResult("ok", 0, self.json)
        if argv[1] == "-q":
            return ToolResult("ok", 0, MT_Q)
        name = next((n for n in argv[1].split("=", 1)[1].split(",") if n.startswith("clocks_")), None)
        if name:
            return ToolResult("failed", 2, f'Field "{name}" is not a valid field to query.\n')
        return ToolResult("ok", 0, MT_ROW.replace(", [Not Supported], N/A", ", N/A"))


def run(tmp_path: Path, tool: Tool, n: int = 4) -> tuple[Sampler, list[tuple[str, str]]]:
    events: list[tuple[str, str]] = []
    s = Sampler(TelemetryConfig(period_s=0.01), tmp_path / SAMPLES_FILE, run_id="r", module="m",
                on_event=lambda st, msg: events.append((st, msg)), runner=tool, which=lambda n: f"/usr/bin/{n}")
    s.start()
    for _ in range(500):
        if s.samples >= n:
            break
        threading.Event().wait(0.01)
    s.stop()
    return s, events


def test_json_answers_are_the_samples_and_nothing_else_is_asked(tmp_path: Path) -> None:
    tool = Tool(SAMPLE)
    s, events = run(tmp_path, tool)
    assert events == [] and s.mode == "json"
    assert {tuple(c[1:]) for c in tool.calls} == {("--query", "--json")}
    got = list(read_samples(tmp_path / SAMPLES_FILE))
    assert [(x.gpu, x.power_w) for x in got[:2]] == [(0, 96.66), (1, 97.09)]
    assert s.driver == "3.3.5-server" and s.firmware == {0: "4.3.41", 1: "4.3.41"}
    assert [d.name for d in s.summary().devices] == ["MTT S5000", "MTT S5000"]


@pytest.mark.parametrize(("json_out", "code", "why"), [
    ("mthreads-gmi: unrecognized option '--json'", 2,
     "exit code 2: mthreads-gmi: unrecognized option '--json'"),  # refuses the flag
    (MT_Q, 0, "not JSON (JSONDecodeError): '==============GMI LOG=============='"),  # ignores it
])
def test_json_refused_falls_back_to_csv_then_q(tmp_path: Path, json_out: str, code: int, why: str) -> None:
    tool = Tool(json_out, code)
    s, events = run(tmp_path, tool)
    assert s.mode == "csv" and sum(1 for c in tool.calls if "--json" in c) == 1
    assert len(events) == 3 and set(events) == {
        ("info", f"mthreads-gmi does not answer '--query --json' ({why}); reading its --query-gpu CSV and -q"),
        ("info", "clock_event_reasons, ecc_uncorrected, max_sm_clock_mhz read from 'mthreads-gmi -q' every 10 samples"),
        ("info", "mthreads-gmi's query interface does not offer clock_event_reasons")}
    last = list(read_samples(tmp_path / SAMPLES_FILE))[-1]
    assert last.temperature_c == 47  # the CSV
    assert last.clock_event_reasons == 0x8  # -q, for what the CSV refused
    assert s.driver is None


def test_a_broken_tool_keeps_asking_json(tmp_path: Path) -> None:
    """A tool failing both ways is not switched to CSV: the failure is noted, JSON asked again."""
    def broken(argv: Sequence[str], timeout: float, stop: threading.Event) -> ToolResult:
        return ToolResult("failed", 9, "", "GPU is lost")

    s = Sampler(TelemetryConfig(period_s=0.01, backoff_max_s=0.02), tmp_path / SAMPLES_FILE, run_id="r", module="m",
                runner=broken, which=lambda n: f"/usr/bin/{n}").start()
    threading.Event().wait(0.2)
    s.stop()
    assert s.mode == "json" and s.notes == ["mthreads-gmi exited with code 9: GPU is lost"]
