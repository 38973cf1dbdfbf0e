"""HTTP API overhead, measured side by side in one run.

1. Trigger latency: ``POST /api/v1/runs`` to ``fleetctl serve --api-port`` -> the first module
   started (its agent's first progress past "pending"), next to ``fleetctl validate --detach``
   (a new process, as a CI job without the API would run it) -> the same event, alternating,
   on one simulated module (time scale 1000, one model key). Ratio API / CLI.
2. Throughput: ``GET /api/v1/runs/{id}`` against the same serve process (uvicorn, one worker
   process, threads for the sync routes), keep-alive clients in threads of this process, on
   this machine's cores (2 here: clients and server share them).

Usage: python bench/api.py [--broker embedded|redis] [--rounds 5] [--seconds 10] [--clients 4]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import record  # noqa: E402 - bench/record.py, this script's folder
from contract.records import RunState  # noqa: E402
from controller.cli.demo import inventory_toml, start_worker, stop_workers, wait_for_heartbeats  # noqa: E402
from controller.service import Session  # noqa: E402
from controller.settings import ControllerSettings  # noqa: E402
from simulator.ports import free_port  # noqa: E402

TOKEN = "bench-token-0123456789abcdef"


def env_for(s: ControllerSettings) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env.update({"FLEET_BROKER_URL": s.broker_url, "FLEET_DATA_DIR": str(s.data_dir),
                "FLEET_INVENTORY": str(s.inventory), "FLEET_HISTORY": str(s.history_path),
                "FLEET_HEARTBEAT_INTERVAL": str(s.heartbeat_interval), "FLEET_OFFLINE_AFTER": str(s.offline_after),
                "FLEET_CONTROLLER_METRICS_PORT": "0"})
    return env


def wait_started(sess: Session, run_id: str, module: str, timeout: float = 60.0) -> float:
    """Poll the broker (5 ms) until the module's agent reports the run past pending; the time then."""
    kv = sess.fleet().kv
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        p = kv.progress(run_id, [module]).get(module)
        if p is not None and (p.state != RunState.PENDING or p.started_at):
            return time.perf_counter()
        time.sleep(0.005)
    raise SystemExit(f"run {run_id} did not start on {module} within {timeout:.0f} s")


def wait_finished(sess: Session, run_id: str, timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if sess.fleet().sync(run_id).finished:
            return
        time.sleep(0.1)
    raise SystemExit(f"run {run_id} did not finish within {timeout:.0f} s")


def post_run(port: int, release: Path) -> str:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/api/v1/runs", json.dumps({"release": str(release), "models": ["qwen3"]}),
              {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"})
    r = c.getresponse()
    body = json.loads(r.read())
    c.close()
    if r.status != 201:
        raise SystemExit(f"POST /runs: {r.status} {body}")
    return str(body["run_id"])


def load(port: int, path: str, seconds: float, clients: int) -> tuple[int, list[float]]:
    """Keep-alive GETs from ``clients`` threads for ``seconds``: (requests, latencies)."""
    stop = time.monotonic() + seconds
    lat: list[list[float]] = [[] for _ in range(clients)]
    errors: list[str] = []

    def client(i: int) -> None:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        hdr = {"Authorization": f"Bearer {TOKEN}"}
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            c.request("GET", path, headers=hdr)
            r = c.getresponse()
            r.read()
            if r.status != 200:
                errors.append(str(r.status))
                return
            lat[i].append(time.perf_counter() - t0)
        c.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise SystemExit(f"GET {path}: HTTP {errors[0]}")
    flat = [x for xs in lat for x in xs]
    return len(flat), flat


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--broker", default="embedded", choices=["embedded", "redis"])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=4)
    args = ap.parse_args()
    from simulator import build_release, make_models

    tmp = Path(tempfile.mkdtemp(prefix="bench-api-"))
    redis = serve = None
    workers = []
    try:
        url = "filesystem://"
        if args.broker == "redis":
            from tests.support.redis_server import RedisServer

            redis = RedisServer(tmp / "redis")
            redis.start()
            url = redis.url
        s = ControllerSettings(broker_url=url, data_dir=tmp / "fleet", inventory=tmp / "inventory.toml",
                               history=tmp / "history.sqlite", heartbeat_interval=1.0, offline_after=30.0)
        (tmp / "inventory.toml").write_text(inventory_toml(["bench-01"], tmp, None))
        rel = build_release(tmp / "release", time_scale=1000.0, noise=0.0, seed=1)
        make_models(tmp / "modules" / "bench-01" / "models")
        workers.append(start_worker("bench-01", tmp, s, sim_env={}))
        wait_for_heartbeats(s, workers, 60)
        tokens = tmp / "tokens"
        tokens.write_text(TOKEN + "\n")
        tokens.chmod(0o600)
        port = free_port()
        exe = Path(sys.executable).parent / "fleetctl"
        serve = subprocess.Popen([str(exe), "serve", "--interval", "0.5", "--api-port", str(port), "--tokens",
                                  str(tokens)], env=env_for(s), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 text=True, start_new_session=True)
        end = time.monotonic() + 60
        while True:
            try:
                http.client.HTTPConnection("127.0.0.1", port, timeout=1).connect()
                break
            except OSError:
                if time.monotonic() > end or serve.poll() is not None:
                    raise SystemExit("fleetctl serve did not start") from None
                time.sleep(0.1)
        api_t: list[float] = []
        cli_t: list[float] = []
        with Session(s) as sess:
            post_run(port, rel.path)  # warm up both paths once (imports, first connection)
            wait_finished(sess, sess.history().runs(limit=1)[0].run_id)
            for _ in range(args.rounds):
                t0 = time.perf_counter()
                rid = post_run(port, rel.path)
                api_t.append(wait_started(sess, rid, "bench-01") - t0)
                wait_finished(sess, rid)
                t0 = time.perf_counter()
                out = subprocess.run([str(exe), "validate", str(rel.path), "--models", "qwen3", "--detach"],
                                     env=env_for(s), capture_output=True, text=True, timeout=120)
                if out.returncode != 0:
                    raise SystemExit(f"fleetctl validate --detach: {out.stderr.strip()}")
                rid = out.stdout.strip().splitlines()[-1]
                cli_t.append(wait_started(sess, rid, "bench-01") - t0)
                wait_finished(sess, rid)
            last = rid
        a, c = statistics.median(api_t), statistics.median(cli_t)
        print(f"trigger -> first module started ({args.broker} broker, {args.rounds} rounds, medians): "
              f"POST /api/v1/runs {a * 1e3:7.1f} ms | fleetctl validate --detach {c * 1e3:7.1f} ms | "
              f"ratio API/CLI {a / c:4.2f}")
        n, lat = load(port, f"/api/v1/runs/{last}", args.seconds, args.clients)
        lat.sort()
        print(f"GET /api/v1/runs/{{id}} (finished run, {args.clients} keep-alive clients, {args.seconds:g} s, "
              f"{os.cpu_count()} cores shared by clients and server): {n / args.seconds:7.1f} req/s, "
              f"p50 {lat[len(lat) // 2] * 1e3:5.1f} ms, p99 {lat[int(len(lat) * 0.99)] * 1e3:5.1f} ms")
    finally:
        if serve is not None:
            os.killpg(serve.pid, signal.SIGTERM)
            serve.wait(timeout=20)
        stop_workers(workers, grace=10)
        if redis:
            redis.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
