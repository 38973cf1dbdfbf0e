"""The agent's collector over a workdir written in the pipeline's layout (fast tier)."""

from __future__ import annotations

import gzip
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from agent.metrics import (
    CATALOG,
    AgentCollector,
    GpuFiles,
    LineTail,
    Pusher,
    SystemProbe,
    SystemSample,
    build_registry,
    label_value,
    push_once,
    start_exporter,
)
from contract.records import SCHEMA_VERSION, KeyOutcome, RunState
from contract.redact import redact_url
from tests.metrics.fleetfiles import RunWriter, finished_run, heartbeat, seed_rows


def fixed_system() -> SystemSample:
    return SystemSample(load=(0.5, 0.25, 0.1), mem_total=8 << 30, mem_available=6 << 30, disk_free=100, disk_total=1000)


def registry(workdir: Path, **kw: Any) -> CollectorRegistry:
    return build_registry(workdir, "m-a", system=fixed_system, process=False, **kw)


def test_latest_results_in_base_units(tmp_path: Path, seed_text: str) -> None:
    finished_run(tmp_path, seed_text, "r1", "m-a")
    reg = registry(tmp_path)
    lbl = {"release": "1.4.1", "model_key": "qwen3", "profile": "128:128"}
    row = seed_rows(seed_text, "r1", "m-a", "1.4.1", keys=["qwen3"])["qwen3"][0]
    assert row.ttft_ms is not None and row.tpot_ms is not None
    assert reg.get_sample_value("m1000_result_ttft_seconds", lbl) == pytest.approx(row.ttft_ms / 1000)
    assert reg.get_sample_value("m1000_result_tpot_seconds", lbl) == pytest.approx(row.tpot_ms / 1000)
    assert reg.get_sample_value("m1000_result_decode_tokens_per_second", lbl) == pytest.approx(row.decode_tps)
    assert reg.get_sample_value("m1000_result_prefill_tokens_per_second", lbl) == pytest.approx(row.prefill_tps)
    mtp = seed_rows(seed_text, "r1", "m-a", "1.4.1", keys=["qwen35_mtp"])["qwen35_mtp"]
    acc = sum(bool(r.correct) for r in mtp) / len(mtp)
    got = reg.get_sample_value("m1000_result_gsm8k_accuracy_ratio", {"release": "1.4.1", "model_key": "qwen35_mtp"})
    assert got == pytest.approx(acc)
    first = mtp[0]
    assert reg.get_sample_value("m1000_result_mtp_accept_ratio", {
        "release": "1.4.1", "model_key": "qwen35_mtp", "profile": first.profile}) == pytest.approx(first.accept_rate)
    vis = reg.get_sample_value("m1000_result_vision_frames_per_second",
                               {"release": "1.4.1", "model_key": "qwen3vl", "profile": "vision:250:250"})
    assert vis is not None and vis > 0


def test_energy_figures_of_the_latest_results(tmp_path: Path, seed_text: str) -> None:
    w = RunWriter(tmp_path, "r1", "m-a")
    rows = seed_rows(seed_text, "r1", "m-a", "1.4.1", keys=["qwen3"])["qwen3"]
    energy = {"j_per_token": 2.5, "tokens_per_j": 0.4, "avg_power_w": 51.5, "idle_power_w": 21.0}
    w.rows([r.model_copy(update=energy) for r in rows])
    w.progress(state=RunState.DONE, step="publish", keys_total=1, keys_done=1, progress=1.0,
               outcomes=(KeyOutcome(model_key="qwen3", status="passed", rows=len(rows)),))
    w.state(None, "r1")
    reg = registry(tmp_path)
    lbl = {"release": "1.4.1", "model_key": "qwen3", "profile": rows[-1].profile}
    assert reg.get_sample_value("m1000_result_energy_per_token_joules", lbl) == 2.5
    assert reg.get_sample_value("m1000_result_output_tokens_per_joule", lbl) == 0.4
    assert reg.get_sample_value("m1000_result_average_power_watts", lbl) == 51.5
    assert reg.get_sample_value("m1000_result_idle_power_watts", lbl) == 21.0


def test_start_up_costs_of_the_latest_results(tmp_path: Path, seed_text: str) -> None:
    w = RunWriter(tmp_path, "r1", "m-a")
    q3 = seed_rows(seed_text, "r1", "m-a", "1.4.1", keys=["qwen3"])["qwen3"]
    q35 = seed_rows(seed_text, "r1", "m-a", "1.4.1", keys=["qwen35"])["qwen35"]
    pre = {"precompile_source": "compiled", "precompile_s": 71.5}
    w.rows([r.model_copy(update={"server_ready_s": 212.0, "warmup_s": 3.25, **pre}) for r in q3]
           + [r.model_copy(update={"server_ready_s": 190.5, "warmup_s": None, **pre}) for r in q35])
    w.progress(state=RunState.DONE, step="publish", keys_total=2, keys_done=2, progress=1.0,
               outcomes=(KeyOutcome(model_key="qwen3", status="passed", rows=len(q3)),
                         KeyOutcome(model_key="qwen35", status="passed", rows=len(q35))))
    w.state(None, "r1")
    reg = registry(tmp_path)
    k3, k35 = {"release": "1.4.1", "model_key": "qwen3"}, {"release": "1.4.1", "model_key": "qwen35"}
    assert reg.get_sample_value("m1000_result_server_ready_seconds", k3) == 212.0
    assert reg.get_sample_value("m1000_result_server_ready_seconds", k35) == 190.5
    assert reg.get_sample_value("m1000_result_first_request_seconds", k3) == 3.25
    assert reg.get_sample_value("m1000_result_first_request_seconds", k35) is None  # not answered: absent
    assert reg.get_sample_value("m1000_result_precompile_seconds", {"release": "1.4.1"}) == 71.5
    assert reg.get_sample_value("m1000_result_precompile_fetch_seconds", {"release": "1.4.1"}) is None


def test_newer_run_wins_and_old_releases_drop_out(tmp_path: Path, seed_text: str) -> None:
    import os
    import time

    old = finished_run(tmp_path, seed_text, "r1", "m-a", release="1.4.0")
    os.utime(old.folder, (time.time() - 100, time.time() - 100))
    w = finished_run(tmp_path, seed_text, "r2", "m-a", release="1.4.1", scale=0.5)
    w.progress(state=RunState.DONE, started_at=time.time() + 5)
    finished_run(tmp_path, seed_text, "r3", "m-a", release="1.4.1", scale=1.0).progress(
        state=RunState.DONE, started_at=time.time() - 50)
    reg = registry(tmp_path, keep_releases=1)
    row = seed_rows(seed_text, "x", "m-a", "1.4.1", keys=["qwen3"], scale=0.5)["qwen3"][0]
    lbl = {"release": "1.4.1", "model_key": "qwen3", "profile": "128:128"}
    assert reg.get_sample_value("m1000_result_decode_tokens_per_second", lbl) == pytest.approx(row.decode_tps)
    assert reg.get_sample_value("m1000_result_decode_tokens_per_second", {**lbl, "release": "1.4.0"}) is None


def test_live_run_progress_steps_and_failures(tmp_path: Path, seed_text: str) -> None:
    w = RunWriter(tmp_path, "run-live", "m-a", "1.4.2")
    w.state("run-live", None)
    reg = registry(tmp_path)
    assert reg.get_sample_value("m1000_run_active") is None  # no progress yet: absent, not zero
    w.progress(state=RunState.PRECOMPILING, step="precompile", keys_total=3, progress=0.2)
    w.event("precompile", "start")
    assert reg.get_sample_value("m1000_run_state", {"state": "precompiling"}) == 1
    assert reg.get_sample_value("m1000_run_state", {"state": "done"}) == 0
    assert reg.get_sample_value("m1000_run_active") == 1
    assert reg.get_sample_value("m1000_run_progress_ratio") == pytest.approx(0.2)
    assert reg.get_sample_value("m1000_run_step_info",
                                {"release": "1.4.2", "step": "precompile", "model_key": "none"}) == 1
    w.event("precompile", "ok", 42.0)
    w.event("benchmark", "failed", 3.0, model_key="qwen3", exit_code=2, message="boom with spaces /and/paths")
    w.rows(seed_rows(seed_text, "run-live", "m-a", "1.4.2", keys=["qwen3"])["qwen3"])
    w.progress(state=RunState.BENCHMARKING, step="benchmark", model_key="qwen35", keys_total=3, keys_done=1,
               progress=0.5, outcomes=(KeyOutcome(model_key="qwen3", status="failed"),))
    assert reg.get_sample_value("m1000_step_duration_seconds_count", {"step": "precompile"}) == 1
    assert reg.get_sample_value("m1000_step_duration_seconds_bucket", {"step": "precompile", "le": "60.0"}) == 1
    assert reg.get_sample_value("m1000_step_duration_seconds_bucket", {"step": "precompile", "le": "30.0"}) == 0
    assert reg.get_sample_value("m1000_step_failures_total", {"step": "benchmark"}) == 1
    assert reg.get_sample_value("m1000_run_model_key_outcomes", {"status": "failed"}) == 1
    assert reg.get_sample_value("m1000_run_rows") == 11
    assert reg.get_sample_value("m1000_result_rows", {"release": "1.4.2", "model_key": "qwen3"}) == 11


def test_torn_and_bad_lines_are_counted_not_taken(tmp_path: Path, seed_text: str) -> None:
    w = RunWriter(tmp_path, "r1", "m-a")
    w.progress(state=RunState.BENCHMARKING)
    rows = seed_rows(seed_text, "r1", "m-a", "1.4.1", keys=["qwen3"])["qwen3"]
    w.rows(rows[:2])
    with (w.folder / "results.jsonl").open("a") as fh:
        fh.write('{"not": "a row"}\n')
        fh.write(rows[2].model_dump_json()[:40])  # half-written: no newline yet
    reg = registry(tmp_path)
    assert reg.get_sample_value("m1000_result_rows", {"release": "1.4.1", "model_key": "qwen3"}) == 2
    assert reg.get_sample_value("m1000_exporter_read_errors_total", {"file": "results"}) == 1
    with (w.folder / "results.jsonl").open("a") as fh:
        fh.write(rows[2].model_dump_json()[40:] + "\n")
    assert reg.get_sample_value("m1000_result_rows", {"release": "1.4.1", "model_key": "qwen3"}) == 3


def test_replaced_results_file_is_read_again(tmp_path: Path, seed_text: str) -> None:
    """put_rows of a retried key rewrites results.jsonl atomically: the reader starts over."""
    w = RunWriter(tmp_path, "r1", "m-a")
    w.progress(state=RunState.BENCHMARKING)
    rows = seed_rows(seed_text, "r1", "m-a", "1.4.1", keys=["qwen3"])["qwen3"]
    w.rows(rows)
    reg = registry(tmp_path)
    assert reg.get_sample_value("m1000_result_rows", {"release": "1.4.1", "model_key": "qwen3"}) == 11
    tmp = w.folder / "tmp.jsonl"
    tmp.write_text("".join(r.model_dump_json() + "\n" for r in rows[:4]))
    tmp.replace(w.folder / "results.jsonl")
    assert reg.get_sample_value("m1000_result_rows", {"release": "1.4.1", "model_key": "qwen3"}) == 4


def test_labels_are_bounded(tmp_path: Path, seed_text: str) -> None:
    w = RunWriter(tmp_path, "r-with-id-123", "m-a", release="weird release/../x")
    w.progress(state=RunState.BENCHMARKING, step="Some free text step!", model_key="qwen3")
    w.event("Some free text step!", "failed", 1.0)
    w.rows(seed_rows(seed_text, "r-with-id-123", "m-a", "weird release/../x", keys=["qwen3"])["qwen3"])
    reg = registry(tmp_path)
    values = {v for m in reg.collect() for s in m.samples for k, v in s.labels.items()}
    assert "r-with-id-123" not in values
    assert not any("/" in v or " " in v for v in values)
    assert reg.get_sample_value("m1000_step_failures_total", {"step": "other"}) == 1
    assert label_value("1.4.1") == "1.4.1" and label_value("a b") == "unknown"


def test_heartbeat_and_agent_info(tmp_path: Path) -> None:
    reg = registry(tmp_path, version="9.9.9")
    assert reg.get_sample_value("m1000_agent_up") == 1
    assert reg.get_sample_value("m1000_agent_last_heartbeat_timestamp_seconds") is None
    heartbeat(tmp_path, "m-a", ts=1234.5, healthy=False)
    assert reg.get_sample_value("m1000_agent_last_heartbeat_timestamp_seconds") == 1234.5
    # the age is the module's clock minus the module's clock: a clock hours off shows the same age
    heartbeat(tmp_path, "m-a", ts=time.time() - 42.0, healthy=False)
    assert 41.0 <= (reg.get_sample_value("m1000_agent_heartbeat_age_seconds") or 0) < 60.0
    assert reg.get_sample_value("m1000_agent_healthy") == 0
    infos = [s for m in reg.collect() for s in m.samples if s.name == "m1000_agent_info"]
    assert infos and infos[0].labels["version"] == "9.9.9"
    assert infos[0].labels["contract"] == str(SCHEMA_VERSION)  # Prometheus finds the modules behind (ADR 0051)


def test_module_probe_reads_sysfs_and_leaves_missing_gpu_absent(tmp_path: Path) -> None:
    sysfs = tmp_path / "sys"
    dev = sysfs / "class/drm/card0/device"
    (dev / "hwmon/hwmon3").mkdir(parents=True)
    (dev / "gpu_busy_percent").write_text("37\n")
    (dev / "hwmon/hwmon3/temp1_input").write_text("54000\n")
    (sysfs / "class/drm/card0-HDMI-A-1").mkdir(parents=True)
    zone = sysfs / "class/thermal/thermal_zone2"
    zone.mkdir(parents=True)
    (zone / "type").write_text("gpu-thermal\n")
    (zone / "temp").write_text("61500\n")
    probe = SystemProbe(tmp_path, sys_root=sysfs)
    s = probe()
    assert s.gpu_util == {"card0": pytest.approx(0.37)}
    assert s.gpu_temp == {"card0": pytest.approx(54.0), "gpu-thermal": pytest.approx(61.5)}
    assert s.mem_total and s.mem_available and s.disk_free is not None
    reg = build_registry(tmp_path, "m-a", system=probe, process=False)
    assert reg.get_sample_value("m1000_module_gpu_utilization_ratio", {"gpu": "card0"}) == pytest.approx(0.37)
    bare = build_registry(tmp_path, "m-a", system=SystemProbe(tmp_path, sys_root=tmp_path / "none"),
                          process=False)
    names = {s.name for m in bare.collect() for s in m.samples}
    assert "m1000_module_gpu_utilization_ratio" not in names  # absent, not zero
    assert "m1000_module_memory_available_bytes" in names
    assert GpuFiles.discover(tmp_path / "none") == GpuFiles()


def test_every_served_series_is_in_the_catalog(tmp_path: Path, seed_text: str) -> None:
    finished_run(tmp_path, seed_text, "r1", "m-a")
    heartbeat(tmp_path, "m-a")
    reg = build_registry(tmp_path, "m-a", system=lambda: SystemSample((1.0, 1.0, 1.0), 1, 1, 1, 1, {"c": 0.1},
                                                                        {"c": 40.0}), process=False)
    specs = {s.name: s for s in CATALOG}
    served: set[str] = set()
    for fam in reg.collect():
        name = fam.name + ("_total" if fam.type == "counter" else "") + ("_info" if fam.type == "info" else "")
        assert name in specs, name
        assert specs[name].type == fam.type
        served.add(name)
        for s in fam.samples:
            extra = {"le"} if fam.type == "histogram" else set()
            assert set(s.labels) - extra == set(specs[name].labels) or fam.type == "info"
    assert served == set(specs)


def test_exporter_serves_text_openmetrics_and_gzip(tmp_path: Path, seed_text: str) -> None:
    finished_run(tmp_path, seed_text, "r1", "m-a")
    reg = build_registry(tmp_path, "m-a", system=fixed_system)
    server, thread = start_exporter(tmp_path, "m-a", port=0, registry=reg)
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        plain = urllib.request.urlopen(url, timeout=5).read().decode()
        fams = {f.name: f for f in text_string_to_metric_families(plain)}
        assert "m1000_result_ttft_seconds" in fams and "process_cpu_seconds" in fams
        req = urllib.request.Request(url, headers={
            "Accept": "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4",
            "Accept-Encoding": "gzip"})
        resp = urllib.request.urlopen(req, timeout=5)
        assert resp.headers["Content-Encoding"] == "gzip"
        body = gzip.decompress(resp.read()).decode()
        assert body.endswith("# EOF\n") and body.count("# EOF") == 1
        assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/nope", timeout=5)
    finally:
        server.shutdown()
        server.server_close()
    thread.join(timeout=5)
    assert not thread.is_alive()


def test_push_never_raises_and_hides_credentials(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import socket
    import time

    reg = registry(tmp_path)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t = time.monotonic()
    assert push_once(reg, f"http://user:s3cret@127.0.0.1:{port}", "m-a", timeout=0.5) is False
    assert time.monotonic() - t < 3
    assert "s3cret" not in caplog.text and "***@127.0.0.1" in caplog.text
    assert redact_url("http://a:b@h:1/p") == "http://***@h:1/p"
    p = Pusher(reg, f"http://127.0.0.1:{port}", "m-a", interval=0.05, timeout=0.2).start()
    time.sleep(0.2)
    p.stop()
    assert p.failures >= 2 and p.pushes == 0


def test_line_tail_waits_for_whole_lines(tmp_path: Path) -> None:
    f = tmp_path / "x.jsonl"
    t = LineTail(f)
    assert t.read() == (False, [])
    f.write_text('{"a": 1}\n{"b"')
    assert t.read() == (False, ['{"a": 1}'])
    with f.open("a") as fh:
        fh.write(": 2}\n")
    assert t.read() == (False, ['{"b": 2}'])
    f.write_text('{"c": 3}\n')  # truncated and rewritten
    restarted, lines = t.read()
    assert restarted and [json.loads(x) for x in lines] == [{"c": 3}]


def test_collector_is_cheap_when_nothing_changed(tmp_path: Path, seed_text: str) -> None:
    finished_run(tmp_path, seed_text, "r1", "m-a")
    col = AgentCollector(tmp_path, "m-a", system=fixed_system, settle_s=0.0)
    v1, static1, _ = col.snapshot()
    v2, static2, _ = col.snapshot()
    assert v1 == v2 and static1 is not static2 and [m.name for m in static1] == [m.name for m in static2]
    finished_run(tmp_path, seed_text, "r2", "m-a", release="1.4.2")
    v3, _, _ = col.snapshot()
    assert v3 > v2


def test_fleet_agent_exporter_command_serves_and_stops_on_sigterm(tmp_path: Path, seed_text: str) -> None:
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time

    finished_run(tmp_path, seed_text, "r1", "m-a")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exe = str(Path(sys.executable).parent / "fleet-agent")
    env = {**os.environ, "FLEET_MODULE": "m-a"}
    p = subprocess.Popen([exe, "exporter", "--workdir", str(tmp_path), "--port", str(port)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        body = ""
        for _ in range(100):
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
                break
            except OSError:
                time.sleep(0.1)
        assert 'm1000_result_ttft_seconds{model_key="qwen3",profile="128:128",release="1.4.1"}' in body
        p.send_signal(signal.SIGTERM)
        assert p.wait(timeout=10) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_kernels_compiled_while_measuring_per_key(tmp_path: Path, seed_text: str) -> None:
    """The latest benchmark of a key that compiled kernels says how many; the precompiled keys say 0."""
    w = RunWriter(tmp_path, "r1", "m-a", "1.4.1")
    per_key = seed_rows(seed_text, "r1", "m-a", "1.4.1", keys=["qwen3", "qwen35"])
    w.rows(per_key["qwen3"])
    w.rows(r.model_copy(update={"jit_kernels": 3, "jit_kernel_names": "a.so; b.so; c.so"}) for r in per_key["qwen35"])
    w.progress(state=RunState.DONE, step="publish")
    reg = registry(tmp_path)
    assert reg.get_sample_value("m1000_result_jit_kernels", {"release": "1.4.1", "model_key": "qwen35"}) == 3
    assert reg.get_sample_value("m1000_result_jit_kernels", {"release": "1.4.1", "model_key": "qwen3"}) == 0
