"""The commands against a real SQLite run history (typer CliRunner on our own app)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd
import pytest
import typer
from typer.testing import CliRunner

from controller.cli import report as report_cli
from controller.history import History
from controller.report import build_report, compare_runs
from controller.report.render import verdict_line
from controller.report.synth import fleet
from tests.support.cli import given_app
from tests.support.frames import frame_to_rows

MODULES = [f"m{i:02d}" for i in range(6)]


def _app(history: History) -> typer.Typer:
    return given_app(history)


def _store(history: History, df: pd.DataFrame, run_id: str, release: str, keys: list[str]) -> None:
    history.create_run(run_id, release=release, models=keys, modules=MODULES)
    history.upsert_rows(frame_to_rows(df))
    history.set_run_state(run_id, "done")
    time.sleep(0.01)  # created_at orders the runs


def _fill(history: History, reference: pd.DataFrame, seed_path: Path) -> None:
    """Baseline from the seed, a clean run of 1.4.1 and a run of 1.4.2 with a decode regression."""
    res = CliRunner().invoke(_app(history), ["baseline", "import", str(seed_path), "--release", "1.4.1"])
    assert res.exit_code == 0, res.output
    keys = sorted(set(reference["model_key"]))
    _store(history, fleet(reference, module_factor={"m03": 0.88}, seed=1, run_id="run-a", release="1.4.1"),
           "run-a", "1.4.1", keys)
    _store(history, fleet(reference, module_factor={"m03": 0.88}, regress={("qwen3", "decode_tps"): 0.08}, seed=2,
                          run_id="run-b", release="1.4.2"), "run-b", "1.4.2", keys)


@pytest.fixture(scope="module")
def shared(reference, seed_path, tmp_path_factory):
    """A filled history the read-only tests share."""
    h = History(tmp_path_factory.mktemp("hist") / "history.sqlite")
    _fill(h, reference, seed_path)
    yield h
    h.close()


@pytest.fixture
def history(tmp_path: Path):
    h = History(tmp_path / "history.sqlite")
    yield h
    h.close()


@pytest.fixture
def stored(history, reference, seed_path):
    """A filled history of this test's own (for tests that add baselines)."""
    _fill(history, reference, seed_path)
    return history


@pytest.fixture
def app(shared: History) -> typer.Typer:
    return _app(shared)


def test_baseline_import_list_and_versions(stored, seed_path):
    app = _app(stored)
    assert stored.baseline_run_id(None, release="1.4.1") == "baseline:1.4.1:v1"
    res = CliRunner().invoke(app, ["baseline", "import", str(seed_path), "--release", "1.4.1"])
    assert res.exit_code == 0 and "1.4.1@v2" in res.output
    res = CliRunner().invoke(app, ["baseline", "list", "-o", "csv"])
    assert res.exit_code == 0
    assert "1.4.1@v1,baseline:1.4.1:v1,92," in res.output and "1.4.1@v2" in res.output


def test_baseline_set_promotes_a_run(stored):
    res = CliRunner().invoke(_app(stored), ["baseline", "set", "run-a"])
    assert res.exit_code == 0, res.output
    bid = stored.baseline_run_id("1.4.1@v2")
    assert bid == "baseline:1.4.1:v2" and stored.row_count(bid) == 6 * 92
    rep = build_report(stored, "run-b", baseline="1.4.1@v2")
    assert [(r.module, r.model_key, r.metric) for r in rep.regressions] == [("*", "qwen3", "decode_tps")]


def test_report_from_history_names_regression_and_outlier(shared):
    rep = build_report(shared, "run-b")
    assert rep.baseline_id == "baseline:1.4.1:v1" and rep.previous_ids == ("run-a",)
    assert [(r.module, r.model_key, r.profile, r.metric) for r in rep.regressions] == [
        ("*", "qwen3", "*", "decode_tps")]
    assert rep.regressions[0].against == "baseline+previous"
    assert [(o.module, o.model_key) for o in rep.outliers] == [("m03", "*")]
    assert rep.verdict == "regressed"
    assert verdict_line(rep).startswith("REGRESSED run-b (1.4.2 vs baseline:1.4.1:v1): 1 regression(s): fleet: qwen3")


def test_report_json_contract(app):
    res = CliRunner().invoke(app, ["report", "run-b", "--format", "json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["verdict"] == "regressed"
    (reg,) = doc["regressions"]
    assert {k: reg[k] for k in ("module", "model_key", "profile", "metric")} == {
        "module": "*", "model_key": "qwen3", "profile": "*", "metric": "decode_tps"}
    assert reg["baseline"] > reg["value"] and -0.12 < reg["change"] < -0.05
    (out,) = doc["outliers"]
    assert out["module"] == "m03" and 0.85 < out["factor"] < 0.91


def test_report_markdown_to_stdout_and_check_exit(app):
    res = CliRunner().invoke(app, ["report", "run-b", "--check"])
    assert res.exit_code == report_cli.EXIT_NOT_PASS and res.stdout.startswith("# Fleet report run-b")
    assert "| * | qwen3 | * | decode_tps |" in res.stdout and "| m03 | * | 0.8" in res.stdout
    assert CliRunner().invoke(app, ["report", "run-a", "--check"]).exit_code == 0


def test_report_csv_and_parquet_files(app, tmp_path):
    out = tmp_path / "out"
    res = CliRunner().invoke(app, ["report", "run-b", "--format", "csv", "--out", str(out)])
    assert res.exit_code == 0, res.output
    rows = pd.read_csv(out / "rows.csv")
    assert len(rows) == 6 * 92 and {"baseline_decode_tps", "change_decode_tps"} <= set(rows.columns)
    assert pd.read_parquet(out / "rows.parquet").shape == rows.shape
    regs = pd.read_csv(out / "regressions.csv")
    assert list(regs[["model_key", "metric"]].itertuples(index=False, name=None)) == [("qwen3", "decode_tps")]
    assert not list(out.glob(".*"))  # no temporary leftovers


def test_compare_two_runs(app, shared):
    rep = compare_runs(shared, "run-a", "run-b")
    assert [(r.module, r.model_key, r.metric, r.against) for r in rep.regressions] == [
        ("*", "qwen3", "decode_tps", "run-a")]
    res = CliRunner().invoke(app, ["compare", "run-a", "run-b", "--format", "json"])
    assert res.exit_code == 0 and json.loads(res.stdout)["verdict"] == "regressed"


@pytest.mark.parametrize(("args", "needle"), [
    (["report", "nope"], "no run 'nope'"),
    (["report", "run-b", "--baseline", "9.9"], "no baseline '9.9'"),
    (["report", "run-b", "--tolerance", "5"], "--tolerance must be a fraction"),
    (["compare", "run-a", "nope"], "no run 'nope'"),
    (["baseline", "set", "nope"], "no run 'nope'"),
    (["baseline", "import", "/nonexistent/seed.txt", "--release", "1"], "/nonexistent/seed.txt"),
])
def test_errors_are_one_clear_line(app, args, needle):
    res = CliRunner().invoke(app, args)
    assert res.exit_code == report_cli.EXIT_ERROR
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fleetctl: error: ") and needle in lines[0]


def test_bad_seed_table_names_the_line(history, tmp_path):
    app = _app(history)
    bad = tmp_path / "bad.txt"
    bad.write_text("Qwen3-30B-A3B-GPTQ-Int4 (x)\n\nModel\tSize\tInput(tokens)\tDecode(tps)\nQwen3\t30b\tmany\t2\n")
    res = CliRunner().invoke(app, ["baseline", "import", str(bad), "--release", "1"])
    assert res.exit_code == report_cli.EXIT_ERROR and f"{bad}:4" in res.stderr


def test_unfinished_run_is_incomplete(history, reference):
    history.create_run("run-x", release="1.4.2", models=["qwen3", "qwen35"], modules=MODULES)
    part = fleet(reference, seed=3, run_id="run-x")
    history.upsert_rows(frame_to_rows(part[part["model_key"] == "qwen3"]))
    rep = build_report(history, "run-x")
    assert rep.verdict == "incomplete" and rep.baseline_id is None
    assert any("qwen35" in n for n in rep.notes)


def test_previous_run_without_rows_is_no_comparison(history, reference):
    """A module's previous run that failed before producing any row must not break the report."""
    history.create_run("run-empty", release="1.4.1", models=["qwen3"], modules=MODULES)
    history.set_run_state("run-empty", "failed")
    time.sleep(0.01)
    _store(history, fleet(reference, seed=4, run_id="run-next", release="1.4.1"), "run-next", "1.4.1",
           sorted(set(reference["model_key"])))
    rep = build_report(history, "run-next")
    assert rep.verdict in ("pass", "incomplete") and not rep.regressions
