"""``fleetctl results --energy``: one record per module and model key, from the run history (fast tier)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from contract.energy import EnergyWindow
from contract.records import ResultRow
from controller.history import History
from tests.support.cli import finished_run, run_main

WINDOW = EnergyWindow(source="samples", start=10.0, end=20.0, window_s=10.0, samples=11, period_s=1.0,
                      coverage=1.0, max_gap_s=1.0, output_tokens=200, idle_samples=5)


def _row(module: str, profile: str, **kw: Any) -> ResultRow:
    return ResultRow(run_id="run-e", module=module, model_key="qwen3", table="sweep", profile=profile,
                     model="Qwen3", decode_tps=24.5, output_tokens=100, **kw)


def test_results_energy_lists_each_window_once(env: Path, capsys) -> None:
    figures = {"energy_j": 500.0, "j_per_token": 2.5, "tokens_per_j": 0.4, "avg_power_w": 50.0,
               "idle_power_w": 20.0, "energy_above_idle_j": 300.0, "energy": WINDOW}
    h = History(env / "history.sqlite")
    try:
        finished_run(h, "run-e", modules=["m1", "m2"], state="done")
        h.upsert_rows([_row("m1", "128:128", **figures), _row("m1", "250:250", **figures),
                       _row("m2", "128:128")])
    finally:
        h.close()
    code, out, _ = run_main(capsys, "results", "run-e", "--energy", "-o", "json")
    assert code == 0
    recs = json.loads(out)
    assert [(r["module"], r["rows"], r["j_per_token"], r["tokens_per_j"], r["source"], r["coverage"]) for r in recs] \
        == [("m1", 2, 2.5, 0.4, "samples", 1.0), ("m2", 1, None, None, "", None)]
    assert recs[0]["idle_power_w"] == 20.0 and recs[0]["energy_above_idle_j"] == 300.0 and recs[0]["note"] == ""
    assert recs[1]["note"].startswith("not measured")
    code, out, _ = run_main(capsys, "results", "run-e", "--energy", "-o", "csv")
    assert code == 0 and out.splitlines()[0].startswith("module,model_key,rows,j_per_token,tokens_per_j")
    assert out.splitlines()[1] == "m1,qwen3,2,2.5,0.4,50,20,500,300,10,samples,1,"
    code, out, _ = run_main(capsys, "results", "run-e", "-o", "csv")  # the rows themselves: energy as JSON
    assert code == 0 and '""source"": ""samples""' in out


def test_report_takes_an_energy_tolerance_of_its_own(filled: Path, capsys) -> None:
    code, out, _ = run_main(capsys, "report", "run-a", "--energy-tolerance", "0.1", "-o", "json")
    assert code == 0 and json.loads(out)["thresholds"]["energy_tolerance"] == 0.1
    code, _, err = run_main(capsys, "report", "run-a", "--energy-tolerance", "1.5")
    assert code == 2 and "--energy-tolerance must be a fraction between 0 and 1, got 1.5" in err
