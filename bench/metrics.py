"""Cost of the agent's /metrics, measured side by side in one run.

1. Scrape cost of one agent holding 7 model keys x 11 profiles (one finished run with its
   step events), next to an empty registry: the cached rendering the exporter serves
   (text and OpenMetrics), the same registry through prometheus_client's plain
   ``generate_latest`` (no cache), and a whole HTTP GET on loopback. Budget: <= 10 ms.
2. CPU and RSS of an exporter process (scraped every second, 15x Prometheus's default rate)
   while the module is idle and while a simulated benchmark (``fleet-agent run``) writes
   into its workdir, and of the ``fleet-agent run`` process itself.

    .venv/bin/python bench/metrics.py [--seconds 8]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import psutil  # noqa: E402
from prometheus_client import CollectorRegistry, generate_latest  # noqa: E402

from agent.metrics import build_registry, start_exporter  # noqa: E402
from agent.tables import parse_seed, stamp  # noqa: E402
from bench import record  # noqa: E402 - bench/record.py, this script's folder
from contract.records import MODEL_KEYS, RunState  # noqa: E402
from tests.conftest import _seed_path  # noqa: E402
from tests.metrics.fleetfiles import RunWriter  # noqa: E402

OM = "application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.4,*/*;q=0.1"


def per_call_ms(fn: Callable[[], object], n: int) -> float:
    f = fn
    f()
    runs = []
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            f()
        runs.append((time.perf_counter() - t) / n * 1000)
    return statistics.median(runs)


def workdir_7x11(root: Path) -> Path:
    sweep = parse_seed(_seed_path().read_text(encoding="utf-8"))["qwen3"]
    assert len(sweep) == 11
    w = RunWriter(root, "bench-run", "m-bench", "1.4.1")
    for key in MODEL_KEYS:
        w.event("benchmark", "start", model_key=key)
        w.event("benchmark", "ok", 100.0, model_key=key)
        w.rows(stamp(sweep, run_id="bench-run", module="m-bench", release="1.4.1", model_key=key))
    for step in ("fetch", "unpack", "configure", "generate", "environment", "precompile"):
        w.event(step, "ok", 5.0)
    w.progress(state=RunState.DONE, step="publish", keys_total=7, keys_done=7, progress=1.0, rows=77)
    return root


def scrape_cost() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        wd = workdir_7x11(Path(tmp))
        reg = build_registry(wd, "m-bench")
        empty = CollectorRegistry()
        series = sum(len(m.samples) for m in reg.collect())
        server, thread = start_exporter(wd, "m-bench", port=0, registry=reg)
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        try:
            e = per_call_ms(lambda: generate_latest(empty), 2000)
            text = per_call_ms(lambda: reg.render(""), 100)
            om = per_call_ms(lambda: reg.render(OM), 100)
            plain = per_call_ms(lambda: generate_latest(reg), 30)
            http = per_call_ms(lambda: urllib.request.urlopen(url, timeout=5).read(), 50)
        finally:
            server.shutdown()
            server.server_close()
            thread.join()
    print(f"scrape cost, one agent with 7 keys x 11 profiles ({series} samples):")
    print(f"  empty registry, generate_latest        {e:8.3f} ms")
    print(f"  agent, cached render (text)            {text:8.3f} ms  ({text / e:,.0f} x empty)")
    print(f"  agent, cached render (OpenMetrics)     {om:8.3f} ms  ({om / e:,.0f} x empty)")
    print(f"  agent, plain generate_latest (no cache){plain:8.3f} ms  ({plain / text:.1f} x cached)")
    print(f"  agent, HTTP GET on loopback            {http:8.3f} ms")
    verdict = "ok" if max(text, om, http) <= 10.0 else "OVER BUDGET"
    print(f"  budget 10 ms: {verdict}")


EXPORTER = """
import sys, time
from agent.metrics import start_exporter
server, thread = start_exporter(sys.argv[1], "m-bench", port=0)
print(server.server_port, flush=True)
thread.join()
"""


def sample_cpu(procs: list[psutil.Process], seconds: float, url: str) -> list[tuple[float, int]]:
    before = [p.cpu_times() for p in procs]
    t0 = time.monotonic()
    rss = [0] * len(procs)
    while time.monotonic() - t0 < seconds:
        urllib.request.urlopen(url, timeout=5).read()
        for i, p in enumerate(procs):
            with contextlib.suppress(psutil.NoSuchProcess):
                rss[i] = max(rss[i], p.memory_info().rss)
        time.sleep(1.0)
    wall = time.monotonic() - t0
    out = []
    for p, b, r in zip(procs, before, rss, strict=True):
        try:
            a = p.cpu_times()
            used = (a.user + a.system) - (b.user + b.system)
        except psutil.NoSuchProcess:
            used = float("nan")
        out.append((used / wall * 100, r))
    return out


def agent_cpu(seconds: float) -> None:
    from simulator import build_release, make_models

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        wd = t / "work"
        wd.mkdir()
        rel = build_release(t / "rel", time_scale=200)
        make_models(t / "models")
        exp = subprocess.Popen([sys.executable, "-c", EXPORTER, str(wd)], stdout=subprocess.PIPE, env=env)
        try:
            assert exp.stdout is not None
            port = int(exp.stdout.readline())
            url = f"http://127.0.0.1:{port}/metrics"
            eproc = psutil.Process(exp.pid)
            (idle_cpu, idle_rss), = sample_cpu([eproc], seconds, url)
            run = subprocess.Popen(
                [str(Path(sys.executable).parent / "fleet-agent"), "run", str(rel.path), "--models", "qwen3,qwen35",
                 "--model-root", str(t / "models"), "--workdir", str(wd), "--module", "m-bench",
                 "--server-port", "31377", "--format", "json"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
            try:
                time.sleep(1.0)  # past unpack: into precompile/benchmark
                (busy_cpu, busy_rss), (run_cpu, run_rss) = sample_cpu([eproc, psutil.Process(run.pid)], seconds, url)
            finally:
                run.wait(timeout=300)
        finally:
            exp.terminate()
            exp.wait(timeout=10)
    print(f"agent process cost over {seconds:g} s windows, exporter scraped every 1 s:")
    print(f"  exporter, module idle                 CPU {idle_cpu:5.2f} % of a core, RSS {idle_rss / 2**20:6.1f} MiB")
    print(f"  exporter, during a simulated run      CPU {busy_cpu:5.2f} % of a core, RSS {busy_rss / 2**20:6.1f} MiB")
    print(f"  fleet-agent run (pipeline) itself     CPU {run_cpu:5.2f} % of a core, RSS {run_rss / 2**20:6.1f} MiB"
          " (not counting the release's server and benchmark children)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=8.0, help="length of each CPU sampling window")
    args = ap.parse_args()
    scrape_cost()
    agent_cpu(args.seconds)
    return 0


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
