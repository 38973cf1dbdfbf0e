"""End to end (issue 45's acceptance): a release whose benchmark omits Decode(tps) is not PASS, and its verdict line
names the missing metric. The simulated release built with fault ``no-decode:qwen3`` (its benchmark prints every
table of qwen3 without that column), run by a real agent (``fleet-agent run``, real release processes) on two
modules, the rows in the controller's history beside the reference document imported as the baseline; qwen35,
whole, is the control."""

from __future__ import annotations

from pathlib import Path

import pytest

import simulator
from agent.tables import parse_seed
from contract.records import ResultRow
from controller.history import History
from controller.report import build_report
from controller.report.model import FLEET
from controller.report.render import to_markdown
from controller.report.render.text import verdict_line
from tests.support.agent_run import agent_rows

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
MODULES = ("sim-1", "sim-2")
KEYS = "qwen3,qwen35"


def _validate(tmp: Path, tarball: Path, run_id: str, module: str) -> list[ResultRow]:
    return agent_rows(tmp, tarball, run_id, module, KEYS,
                      {"BENCH_PROFILES": "128:128,500:500", "BENCH_REPEATS": "1"}, timeout=180)


def test_a_release_whose_benchmark_omits_decode_tps_is_not_pass_and_its_verdict_line_names_it(tmp_path: Path) -> None:
    rel = simulator.build_release(tmp_path / "rel", version="9.0.1", noise=0.0, faults="no-decode:qwen3")
    simulator.make_models(tmp_path / "models")
    seed = parse_seed((ROOT / "simulator/data/reference_tables.txt").read_text(encoding="utf-8"))
    h = History(tmp_path / "history.sqlite")
    try:
        h.add_baseline("9.0.0", [r for k in KEYS.split(",") for r in seed[k]], "reference document")
        h.create_run("r1", release=rel.version, models=KEYS.split(","), modules=list(MODULES))
        for module in MODULES:
            rows = [r for r in _validate(tmp_path, rel.path, "r1", module) if r.source == "release"]
            got = {(r.model_key, r.decode_tps is None) for r in rows}
            assert got == {("qwen3", True), ("qwen35", False)}, got  # the column is gone from qwen3's tables only
            assert all(r.tpot_ms for r in rows)  # TPOT(ms) still there: only the one metric is missing
            h.upsert_rows(rows)
        h.set_run_state("r1", "done")
        rep = build_report(h, "r1", "9.0.0")
    finally:
        h.close()
    assert rep.verdict != "pass"
    missing = [(r.module, r.model_key, r.metric) for r in rep.regressions if r.value is None and r.change is None]
    assert missing == [(FLEET, "qwen3", "decode_tps")], to_markdown(rep)
    line = verdict_line(rep)
    assert rep.verdict == "regressed" and "qwen3 decode_tps missing" in line, line
    assert "qwen35 decode_tps" not in line
