"""Probe rows beside release rows: on the module, in the run history, in reports and in the metrics."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from agent.metrics import build_registry
from agent.probe.compare import FLAG, cross_check, probe_row
from agent.probe.records import LoadShape, ProfileResult, Stat
from agent.store import RunStore
from agent.tables import parse_seed
from contract.records import ResultRow, RunProgress, RunState
from controller.history import ROW_FIELDS, History, row_to_db
from controller.report import build_report
from controller.report.render import to_json, to_markdown, verdict_line
from controller.report.render.html import to_html


def _stat(v: float) -> Stat:
    return Stat(n=2, mean=v, p50=v, p90=v, p99=v)


def _probe_result(row: ResultRow, factor: float = 1.0) -> ProfileResult:
    assert row.ttft_ms and row.tpot_ms and row.prefill_len
    return ProfileResult(profile=row.profile, prefill_len=row.prefill_len, input_len=row.input_tokens or 0,
                         output_len=100, api="completions", load=LoadShape(), requests=2, ok=2,
                         ttft_ms=_stat(row.ttft_ms * factor), tpot_ms=_stat(row.tpot_ms * factor), output_tokens=200)


def _run_rows(seed_text: str, module: str, skewed: bool) -> list[ResultRow]:
    """One module's qwen3 and qwen35 rows, probed on 128:128; ``skewed``: qwen3's benchmark reports
    times 20 % shorter than the probe measures."""
    seed = parse_seed(seed_text)
    out: list[ResultRow] = []
    for key in ("qwen3", "qwen35"):
        rows = [r.model_copy(update={"run_id": "run-1", "module": module, "release": "1.4.2", "model_key": key})
                for r in seed[key]]
        target = next(r for r in rows if r.profile == "128:128")
        result = _probe_result(target, 1.25 if skewed and key == "qwen3" else 1.0)
        probes = [probe_row(result, target)]
        checked, _, _ = cross_check(rows, [result])
        out += checked + probes
    return out


def test_store_keeps_probe_rows_beside_release_rows(tmp_path: Path, seed_text: str) -> None:
    store = RunStore(tmp_path)
    rows = _run_rows(seed_text, "m1", skewed=True)
    store.put_rows("run-1", "qwen3", [r for r in rows if r.model_key == "qwen3"])
    got = store.rows("run-1")
    assert len(got) == len(parse_seed(seed_text)["qwen3"]) + 1
    pair = [r for r in got if r.profile == "128:128"]
    assert sorted(r.source for r in pair) == ["probe", "release"]
    assert next(r for r in pair if r.source == "release").flags == (FLAG,)


def test_history_keys_rows_by_source_and_migrates_an_old_history(tmp_path: Path, seed_text: str) -> None:
    path = tmp_path / "old.sqlite"
    old_fields = list(ROW_FIELDS[:ROW_FIELDS.index("source")])  # the fields before "source" came
    conn = sqlite3.connect(path)
    cols = ", ".join(f'"{f}"' for f in old_fields)
    conn.executescript(f"CREATE TABLE rows ({cols}, PRIMARY KEY (run_id, module, model_key, profile));"
                       " CREATE INDEX rows_module ON rows (module, model_key);")
    row = _run_rows(seed_text, "m1", skewed=False)[0]
    conn.execute(f"INSERT INTO rows VALUES ({','.join('?' * len(old_fields))})", row_to_db(row)[:len(old_fields)])
    conn.commit()
    conn.close()
    h = History(path)
    try:
        assert h.rows("run-1") == [row]  # the old row, now with source "release"
        pk = [r[1] for r in h.conn.execute("PRAGMA table_info(rows)") if r[5]]
        assert pk == ["run_id", "module", "model_key", "profile", "source"]
        probe = row.model_copy(update={"source": "probe", "ttft_ms": 1.0})
        assert h.upsert_rows([probe]) == 1
        assert {r.source for r in h.rows("run-1", source=None)} == {"release", "probe"}
        assert h.rows("run-1") == [row] and h.rows("run-1", source="probe") == [probe]  # the release's by default
        assert h.upsert_rows([probe]) == 1  # the same row again: replaced, not added
        assert len(h.rows("run-1", source=None)) == 2 and h.row_count("run-1") == 1
    finally:
        h.close()
    History(path).close()  # opening a migrated history again changes nothing


def _history(tmp_path: Path, seed_text: str, skewed_module: str | None) -> History:
    h = History(tmp_path / "h.sqlite")
    h.create_run("run-1", release="1.4.2", models=("qwen3", "qwen35"), modules=("m1", "m2", "m3"), state="done")
    for m in ("m1", "m2", "m3"):
        h.upsert_rows(_run_rows(seed_text, m, skewed=m == skewed_module))
    return h


@pytest.mark.slow  # over the fast tier's 2 s CPU budget with a neighbour on the other core
def test_report_lists_disagreements_and_keeps_probe_rows_out_of_the_verdict(tmp_path: Path, seed_text: str):
    h = _history(tmp_path, seed_text, "m2")
    try:
        rep = build_report(h, "run-1")
        assert set(rep.rows["source"]) == {"release"} and len(rep.rows) == 3 * 22  # probe rows not in the figures
        assert rep.verdict == "pass" and rep.probe_checked == 6
        assert [(d.module, d.model_key, d.profile, d.metric) for d in rep.disagreements] == [
            ("m2", "qwen3", "128:128", m) for m in ("ttft_ms", "tpot_ms", "prefill_tps", "decode_tps")]
        d = rep.disagreements[0]
        assert d.change == pytest.approx(1 / 1.25 - 1)  # release TTFT 20 % below the probe's
        assert "release benchmark disagrees with the probe on 4 figure(s): m2[qwen3]" in verdict_line(rep)
        md = to_markdown(rep)
        section = md.split("## Release benchmark vs probe")[1].split("\n## ")[0]
        assert "| m2 | qwen3 | 128:128 | ttft_ms |" in section and "-20.0%" in section
        doc = json.loads(to_json(rep))
        assert len(doc["disagreements"]) == 4 and doc["probe_checked"] == 6
        assert "Release benchmark vs probe" in to_html(rep) and "m2" in to_html(rep)
    finally:
        h.close()


def test_report_without_disagreement_says_so(tmp_path: Path, seed_text: str) -> None:
    h = _history(tmp_path, seed_text, None)
    try:
        rep = build_report(h, "run-1")
        assert rep.disagreements == () and "disagrees" not in verdict_line(rep)
        assert "every figure agrees within the noise band the agent measured beside each (rows without one: 5%)" \
            in to_markdown(rep)
    finally:
        h.close()


def test_agent_metrics_count_disagreements_and_ignore_probe_figures(tmp_path: Path, seed_text: str) -> None:
    store = RunStore(tmp_path)
    rows = _run_rows(seed_text, "m1", skewed=True)
    for key in ("qwen3", "qwen35"):
        store.put_rows("run-1", key, [r for r in rows if r.model_key == key])
    store.write_progress(RunProgress(run_id="run-1", module="m1", release="1.4.2", state=RunState.DONE,
                                     started_at=1.0, updated_at=2.0))
    reg = build_registry(tmp_path, "m1", process=False)
    labels = {"release": "1.4.2", "model_key": "qwen3"}
    assert reg.get_sample_value("m1000_result_release_benchmark_disagreements", labels) == 1
    assert reg.get_sample_value("m1000_result_release_benchmark_disagreements",
                                {**labels, "model_key": "qwen35"}) == 0
    assert reg.get_sample_value("m1000_result_rows", labels) == 11  # release rows only
    release_ttft = next(r.ttft_ms for r in rows if r.source == "release" and r.model_key == "qwen3"
                        and r.profile == "128:128")
    assert release_ttft is not None
    assert reg.get_sample_value("m1000_result_ttft_seconds", {**labels, "profile": "128:128"}) == pytest.approx(
        release_ttft / 1000)
