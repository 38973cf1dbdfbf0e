"""End to end: ``fleet-agent run`` on a simulated release that compiles lazily for one key (fault ``lazy-jit``): that
key's rows are flagged with the kernels compiled during its benchmark, the precompiled key's are not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import simulator
from agent.store import RunStore
from controller.history import History
from controller.report import build_report
from simulator.ports import free_port
from simulator.runtime.core import LAZY_JIT_MS
from tests.support.procs import processes_under

pytestmark = pytest.mark.slow


def test_the_lazily_compiling_key_is_flagged_and_the_precompiled_one_is_not(tmp_path: Path) -> None:
    built = simulator.build_release(tmp_path / "dist", noise=0.0, time_scale=50.0, faults="lazy-jit:qwen35")
    simulator.make_models(tmp_path / "models")
    # one profile per table, one request per TTFT figure: the compile lands in the figure, as in a release's
    # benchmark that averages every request
    env = {**os.environ, "BENCH_PROFILE_SET": "scale", "BENCH_REPEATS": "1", "BENCH_OUTPUT_LEN": "8"}
    cmd = [sys.executable, "-m", "agent.cli", "run", str(built.path), "--models", "qwen3,qwen35", "--model-root",
           str(tmp_path / "models"), "--workdir", str(tmp_path / "work"), "--run-id", "jit", "--module", "sim-1",
           "--server-port", str(free_port()), "--format", "json"]
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[2], env=env)
    finally:
        strays = processes_under(tmp_path)
        for p in strays:
            p.kill()
    assert res.returncode == 0, res.stderr[-3000:]
    assert not strays
    out = json.loads(res.stdout)
    rows = {(r["model_key"], r["source"]): r for r in out["rows"]}
    lazy, warm = rows[("qwen35", "release")], rows[("qwen3", "release")]
    kernel = "Qwen3.5-35B-A3B-GPTQ-Int4/jit/prefill_n128.cubin.json"  # the model's folder in the cache, its bucket
    assert (lazy["jit_kernels"], lazy["jit_kernel_names"]) == (1, kernel)
    assert lazy["jit_first_s"] is not None and 0.0 <= lazy["jit_first_s"] < 30.0
    assert (warm["jit_kernels"], warm["jit_kernel_names"], warm["jit_first_s"]) == (0, "", None)
    assert rows[("qwen35", "probe")]["jit_kernels"] == 0  # measured after the benchmark: compiled by then
    assert lazy["ttft_ms"] > LAZY_JIT_MS > 4 * warm["ttft_ms"], (lazy["ttft_ms"], warm["ttft_ms"])  # compile in it
    store = RunStore(tmp_path / "work")
    said = [e["message"] for e in store.events("jit") if e["step"] == "benchmark" and e["status"] == "ok"]
    assert said == ["1 rows", f"1 rows; 1 kernel(s) compiled while measuring, the first {lazy['jit_first_s']:.1f} s "
                    f"into the step: {kernel}; the figures include compile time"]
    # stored in the controller's history, the report names the key (and only it)
    h = History(tmp_path / "history.sqlite")
    try:
        h.create_run("jit", release=built.version, models=["qwen3", "qwen35"], modules=["sim-1"])
        h.upsert_rows(store.rows("jit"))
        h.set_run_state("jit", "done")
        rep = build_report(h, "jit", previous=False)
    finally:
        h.close()
    assert [(j.model_key, j.kernels, j.modules) for j in rep.jit_compiled] == [("qwen35", 1, ("sim-1",))]
    assert rep.notes[0] == "kernels compiled while measuring: qwen35 — 1 (sim-1), the figures include compile time"
