"""Markdown, JSON, CSV and HTML forms of a report (fast tier; the browser test is separate)."""

from __future__ import annotations

import json
import re

import pytest

from controller.report import analyse
from controller.report.render import atomic_write, to_json, to_markdown, verdict_line, write_report
from controller.report.synth import fleet


@pytest.fixture(scope="module")
def report(reference):
    cur = fleet(reference, module_factor={"m03": 0.88}, regress={("qwen35", "decode_tps"): 0.08}, seed=31,
                run_id="run-b")
    return analyse(cur, run_id="run-b", release="1.4.2", baseline=reference, baseline_id="baseline:1.4.1:v1",
                   expected_modules=[f"m{i:02d}" for i in range(6)], expected_keys=sorted(set(reference["model_key"])))


def test_json_has_the_documented_fields(report):
    doc = json.loads(to_json(report))
    assert doc["verdict"] == "regressed" and doc["verdict_line"] == verdict_line(report)
    assert set(doc["regressions"][0]) >= {"module", "model_key", "profile", "metric", "baseline", "value", "change"}
    assert set(doc["outliers"][0]) >= {"module", "factor", "model_key", "worst"}
    assert {c["status"] for c in doc["changes"]} == {"regressed", "within tolerance"}
    assert len(doc["summary"]) == len(report.summary)


def test_markdown_tables_are_well_formed(report):
    md = to_markdown(report)
    assert md.startswith("# Fleet report run-b\n\n**REGRESSED run-b (1.4.2 vs baseline:1.4.1:v1)")
    for block in re.findall(r"((?:^\|.*\|\n)+)", md, flags=re.M):
        widths = {line.count("|") - line.count("\\|") for line in block.splitlines()}
        assert len(widths) == 1, block[:200]
    assert "| * | qwen35 | * | decode_tps |" in md and re.search(r"\| m03 \| \* \| 0\.(8[6-9]|9[01])x \|", md)
    assert "within tolerance" in md


def test_atomic_write_leaves_no_partial_file(tmp_path):
    target = tmp_path / "x.csv"
    target.write_text("old")

    def boom(p):
        p.write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        atomic_write(target, boom)
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["x.csv"]


def test_unknown_format_is_refused(report, tmp_path):
    with pytest.raises(ValueError, match="unknown report format 'pdf'"):
        write_report(report, "pdf", tmp_path)
