"""Pure planners and parsers of the steps, the state machine and the run store."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent import steps
from agent.errors import BadInput
from agent.state import IllegalTransition, RunMachine, allowed
from agent.store import RunStore, check_run_id
from contract.records import SPEC_ARGS, ResultRow, RunProgress, RunRequest, RunState


def test_model_folders_overrides_and_shared_models(tmp_path):
    folders = steps.model_folders(["qwen35", "qwen35_mtp", "qwen3"], tmp_path, {"qwen3": "/data/q3"})
    assert folders == [str(tmp_path / "Qwen3.5-35B-A3B-GPTQ-Int4"), "/data/q3"]
    with pytest.raises(BadInput, match="unknown model key 'gpt'"):
        steps.model_folder("gpt", tmp_path, {})


def test_configure_workflow_keeps_other_keys_and_reports_bad_json():
    text = '{"model_paths": ["/old"], "precompile": {"jobs": 4}}'
    out = json.loads(steps.configure_workflow(text, ["/m/a b", "/m/c"]))
    assert out == {"model_paths": ["/m/a b", "/m/c"], "precompile": {"jobs": 4}}
    with pytest.raises(BadInput, match=r"cfg.json:2: not valid JSON"):
        steps.configure_workflow('{\n"model_paths": [,]}', [], source="cfg.json")
    with pytest.raises(BadInput, match="JSON object"):
        steps.configure_workflow("[1]", [])


def test_precompile_marker_depends_on_release_and_model_set_not_order():
    a = steps.precompile_marker("AB" * 32, ["/m/x", "/m/y"])
    assert a == steps.precompile_marker("ab" * 32, ["/m/y", "/m/x", "/m/x"])
    assert a.startswith("abababababababab-") and a.endswith(".done")
    assert a != steps.precompile_marker("ab" * 32, ["/m/x"])
    assert a != steps.precompile_marker("cd" * 32, ["/m/x", "/m/y"])


def test_environment_plan_never_interpolates_and_capture_parses():
    top = Path("/rel/x; rm -rf ~")
    plan = steps.plan_environment(top, {}, 5)
    assert plan.argv[:2] == ("bash", "-c") and "rm -rf" not in plan.argv[2]
    assert plan.argv[-1] == "/rel/x; rm -rf ~/scripts/ci/musa/setup_env.sh"  # "$1" of the snippet
    before = {"A": "1", "SHLVL": "1", "_": "/usr/bin/python", "KEEP": "same", "RAW": "\udcff"}
    after = b"A=2\0SHLVL=2\0_=/usr/bin/env\0PWD=/b\0KEEP=same\0RAW=\xff\0NEW=x=y\nz\0"
    got = steps.parse_env_capture(steps.ENV_SEPARATOR + after, before)
    assert got == {"A": "2", "NEW": "x=y\nz"}
    with pytest.raises(BadInput, match="no separator"):
        steps.parse_env_capture(after, before)


def test_key_env_and_plans():
    env = steps.key_env("qwen35_fq_mtp", {"X": "1"}, {"X": "2", "SGLANG_USE_TL_MOE_GROUPED_GEMM": "1"})
    assert env == {"SGLANG_USE_TL_MOE_GROUPED_GEMM": "1", "QWEN35_FQ_EXTRA_SERVER_ARGS": SPEC_ARGS, "X": "2"}
    top = Path("/r")
    server = steps.plan_server(top, "qwen35_mtp", {"A": "1"}, steps.key_env("qwen35_mtp"))
    assert server.argv == ("bash", "/r/scripts/ci/musa/start_qwen35_server.sh")
    assert server.env["SGLANG_USE_TL_MOE_GROUPED_GEMM"] == "0" and server.env["A"] == "1"
    bench = steps.plan_benchmark(top, "qwen3vl", {"A": "1"}, {}, 9)
    assert bench.env["MODEL_KEY"] == "qwen3vl" and bench.timeout == 9
    assert bench.argv == ("bash", "/r/scripts/ci/musa/run_tilelang_benchmark.sh")
    env2 = steps.script_env({"PATH": "/bin"}, {"T": "1"}, host="127.0.0.1", port=31000, cache_dir=Path("/c"))
    assert env2 == {"PATH": "/bin", "T": "1", "SERVER_HOST": "127.0.0.1", "SERVER_PORT": "31000",
                    "TILELANG_CACHE_DIR": "/c"}
    assert steps.health_url("::1", 8) == "http://[::1]:8/health"


def test_state_machine():
    m = RunMachine()
    for s in (RunState.FETCHING, RunState.UNPACKING, RunState.CONFIGURING):
        m.transition(s)
    with pytest.raises(IllegalTransition, match="configuring -> benchmarking"):
        m.transition(RunState.BENCHMARKING)
    m.transition(RunState.CANCELLED)
    assert not allowed(RunState.CANCELLED, RunState.FAILED)
    assert allowed(RunState.PUBLISHING, RunState.DONE) and not allowed(RunState.DONE, RunState.FAILED)


def _row(key: str, profile: str, ttft: float = 1.0) -> ResultRow:
    return ResultRow(run_id="r", module="m", model_key=key, table="sweep", profile=profile, model="M", ttft_ms=ttft)


def test_store_rows_replace_per_key_and_survive_a_torn_line(tmp_path):
    store = RunStore(tmp_path)
    store.put_rows("r", "a", [_row("a", "1:1"), _row("a", "2:2")])
    store.put_rows("r", "b", [_row("b", "1:1")])
    store.put_rows("r", "a", [_row("a", "1:1", 5.0)])  # a retried key replaces its earlier rows
    path = tmp_path / "runs" / "r" / "results.jsonl"
    assert len(path.read_text().splitlines()) == 2
    with open(path, "a") as f:
        f.write('{"schema_version": 1, "run_id": "r", "mod')  # a crash mid-append
    rows = store.rows("r")
    assert [(r.model_key, r.profile, r.ttft_ms) for r in rows] == [("b", "1:1", 1.0), ("a", "1:1", 5.0)]


def test_store_progress_events_state_and_logs(tmp_path):
    store = RunStore(tmp_path)
    assert store.runs() == [] and store.progress("x") is None and store.current_run() is None
    store.write_request(RunRequest(run_id="x", module="m", tarball="/t", sha256="a" * 64, models=("qwen3",),
                                   model_root="/m"))
    store.write_progress(RunProgress(run_id="x", module="m", state=RunState.BENCHMARKING))
    store.add_event("x", step="fetch", status="ok", duration_s=1.23456, exit_code=None)
    store.set_state(current_run="x", last_run=None)
    assert store.runs() == ["x"] and store.current_run() == "x"
    progress, request = store.progress("x"), store.request("x")
    assert progress is not None and progress.state == RunState.BENCHMARKING
    assert request is not None and request.models == ("qwen3",)
    ev = store.events("x")[0]
    assert set(ev) == {"ts", "step", "model_key", "status", "duration_s", "exit_code", "message"}
    assert ev["duration_s"] == 1.235
    assert store.next_log("x", "fetch").name == "01-fetch.log"
    store.next_log("x", "fetch").write_text("")
    assert store.next_log("x", "server", "qwen3").name == "02-server-qwen3.log"
    assert not list((tmp_path / "runs" / "x").glob(".*tmp"))  # atomic writes leave no temporaries


@pytest.mark.parametrize("bad", ["", "../x", "a/b", ".hidden", "x" * 200, "a b"])
def test_run_ids_are_checked(bad):
    with pytest.raises(BadInput, match="run id"):
        check_run_id(bad)


def test_prune_releases_keeps_current_and_newest_used(tmp_path):
    import os

    store = RunStore(tmp_path)
    names = [f"{i:016x}" for i in range(5)]
    for i, n in enumerate(names):
        store.release_dir(n).mkdir(parents=True)
        store.tilelang_cache(n).mkdir(parents=True)
        store.precompile_marker(f"{n}-{'ab' * 8}.done").parent.mkdir(parents=True, exist_ok=True)
        store.precompile_marker(f"{n}-{'ab' * 8}.done").write_text("")
        store.release_verified(n).parent.mkdir(parents=True, exist_ok=True)
        store.release_verified(n).write_text("ab" * 32 + "\n")
        os.utime(store.release_dir(n), (1000.0 + i, 1000.0 + i))  # names[4] used last
    staging = store.workdir / "releases" / ".staging-x-1"
    staging.mkdir()
    gone = store.prune_releases(keep=3, current=names[0])  # the oldest is this run's: kept
    assert sorted(gone) == [names[1], names[2]]
    assert sorted(p.name for p in (store.workdir / "releases").iterdir()) == [".staging-x-1", names[0], names[3],
                                                                             names[4]]
    assert not store.tilelang_cache(names[1]).exists() and store.tilelang_cache(names[0]).exists()
    assert not store.release_verified(names[2]).exists() and store.release_verified(names[3]).exists()
    assert sorted(p.name for p in store.precompile_marker("x").parent.iterdir()) == [
        f"{n}-{'ab' * 8}.done" for n in (names[0], names[3], names[4])]
    assert store.prune_releases(keep=3, current=names[0]) == []  # current now the newest used
