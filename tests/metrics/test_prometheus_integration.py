"""A real Prometheus scrapes a simulated fleet during a run; every dashboard and alert expression is evaluated.

Modules:
  sim-a, sim-b  ``fleet-agent run`` on a simulated release (real processes), exporter per workdir
  fix-c         files written by the test: a failed run, stale heartbeat, GPU via sysfs stand-in, low disk
  fix-d         files written by the test: a run that stopped updating two hours ago (stuck)
  dead-e        in the targets file, nothing listens (agent down)
plus the controller's collector on a history holding the seed as baseline and a slow module.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from agent.metrics import CATALOG as AGENT_CATALOG
from agent.metrics import SystemSample, build_registry, push_once, start_exporter
from agent.tables import parse_seed
from contract.records import KeyOutcome, RunProgress, RunState
from controller.cli.targets import file_sd
from controller.fleet.power import MODULE_CYCLED
from controller.history import History
from controller.inventory import parse_inventory
from controller.serve.metrics import CATALOG as CONTROLLER_CATALOG
from controller.serve.metrics import ControllerCollector, ModuleReading
from simulator.ports import free_port
from tests.metrics.dashboards import RULES, dashboard_annotations, dashboard_queries, rule_exprs, substitute
from tests.metrics.fleetfiles import RunWriter, finished_run, heartbeat, seed_rows
from tests.support.wait import wait_for

PROMETHEUS = shutil.which("prometheus")
PUSHGATEWAY = shutil.which("prometheus-pushgateway")
ROOT = Path(__file__).resolve().parents[2]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.prometheus,
    pytest.mark.skipif(PROMETHEUS is None, reason="needs prometheus (Debian package prometheus)"),
    pytest.mark.timeout(240),
]

# expression -> why it may return nothing here. Everything else must return data.
EXPECTED_EMPTY: dict[str, str] = {
    'sum by (model_key, metric) (m1000_trend_change_points{scope="fleet"}) > 0':
        "the fleet's change-points annotation: this history has one release, so no change point is in force "
        "(m1000_trend_change_points itself is scraped: 0 per series; tests/metrics/test_controller_metrics.py "
        "shows one in force)",
}


def get(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def query(base: str, expr: str) -> list[dict[str, Any]]:
    data = get(f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr}))
    assert data["status"] == "success", (expr, data)
    return list(data["data"]["result"])


class Procs:
    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, args: list[str], log: Path, **kw: Any) -> subprocess.Popen[bytes]:
        fh = log.open("wb")
        p = subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, **kw)
        fh.close()
        self.procs.append(p)
        return p

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=5)


@pytest.fixture
def procs() -> Iterator[Procs]:
    pr = Procs()
    try:
        yield pr
    finally:
        pr.stop()


@pytest.fixture
def servers() -> Iterator[list[Any]]:
    started: list[Any] = []
    try:
        yield started
    finally:
        for server, thread in started:
            server.shutdown()
            server.server_close()
            thread.join(timeout=5)


def sim_release(tmp: Path) -> tuple[Path, Path]:
    sim = pytest.importorskip("simulator", reason="needs the simulator package")
    rel = sim.build_release(tmp / "release", time_scale=200)  # runs of a few tens of seconds: scrapes see them running
    models = tmp / "models"
    sim.make_models(models)
    return Path(rel.path), models


def test_prometheus_scrapes_fleet_and_every_expression_has_data(
        tmp_path: Path, seed_text: str, procs: Procs, servers: list[Any]) -> None:
    tarball, models = sim_release(tmp_path)
    now = time.time()
    work = {m: tmp_path / "work" / m for m in ("sim-a", "sim-b", "fix-c", "fix-d")}
    for w in work.values():
        w.mkdir(parents=True)

    # fixtures: fix-c failed, stale heartbeat, GPU, low disk, its precompile fetched from the fleet's kernel cache
    # (real fetches: tests/fleet/test_kernel_cache_fleet.py); fix-d stuck
    fc = finished_run(work["fix-c"], seed_text, "c-1", "fix-c", release="1.4.1", state=RunState.FAILED, fetched_s=0.04)
    fc.event("precompile", "failed", 12.0, exit_code=1, message="kernel build failed")
    fc.progress(state=RunState.FAILED, step="precompile", keys_total=2, finished_at=now,
                outcomes=(KeyOutcome(model_key="qwen3", status="failed"),
                          KeyOutcome(model_key="qwen35", status="skipped")))
    fc.state(None, "c-1")
    heartbeat(work["fix-c"], "fix-c", ts=now - 600)
    fd = RunWriter(work["fix-d"], "d-1", "fix-d", "1.4.1")
    fd.progress(state=RunState.BENCHMARKING, step="benchmark", model_key="qwen3", keys_total=2, progress=0.4,
                started_at=now - 9000, updated_at=now - 7200)
    fd.state("d-1", None)
    heartbeat(work["fix-d"], "fix-d")

    def low_disk_gpu() -> SystemSample:
        return SystemSample((0.2, 0.2, 0.2), 8 << 30, 5 << 30, 1 << 20, 1 << 30, {"card0": 0.42}, {"card0": 55.0})

    ports = {m: 0 for m in work}
    for m, w in work.items():
        kw: dict[str, Any] = {"system": low_disk_gpu} if m == "fix-c" else {}
        server, thread = start_exporter(w, m, port=0, **kw)
        servers.append((server, thread))
        ports[m] = server.server_port
    ports["dead-e"] = free_port()

    # controller: seed as baseline, fix-c 20 % slower in the latest run
    history = History(tmp_path / "history.sqlite")
    history.add_baseline("1.4.1", [r for rows in parse_seed(seed_text).values() for r in rows], source="seed")
    history.create_run("run-1", release="1.4.1", modules=["fix-c", "sim-a"])
    history.upsert_rows(r for rows in seed_rows(seed_text, "run-1", "fix-c", "1.4.1", scale=0.8).values()
                        for r in rows)
    history.upsert_rows(r for rows in seed_rows(seed_text, "run-1", "sim-a", "1.4.1").values() for r in rows)
    history.set_run_state("run-1", "done", verdict="regression")
    history.set_dispatched("run-1", "low", now - 100)  # waited 40 s on sim-a (the wait histogram's panel)
    history.upsert_progress(RunProgress(run_id="run-1", module="sim-a", release="1.4.1", state=RunState.DONE,
                                        started_at=now - 60, updated_at=now - 10, finished_at=now - 10))
    # fix-d power-cycled once by the recovery policy (m1000_fleet_power_cycles: its module event)
    history.add_module_event("fix-d", f"{MODULE_CYCLED}: run run-1: at 10:12 after no heartbeat for 240 s")
    states = {"sim-a": "busy", "sim-b": "busy", "fix-c": "bad", "fix-d": "busy", "dead-e": "offline"}
    creg = CollectorRegistry()
    # sim-a's clock measured 0.4 s ahead
    readings: dict[str, str | ModuleReading] = {**states, "sim-a": ModuleReading("busy", 0.4)}
    depths = {f"module.{m}": {"normal": 0} for m in states}
    creg.register(ControllerCollector(history, lambda: readings, lambda: depths,
                                      reserved=lambda: {"sim-b": "alice"},  # sim-b held by alice (fleetctl reserve)
                                      parts=lambda: {"history": True, "broker": True}))  # as fleetctl serve gives
    cserver = start_exporter(tmp_path, port=0, registry=creg)
    servers.append(cserver)

    # prometheus: file_sd from the inventory, our rules, 1 s scrapes
    inv = parse_inventory({"module": [{"name": m, "host": "127.0.0.1", "metrics_port": p, "labels": {"lab": "t"}}
                                      for m, p in ports.items()]})
    sd = tmp_path / "prom" / "agents.json"
    sd.parent.mkdir()
    sd.write_text(json.dumps(file_sd(inv)))
    shutil.copy(RULES, sd.parent / "m1000.rules.yml")
    cfg = sd.parent / "prometheus.yml"
    cfg.write_text(json.dumps({
        "global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
        "rule_files": ["m1000.rules.yml"],
        "scrape_configs": [
            {"job_name": "m1000-agent", "file_sd_configs": [{"files": [str(sd)], "refresh_interval": "1s"}]},
            {"job_name": "m1000-controller", "static_configs": [{"targets": [f"127.0.0.1:{cserver[0].server_port}"]}]},
        ],
    }))
    pport = free_port()
    base = f"http://127.0.0.1:{pport}"
    procs.start([PROMETHEUS or "", f"--config.file={cfg}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{pport}", "--log.level=warn"], tmp_path / "prometheus.log")

    def ready() -> bool:
        try:
            return urllib.request.urlopen(f"{base}/-/ready", timeout=1).status == 200
        except OSError:
            return False

    wait_for(ready, 60, "prometheus ready", interval=0.3)

    # the simulated modules run while Prometheus scrapes; each samples its simulated device (sim-b's throttles)
    from simulator import DEVICE_TOOL_DIR, ENV_DEVICE, ENV_DEVICE_DIR

    runs = {}
    for m, keys, port in (("sim-a", "qwen3,qwen35_mtp,qwen3vl", free_port()), ("sim-b", "qwen3,qwen35", free_port())):
        heartbeat(work[m], m)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "PATH": f"{DEVICE_TOOL_DIR}{os.pathsep}{os.environ['PATH']}",
               ENV_DEVICE_DIR: str(work[m]), ENV_DEVICE: "throttle" if m == "sim-b" else "",
               # at time scale 200 a key's window lasts about a second: the sampler's fast rate (the simulated
               # tool's ~40 ms floor) still gives it the 20 samples an energy figure needs
               "FLEET_TELEMETRY_PERIOD": "0.5"}
        if m == "sim-b":  # sim-b also sweeps for its capacity at an SLO (the m1000_result_capacity_* series)
            env.update(FLEET_PROBE_SWEEP_SLO="ttft_p90_ms=8000,tpot_p90_ms=60")
        runs[m] = procs.start([str(Path(sys.executable).parent / "fleet-agent"), "run", str(tarball),
                               "--models", keys, "--model-root", str(models), "--workdir", str(work[m]),
                               "--module", m, "--server-port", str(port), "--run-id", f"{m}-run",
                               "--format", "json"], tmp_path / f"{m}.log", env=env)

    wait_for(lambda: query(base, 'max_over_time(m1000_run_active{module="sim-a"}[10m]) == 1'), 120,
             "sim-a seen running", interval=0.3)  # a scrape saw it running (the run may already have ended)
    for m, p in runs.items():
        p.wait(timeout=150)
        assert p.returncode == 0, (tmp_path / f"{m}.log").read_text()[-3000:]
        heartbeat(work[m], m)
    wait_for(lambda: query(base, 'm1000_run_state{module="sim-b", state="done"} == 1'), 30, "sim-b done", interval=0.3)
    time.sleep(2.5)  # a few more scrapes for rate()

    # the run was seen in progress, then done, with the simulator's figures
    assert query(base, 'max_over_time(m1000_run_progress_ratio{module="sim-a"}[5m]) < 1'
                 ' or min_over_time(m1000_run_progress_ratio{module="sim-a"}[5m]) < 1')
    assert query(base, 'm1000_result_vision_frames_per_second{module="sim-a"} > 0')
    assert query(base, 'm1000_result_gsm8k_accuracy_ratio{module="sim-a"}')
    assert len(query(base, 'm1000_result_decode_tokens_per_second{module="sim-b"}')) == 22
    assert query(base, 'm1000_result_capacity_concurrency{module="sim-b", profile="128:128"} >= 1')
    assert query(base, 'up{job="m1000-agent", module="dead-e"} == 0')
    # the devices were sampled during the runs (what a throttled card reports: tests/telemetry)
    for m in ("sim-a", "sim-b"):
        assert query(base, f'max_over_time(m1000_device_sm_clock_max_hertz{{module="{m}"}}[5m]) == 1800e6')

    failures: list[str] = []
    checked = 0
    exprs = [(f"{d}: {t!r}", tg["expr"]) for d, t, _, tg in dashboard_queries()]
    exprs += [(f"rule {name}", e) for name, e in rule_exprs().items()]
    exprs += [(f"{d}: annotation {a!r}", e) for d, a, e in dashboard_annotations()]
    for where, expr in exprs:
        result = query(base, substitute(expr))
        checked += 1
        if expr in EXPECTED_EMPTY:
            if result:
                failures.append(f"{where}: expected empty ({EXPECTED_EMPTY[expr]}), got {len(result)} series")
        elif not result:
            failures.append(f"{where}: no data for {expr}")
    assert not failures, "\n".join(failures)
    assert checked >= 50

    # every catalog metric was scraped (the docs test checks the docs against the same catalog)
    names = set(get(f"{base}/api/v1/label/__name__/values")["data"])
    for spec in (*AGENT_CATALOG, *CONTROLLER_CATALOG):
        want = spec.name + ("_bucket" if spec.type == "histogram" else "")
        assert want in names, want
    # the rules loaded into the real Prometheus too
    groups = get(f"{base}/api/v1/rules")["data"]["groups"]
    assert sum(len(g["rules"]) for g in groups) == len(rule_exprs())
    history.close()


@pytest.mark.skipif(PUSHGATEWAY is None, reason="needs prometheus-pushgateway (Debian package)")
def test_push_to_a_real_pushgateway(tmp_path: Path, seed_text: str, procs: Procs) -> None:
    finished_run(tmp_path, seed_text, "r1", "m-push")
    port = free_port()
    procs.start([PUSHGATEWAY or "", f"--web.listen-address=127.0.0.1:{port}"], tmp_path / "pgw.log")
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: _ok(f"{url}/-/ready"), 30, "pushgateway ready", interval=0.3)
    reg = build_registry(tmp_path, "m-push")
    assert push_once(reg, url, "m-push", timeout=2.0)
    body = urllib.request.urlopen(f"{url}/metrics", timeout=5).read().decode()
    assert 'm1000_result_ttft_seconds{instance="",job="m1000-agent",model_key="qwen3",module="m-push"' in body


def _ok(url: str) -> bool:
    try:
        return urllib.request.urlopen(url, timeout=1).status == 200
    except OSError:
        return False
