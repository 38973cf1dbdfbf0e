"""End to end (issue 34's acceptance): five simulated modules validate a release, then one built to start its
server 40 % slower (``regress_spec("qwen35:server_ready_s:0.4")``); real agents (``fleet-agent run``), real
release processes, the rows in the controller's history. The second run's report names qwen35's server ready time
regressed against each module's previous run, and nothing else of qwen35's or qwen3's start."""

from __future__ import annotations

from pathlib import Path

import pytest

import simulator
from contract.records import ResultRow
from controller.history import History
from controller.report import build_report
from controller.report.model import FLEET
from controller.report.render import to_markdown
from controller.report.render.text import startup_lines
from tests.support.agent_run import agent_rows

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
MODULES = ("sim-1", "sim-2", "sim-3", "sim-4", "sim-5")  # a t-test over 3 modules' starts names +35 % at p 0.014
KEYS = "qwen3,qwen35"


def _validate(tmp: Path, tarball: Path, run_id: str, module: str) -> list[ResultRow]:
    return agent_rows(tmp, tarball, run_id, module, KEYS,
                      {"BENCH_PROFILE_SET": "scale", "BENCH_REPEATS": "1", "BENCH_OUTPUT_LEN": "8"}, timeout=120)


def test_a_release_whose_server_starts_40_percent_slower_is_named_regressed_on_server_ready(tmp_path: Path) -> None:
    # time scale 20: a 20 s load in 1 s, 1.4 s in the slower release (the agent polls /health every 50 ms)
    a = simulator.build_release(tmp_path / "a", version="9.0.0", noise=0.0, time_scale=20.0)
    b = simulator.build_release(tmp_path / "b", version="9.0.1", noise=0.0, time_scale=20.0,
                                speed=simulator.regress_spec("qwen35:server_ready_s:0.4"))
    simulator.make_models(tmp_path / "models")
    h = History(tmp_path / "history.sqlite")
    try:
        for run_id, rel in (("ra", a), ("rb", b)):
            h.create_run(run_id, release=rel.version, models=KEYS.split(","), modules=list(MODULES))
            for module in MODULES:
                rows = _validate(tmp_path, rel.path, run_id, module)
                mine = [r for r in rows if r.source == "release"]
                assert mine and all(r.server_ready_s and r.precompile_source == "compiled" and r.precompile_s
                                    for r in mine)
                h.upsert_rows(rows)
            h.set_run_state(run_id, "done")
        rep = build_report(h, "rb")
    finally:
        h.close()
    ready = [(r.module, r.model_key, r.profile, r.against) for r in rep.regressions if r.metric == "server_ready_s"]
    figures = rep.rows.groupby(["run_id", "module", "model_key"], observed=True)["server_ready_s"].first()
    assert ready == [(FLEET, "qwen35", FLEET, "previous")], f"{figures}\n{to_markdown(rep)}"
    assert rep.verdict == "regressed"
    reg = next(r for r in rep.regressions if r.metric == "server_ready_s")
    assert reg.n == 5 and reg.detail == "t-test over 5 modules' starts (tolerance 15%, floor 0.1 s)", reg.detail
    assert 0.25 < (reg.change or 0) < 0.45  # 1.4x the load, the server's own start (~0.1 s) unchanged
    # only start-up costs moved: the throughput of the same simulated release is the same
    assert {r.metric for r in rep.regressions} <= {"server_ready_s", "warmup_s", "precompile_s"}, to_markdown(rep)
    status = {c.model_key: c.status for c in rep.changes if c.metric == "server_ready_s"}
    assert status == {"qwen3": "within tolerance", "qwen35": "regressed"}
    line = next(x for x in startup_lines(rep) if x.startswith("qwen35 server ready"))
    assert reg.change is not None
    assert line.endswith(" vs previous: regressed") and "] vs previous" in line and f"{reg.change * 100:+.0f} %" in line
    assert line in to_markdown(rep)
