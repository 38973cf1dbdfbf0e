"""The pipeline against a hand-made release (real processes, real HTTP, real signals)."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from agent import steps
from agent.executor import EventCancelToken
from agent.pipeline import run_pipeline
from agent.store import RunStore
from agent.tables import parse_seed
from contract.records import RunProgress, RunState, StepError
from tests.support.tmpfs import mounted_tmpfs

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_leftovers")]


def _err(e: StepError | None) -> StepError:
    """The error a failed run or key carries: the test expects one."""
    assert e is not None
    return e


def test_two_keys_pass_with_seed_figures(make_config, make_request, record_dir, seed_text):
    cfg = make_config()
    seen: list[RunProgress] = []
    result = run_pipeline(make_request(("qwen3", "qwen35_mtp")), cfg, on_progress=seen.append)
    assert result.ok, result.progress.error
    assert result.progress.state == RunState.DONE
    seed = parse_seed(seed_text)
    assert len(result.rows) == len(seed["qwen3"]) + len(seed["qwen35_mtp"])
    want = {(r.model_key, r.profile): r for k in ("qwen3", "qwen35_mtp") for r in seed[k]}
    for r in result.rows:
        assert (r.run_id, r.module, r.release) == ("r1", "m-test", "fake-1.4.1")
        assert r.ttft_ms == want[(r.model_key, r.profile)].ttft_ms
    assert seen[-1].state == RunState.DONE and seen[-1].progress == 1.0
    states = [p.state for p in seen]
    assert states.index(RunState.FETCHING) < states.index(RunState.PRECOMPILING) < states.index(RunState.BENCHMARKING)
    # the MTP key's variables reached its server, MODEL_KEY and setup_env's variables the benchmark
    servers = [json.loads(p.read_text()) for p in record_dir.glob("server-*.json")]
    mtp = next(s["env"] for s in servers if s["env"].get("SGLANG_USE_TL_MOE_GROUPED_GEMM") == "0")
    assert "--speculative-num-draft-tokens 4" in mtp["QWEN35_EXTRA_SERVER_ARGS"]
    bench = json.loads((record_dir / "bench-qwen35_mtp.json").read_text())
    assert bench["MODEL_KEY"] == "qwen35_mtp"
    assert bench["TILELANG_EXTRA_FLAGS"] == "--opt 3 --with spaces"
    assert bench["SERVER_PORT"] == str(cfg.server_port)
    assert bench["TILELANG_CACHE_DIR"].endswith("/cache/tilelang/" + make_request().sha256[:16])
    assert "SGLANG_USE_TL_MOE_GROUPED_GEMM" not in json.loads((record_dir / "bench-qwen3.json").read_text())
    # files on the module
    store = RunStore(cfg.workdir)
    assert store.runs() == ["r1"] and store.current_run() is None and store.last_run() == "r1"
    assert len(store.rows("r1")) == len(result.rows)
    top = cfg.workdir / "releases" / make_request().sha256[:16] / "20260803_M1000_1.4.1_sglang"
    config = json.loads((top / "scripts/ci/musa/tilelang_workflow_config.json").read_text())
    assert config["model_paths"] == [make_request().model_root + "/Qwen3-30B-A3B-GPTQ-Int4",
                                     make_request().model_root + "/Qwen3.5-35B-A3B-GPTQ-Int4"]
    assert config["workflow"] == "tilelang"
    logs = sorted(p.name for p in store.logs_dir("r1").glob("*.log"))
    assert logs[:6] == ["01-fetch.log", "02-unpack.log", "03-configure.log", "04-generate.log",
                        "05-environment.log", "06-precompile.log"]
    assert "08-benchmark-qwen3.log" in logs and "10-benchmark-qwen35_mtp.log" in logs
    env_log = (store.logs_dir("r1") / "05-environment.log").read_text()
    assert "FAKE_SECRET_TOKEN" in env_log and "do-not-log-me" not in env_log  # names, never values
    assert not list(store.logs_dir("r1").glob("*.env0"))
    line = (store.logs_dir("r1") / "07-server-qwen3.log").read_text().splitlines()[0]
    assert line[:4].isdigit() and line[23] == "Z"
    events = store.events("r1")
    assert {(e["step"], e["status"]) for e in events} >= {("precompile", "ok"), ("benchmark", "ok")}


def test_second_run_skips_precompile(make_config, make_request, release):
    cfg = make_config(env={"FAKE_PRECOMPILE_SLEEP": "1.5"}, keep_releases=2)
    old = {name: cfg.workdir / "releases" / name for name in ("0ld0ld0ld0ld0ld0", "0ld0ld0ld0ld0ld1")}
    for i, d in enumerate(old.values()):  # two releases unpacked before, the first used longest ago
        d.mkdir(parents=True)
        (cfg.workdir / "cache" / "tilelang" / d.name).mkdir(parents=True)
        os.utime(d, (1000.0 + i, 1000.0 + i))
    first = run_pipeline(make_request(run_id="a"), cfg)
    assert [n for n, d in old.items() if d.exists()] == ["0ld0ld0ld0ld0ld1"]  # keep_releases=2: this one + newest
    assert not (cfg.workdir / "cache" / "tilelang" / "0ld0ld0ld0ld0ld0").exists()
    # verified and unpacked: the tarball is not read again (here it is gone)
    tarball = release.path.read_bytes()
    release.path.write_bytes(b"")
    second = run_pipeline(make_request(run_id="b"), cfg)
    release.path.write_bytes(tarball)
    assert first.ok and second.ok
    assert first.progress.precompile_cached is False and second.progress.precompile_cached is True
    store = RunStore(cfg.workdir)
    count = cfg.workdir / "cache" / "tilelang" / release.sha256[:16] / "precompile.count"
    assert count.read_text().count("run") == 1
    pre = {r: next(e for e in store.events(r) if e["step"] == "precompile" and e["status"] != "start")
           for r in ("a", "b")}
    assert pre["a"]["status"] == "ok" and pre["b"]["status"] == "skipped"
    assert "precompile cached" in pre["b"]["message"]
    assert "skipped" in (store.logs_dir("b") / "06-precompile.log").read_text()
    assert pre["a"]["duration_s"] >= 1.5
    unpack_b = next(e for e in store.events("b") if e["step"] == "unpack" and e["status"] != "start")
    assert unpack_b["status"] == "skipped"
    fetch = {r: next(e for e in store.events(r) if e["step"] == "fetch" and e["status"] != "start") for r in "ab"}
    assert fetch["a"]["status"] == "ok" and fetch["b"]["status"] == "skipped"
    assert "already verified and unpacked" in fetch["b"]["message"]
    # another digest for the same 16 digits is hashed, and refused
    bad = run_pipeline(make_request(run_id="d", sha256=release.sha256[:16] + "0" * 48), cfg)
    refused = _err(bad.progress.error)
    assert refused.step == "fetch" and "sha256 mismatch" in refused.message
    # a different model set is a different precompile
    third = run_pipeline(make_request(("qwen3", "qwen3vl"), run_id="c"), cfg)
    assert third.ok and third.progress.precompile_cached is False


def test_start_up_costs_on_every_release_row_compiled_then_cached(make_config, make_request):
    cfg = make_config(env={"FAKE_PRECOMPILE_SLEEP": "0.4", "FAKE_WARMUP_SLEEP": "0.3"})
    first = run_pipeline(make_request(("qwen3", "qwen35_mtp"), run_id="a"), cfg)
    second = run_pipeline(make_request(("qwen3", "qwen35_mtp"), run_id="b"), cfg)
    assert first.ok and second.ok
    p1, p2 = first.progress, second.progress
    assert (p1.precompile_source, p2.precompile_source, p2.precompile_s) == ("compiled", "cached", None)
    assert p1.precompile_s is not None and 0.4 <= p1.precompile_s < 5.0
    store = RunStore(cfg.workdir)
    for result in (first, second):
        rows = [r for r in result.rows if r.source == "release"]
        assert rows and all(r.server_ready_s is not None and 0.0 < r.server_ready_s < 10.0 for r in rows)
        assert all(r.warmup_s is not None and 0.3 <= r.warmup_s < 5.0 for r in rows)
        # one start per key: every row of a key carries the same figures
        assert len({(r.model_key, r.server_ready_s, r.warmup_s) for r in rows}) == 2
        said = [e["message"] for e in store.events(result.progress.run_id) if e["step"] == "server"
                and e["status"] == "ok"]
        ready = {r.model_key: r for r in rows}
        assert said == [f"ready in {ready[k].server_ready_s:.3f} s, first request {ready[k].warmup_s:.3f} s"
                        for k in ("qwen3", "qwen35_mtp")]
    pre = [{(r.precompile_source, r.precompile_s, r.precompile_fetch_s) for r in x.rows if r.source == "release"}
           for x in (first, second)]
    compiled, cached = pre
    assert compiled == {("compiled", p1.precompile_s, None)}
    assert cached == {("cached", None, None)}  # a skipped precompile is no compile: no figure to judge


def test_each_key_fault_is_its_own_error_and_the_others_run(make_config, make_request):
    faults = {
        "qwen3": {"FAKE_SERVER_MODE": "start-fail"},
        "qwen35": {"FAKE_SERVER_MODE": "never-ready"},
        "qwen35_fq": {"FAKE_SERVER_MODE": "crash", "FAKE_CRASH_AFTER": "1.0", "FAKE_BENCH_MODE": "wait-server-death"},
        "qwen36_fq": {"FAKE_BENCH_MODE": "hang"},
        "qwen3vl": {"FAKE_BENCH_MODE": "bad-table"},
        "qwen35_fq_mtp": {"FAKE_BENCH_MODE": "no-table"},
    }
    cfg = make_config(ready_timeout=2.0, benchmark_timeout=2.0)
    req = make_request(("qwen3", "qwen35", "qwen35_mtp", "qwen35_fq", "qwen36_fq", "qwen3vl", "qwen35_fq_mtp"),
                       key_env=faults)
    result = run_pipeline(req, cfg)
    p = result.progress
    assert p.state == RunState.DONE and not result.ok
    out = {o.model_key: o for o in p.outcomes}
    assert out["qwen35_mtp"].status == "passed" and out["qwen35_mtp"].rows == 15
    for key in faults:
        assert out[key].status == "failed", key
    e = {k: _err(out[k].error) for k in faults}
    assert e["qwen3"].step == "server" and e["qwen3"].exit_code == 5 and "cannot load model" in e["qwen3"].stderr_tail
    assert e["qwen35"].step == "server" and "not ready after 2 s" in e["qwen35"].message
    assert e["qwen35_fq"].step == "benchmark" and "server exited during the benchmark" in e["qwen35_fq"].message
    assert out["qwen35_fq"].rows == 3  # the rows printed before the crash are kept
    assert e["qwen36_fq"].step == "benchmark" and "timed out after 2 s" in e["qwen36_fq"].message
    assert e["qwen3vl"].step == "parse" and ":4: row has" in e["qwen3vl"].message
    assert e["qwen35_fq_mtp"].step == "parse" and "no result table" in e["qwen35_fq_mtp"].message
    assert out["qwen3vl"].rows == 7  # the broken sweep table is refused, the well-formed vision table kept
    rows = RunStore(cfg.workdir).rows("r1")
    assert {r.model_key for r in rows} == {"qwen35_mtp", "qwen35_fq", "qwen3vl"}


def test_rerun_of_same_run_id_resumes_without_duplicates(make_config, make_request):
    cfg = make_config()
    keys = ("qwen3", "qwen35", "qwen3vl")
    first = run_pipeline(make_request(keys, key_env={"qwen35": {"FAKE_BENCH_MODE": "exit1"}}), cfg)
    out = {o.model_key: o.status for o in first.progress.outcomes}
    assert out == {"qwen3": "passed", "qwen35": "failed", "qwen3vl": "passed"}
    failed = _err(first.progress.outcomes[1].error)
    assert failed.one_line() == "benchmark[qwen35] (exit 1): benchmark exited with code 1"
    assert len(first.rows) == 11 + 11 + 18  # the failed key's rows are kept, flagged by its outcome
    second = run_pipeline(make_request(keys), cfg)
    assert second.ok and second.progress.attempt == 2
    assert len(second.rows) == 40
    lines = (cfg.workdir / "runs" / "r1" / "results.jsonl").read_text().splitlines()
    assert len(lines) == 40 and len({(json.loads(x)["model_key"], json.loads(x)["profile"]) for x in lines}) == 40
    skipped = [e for e in RunStore(cfg.workdir).events("r1") if e["status"] == "skipped" and e["step"] == "benchmark"]
    assert {e["model_key"] for e in skipped} == {"qwen3", "qwen3vl"}


def test_missing_folder_and_unknown_key_fail_alone(make_config, make_request, model_root):
    (model_root / "Qwen3-VL-8B").rmdir()
    result = run_pipeline(make_request(("qwen3vl", "nope", "qwen3")), make_config())
    out = {o.model_key: o for o in result.progress.outcomes}
    assert out["qwen3"].status == "passed"
    missing = _err(out["qwen3vl"].error)
    assert missing.step == "configure" and "Qwen3-VL-8B not found" in missing.message
    assert "unknown model key 'nope'" in _err(out["nope"].error).message


def test_release_wide_failures_end_the_run(make_config, make_request):
    bad = run_pipeline(make_request(sha256="0" * 64), make_config())
    refused = _err(bad.progress.error)
    assert bad.progress.state == RunState.FAILED and refused.step == "fetch"
    assert "sha256 mismatch" in refused.message
    assert bad.progress.outcomes[0].status == "skipped"
    cfg = make_config(env={"FAKE_FAIL_GENERATE": "1"})
    gen = run_pipeline(make_request(run_id="g"), cfg)
    err = _err(gen.progress.error)
    assert gen.progress.state == RunState.FAILED and (err.step, err.exit_code) == ("generate", 7)
    assert "boom" in err.stderr_tail


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs."""
    yield from mounted_tmpfs(tmp_path / "disk", "size=1m")


def test_a_full_disk_during_precompile_is_named_in_the_failure_line(make_config, make_request, small_disk):
    """The 1 MiB tmpfs fills for real under the precompile's 4 MiB of kernels: the failure line says why (issue 48
    item 7), not only "exited with code 1"."""
    result = run_pipeline(make_request(), make_config(env={"FAKE_PRECOMPILE_OUT": str(small_disk)}))
    err = _err(result.progress.error)
    assert result.progress.state == RunState.FAILED and err.step == "precompile"
    assert err.message.startswith("precompile exited with code 1: no space left on device: ")
    assert "No space left on device" in err.message and "\n" not in err.message


def test_failure_causes_from_the_exit_status_and_the_last_lines():
    cause = steps.failure_cause
    assert cause("x\nOSError: [Errno 28] No space left on device: '/w/k.so'\n", 1) == \
        "no space left on device: OSError: [Errno 28] No space left on device: '/w/k.so'"
    assert cause("loading\ntorch.OutOfMemoryError: CUDA out of memory.\nexiting\n", 1).startswith("out of memory: ")
    assert cause("Out of memory\n", -9) == "killed by SIGKILL (out of memory)"
    assert cause("", -11) == "killed by SIGSEGV"
    assert cause("Killed\n", 137) == "a process it ran was killed by SIGKILL"
    assert cause("x\nValueError: bad header\n", 1) == "ValueError: bad header"  # else the line that says why
    assert cause("", 1) == ""


def test_precompile_timeout_kills_it_and_leaves_no_marker(make_config, make_request):
    cfg = make_config(env={"FAKE_PRECOMPILE_SLEEP": "60"}, precompile_timeout=1.0)
    t0 = time.monotonic()
    result = run_pipeline(make_request(), cfg)
    assert time.monotonic() - t0 < 20
    err = _err(result.progress.error)
    assert err.step == "precompile" and "timed out after 1 s" in err.message
    assert not list((cfg.workdir / "cache" / "precompile").glob("*.done"))


def test_cancel_within_a_benchmark_kills_everything(make_config, make_request):
    token = EventCancelToken()
    cfg = make_config()
    faults = {"qwen3": {"FAKE_BENCH_MODE": "hang", "FAKE_SERVER_MODE": "escape"}}
    req = make_request(("qwen3", "qwen35"), key_env=faults)
    timer = threading.Timer(2.5, token.cancel)
    timer.start()
    t0 = time.monotonic()
    try:
        result = run_pipeline(req, cfg, cancel=token)
    finally:
        timer.cancel()
    assert time.monotonic() - t0 < 15
    p = result.progress
    assert p.state == RunState.CANCELLED
    assert [o.status for o in p.outcomes] == ["cancelled", "cancelled"]
    assert RunStore(cfg.workdir).events("r1")[-1]["status"] == "cancelled"


def test_cancel_before_start_and_a_broken_listener(make_config, make_request):
    token = EventCancelToken()
    token.cancel()

    def boom(_):
        raise RuntimeError("listener bug")

    result = run_pipeline(make_request(), make_config(), cancel=token, on_progress=boom)
    assert result.progress.state == RunState.CANCELLED and _err(result.progress.error).step == "fetch"


def test_server_ignoring_sigterm_is_killed(make_config, make_request):
    cfg = make_config(stop_grace=1.0)
    result = run_pipeline(make_request(key_env={"qwen3": {"FAKE_SERVER_MODE": "ignore-term"}}), cfg)
    assert result.ok
    assert "SIGKILL" in next(cfg.workdir.glob("runs/r1/logs/*-server-qwen3.log")).read_text()
