"""The SLO sweep's capacity row: stored beside the others, kept out of the verdict, a report section, a metric."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.metrics import build_registry
from agent.probe.compare import capacity_row
from agent.probe.sweep import Level, SweepResult, SweepSLO
from agent.store import RunStore
from agent.tables import parse_seed
from contract.records import ResultRow, RunProgress, RunState
from controller.history import History
from controller.report import build_report
from controller.report.render import to_json, to_markdown
from controller.report.render.html import to_html

SLO = SweepSLO.parse("ttft_p90_ms=8000,tpot_p90_ms=60")


def _sweep(capacity: int | None) -> SweepResult:
    levels = [Level(concurrency=c, sent=10, window=8, ok=8, met=capacity is not None and c <= capacity,
                    output_tps=16.4 * c, request_rps=0.164 * c,
                    figures={"ttft_p50_ms": 2000.0 * c, "ttft_p90_ms": 2100.0 * c, "tpot_p50_ms": 40.0 + c,
                             "tpot_p90_ms": 41.0 + c}) for c in (1, 2, 4)]
    cap = next((lv for lv in levels if lv.concurrency == capacity), None)
    return SweepResult(profile="128:128", slo=SLO, levels=tuple(levels), capacity=cap, stop="slo", wall_s=12.0)


def _rows(seed_text: str, module: str, capacity: int | None) -> list[ResultRow]:
    rows = [r.model_copy(update={"run_id": "run-1", "module": module, "release": "1.4.2", "model_key": "qwen3"})
            for r in parse_seed(seed_text)["qwen3"]]
    like = next(r for r in rows if r.profile == "128:128")
    return [*rows, capacity_row(_sweep(capacity), like)]


def test_capacity_row_names_the_highest_level_that_met_the_slo(seed_text: str) -> None:
    row = _rows(seed_text, "m1", 2)[-1]
    assert (row.source, row.profile, row.batch, row.model_key) == ("probe", "capacity:128:128", 2, "qwen3")
    assert row.ttft_ms == 4000.0 and row.tpot_ms == 42.0
    assert row.extra["sweep_levels"] == "1:met,2:met,4:broken" and row.extra["sweep_stop"] == "slo"
    assert row.extra["sweep_slo"] == "ttft_p90_ms=8000,tpot_p90_ms=60" and row.extra["output_tps"] == "32.8"
    none = _rows(seed_text, "m1", None)[-1]
    assert none.batch is None and none.ttft_ms is None and "output_tps" not in none.extra


def test_report_has_a_capacity_section_and_the_verdict_ignores_it(tmp_path: Path, seed_text: str) -> None:
    h = History(tmp_path / "h.sqlite")
    try:
        h.create_run("run-1", release="1.4.2", models=("qwen3",), modules=("m1", "m2", "m3"), state="done")
        for m, cap in (("m1", 2), ("m2", 4), ("m3", None)):
            h.upsert_rows(_rows(seed_text, m, cap))
        rep = build_report(h, "run-1")
        assert set(rep.rows["source"]) == {"release"} and rep.verdict == "pass"
        assert [(c.module, c.concurrency, c.output_tps) for c in rep.capacities] == [
            ("m1", 2, pytest.approx(32.8)), ("m2", 4, pytest.approx(65.6)), ("m3", None, None)]
        assert rep.capacities[1].ttft_p90_ms == 8400.0 and rep.capacities[1].levels == "1:met,2:met,4:met"
        section = to_markdown(rep).split("## Capacity at SLO")[1].split("\n## ")[0]
        assert "| m2 | qwen3 | 128:128 | ttft_p90_ms=8000,tpot_p90_ms=60 | 4 | 65.6 |" in section
        assert "| m3 | qwen3 | 128:128 | ttft_p90_ms=8000,tpot_p90_ms=60 | none |" in section
        assert [c["concurrency"] for c in json.loads(to_json(rep))["capacities"]] == [2, 4, None]
        assert "Capacity at SLO" in to_html(rep)
    finally:
        h.close()


def test_agent_exports_the_capacity_of_the_latest_sweep(tmp_path: Path, seed_text: str) -> None:
    store = RunStore(tmp_path)
    store.put_rows("run-1", "qwen3", _rows(seed_text, "m1", 4))
    store.write_progress(RunProgress(run_id="run-1", module="m1", release="1.4.2", state=RunState.DONE,
                                     started_at=1.0, updated_at=2.0))
    reg = build_registry(tmp_path, "m1", process=False)
    labels = {"release": "1.4.2", "model_key": "qwen3", "profile": "128:128"}
    assert reg.get_sample_value("m1000_result_capacity_concurrency", labels) == 4
    assert reg.get_sample_value("m1000_result_capacity_output_tokens_per_second", labels) == pytest.approx(65.6)
    assert reg.get_sample_value("m1000_result_ttft_seconds", {**labels, "profile": "capacity:128:128"}) is None
