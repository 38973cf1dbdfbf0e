"""End to end: ``fleet-agent run`` of the real-engine release (transformers serve on this CPU, tiny random models).

One validation of ``qwen3`` (passes: the seed's table, measured over HTTP), ``qwen35_mtp``
(the release refuses speculative decoding and the agent says so) and ``qwen3vl`` (a
Qwen3-VL folder the release does not serve). Then, on the same module (precompile cached),
two real start-up failures: weights that break after precompile (the server dies while
loading: the step failure names the exception) and a server that is not ready within the
ready time-out (the agent kills its whole process group). Real processes throughout.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import simulator
from contract.records import MODEL_KEYS
from simulator.engine.build import build_engine_release
from simulator.engine.release import parse_profiles
from tests.support.engine import fleet_agent_run, outcomes
from tests.support.procs import nothing_left_under, processes_under

pytestmark = pytest.mark.slow
ALL = "qwen3,qwen35_mtp,qwen3vl"  # the same model set every run: precompile runs once on this module


def _agent(engine_py: Path, tarball: Path, models: str, root: Path, work: Path, run_id: str,
           *extra: str) -> tuple[int, dict]:
    env = {"M1000_ENGINE_PYTHON": str(engine_py), "OMP_NUM_THREADS": "1"}
    return fleet_agent_run(env, tarball, models, root, work, run_id, "engine-1", *extra)


@pytest.fixture(scope="module")
def engine(engine_py, engine_models, tmp_path_factory):
    with nothing_left_under(tmp_path_factory.mktemp("engine")) as base:
        built = build_engine_release(base / "dist", profiles=parse_profiles("16;48@16", 8))
        simulator.make_models(engine_models, ["qwen3vl"])  # a Qwen3-VL folder (config only): not served here
        yield built, base, engine_models


@pytest.fixture(scope="module")
def first_run(engine, engine_py):
    built, base, models = engine
    return _agent(engine_py, built.path, ALL, models, base / "work", "engine-all")


def test_real_engine_release_validates_and_refusals_are_reported(first_run, engine):
    code, out = first_run
    built, base, _ = engine
    o = outcomes(out)
    assert code == 1 and out["progress"]["state"] == "done", out["progress"]
    assert o["qwen3"]["status"] == "passed" and o["qwen3"]["rows"] == 2, o["qwen3"]
    rows = sorted(out["rows"], key=lambda r: r["profile"])
    assert [r["profile"] for r in rows] == ["16:16", "16:48"]
    for r in rows:
        assert r["model_key"] == "qwen3" and r["release"] == built.version and not r["flags"], r
        assert r["ttft_ms"] > 0 and r["tpot_ms"] > 0 and r["output_tokens"] == 8 and r["measured_output"] == 8
    mtp = o["qwen35_mtp"]["error"]
    assert (mtp["step"], mtp["exit_code"]) == ("server", 3) and "speculative decoding" in mtp["message"], mtp
    vl = o["qwen3vl"]["error"]
    assert vl["step"] == "server" and "qwen3_vl is not served by this release" in vl["message"], vl
    log = next((base / "work" / "runs" / "engine-all" / "logs").glob("*precompile.log")).read_text()
    assert "Qwen3-30B-A3B-GPTQ-Int4: " in log and "warm-up" in log and "Qwen3-VL-8B: skipped" in log


def test_server_dying_while_loading_is_a_server_failure_naming_the_exception(first_run, engine, engine_py):
    built, base, models = engine
    weights = models / MODEL_KEYS["qwen3"].model_dir / "model.safetensors"
    good = weights.read_bytes()
    try:
        weights.write_bytes(b"\xff" * 64)  # broken after precompile: the release loads it only when serving
        code, out = _agent(engine_py, built.path, ALL, models, base / "work", "engine-broken")
    finally:
        weights.write_bytes(good)
    assert code == 1 and out["progress"]["precompile_cached"] is True
    err = outcomes(out)["qwen3"]["error"]
    assert err["step"] == "server" and err["exit_code"] not in (None, 0), err
    assert err["message"].startswith("server exited before it was ready (exit ") and "Error" in err["message"], err
    assert "SafetensorError" in err["message"] and "SafetensorError" in err["stderr_tail"]


def test_server_never_ready_in_time_is_stopped_with_its_children(first_run, engine, engine_py):
    built, base, models = engine
    code, out = _agent(engine_py, built.path, ALL, models, base / "work", "engine-slow", "--ready-timeout", "2")
    assert code == 1 and out["progress"]["precompile_cached"] is True
    err = outcomes(out)["qwen3"]["error"]
    assert err["step"] == "server" and "not ready after 2 s" in err["message"], err
    assert "still loading" in err["message"] or "port open" in err["message"]
    assert not processes_under(base)  # the engine and everything it started are gone
