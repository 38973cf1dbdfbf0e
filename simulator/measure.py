"""Measure the simulator itself: accuracy, sweep wall time and CPU per simulated module.

``python -m simulator.measure [--modules 1,4,8] [--key qwen3] [--scale 50]`` builds a release,
runs ``N`` simulated modules at once (one server + one benchmark each, distinct ports) and
prints, side by side for each N: the worst relative error of any numeric cell against the
seed, the sweep's wall time, and CPU used per module (server + benchmark) as a share of one
core over the sweep. Also with scheduling priority off (``M1000_SIM_PRIORITY=off``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import tarfile
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from agent.tables import parse_seed
from contract.records import MODEL_KEYS
from simulator.build import build_release, make_models
from simulator.fit import REFERENCE
from simulator.ports import free_port

FIELDS = ("prefill_tps", "ttft_ms", "decode_tps", "tpot_ms", "accept_rate", "accept_rate_len", "vision_fps")


@dataclass(frozen=True)
class Outcome:
    worst: float
    wall: float
    server_cpu: float  # share of one core, per module
    bench_cpu: float
    ok: bool


def _prepare(tmp: Path, scale: float) -> tuple[Path, dict[str, str]]:
    rel = build_release(tmp / "dist", time_scale=scale)
    with tarfile.open(rel.path) as tar:
        tar.extractall(tmp / "mod", filter="data")
    root = tmp / "mod" / rel.top
    models = make_models(tmp / "models")
    cfg = {"model_paths": sorted({str(p) for p in models.values()})}
    (root / "scripts/ci/musa/tilelang_workflow_config.json").write_text(json.dumps(cfg))
    base = {k: v for k, v in os.environ.items() if not k.startswith("M1000_SIM_")}
    subprocess.run([str(root / "scripts/ci/musa/generate_tilelang_workflow.sh")], env=base, check=True,
                   capture_output=True)
    out = subprocess.run(["bash", "-c", "source scripts/ci/musa/setup_env.sh && env -0"], cwd=root, env=base,
                         check=True, capture_output=True, text=True)
    env = dict(x.split("=", 1) for x in out.stdout.split("\0") if "=" in x)
    subprocess.run([str(root / "scripts/ci/musa/precompile_tilelang_kernels.sh")], env=env, check=True,
                   capture_output=True)
    return root, env


def _wait_ready(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"server on port {port} did not come up")


def run(root: Path, env: dict[str, str], key: str, modules: int, extra: dict[str, str]) -> Outcome:
    spec = MODEL_KEYS[key]
    expected = parse_seed(REFERENCE.read_text(encoding="utf-8"))[key]
    servers = []
    try:
        ports = []
        for _ in range(modules):
            port = free_port()
            e = {**env, **spec.env, **extra, "SERVER_PORT": str(port)}
            servers.append(subprocess.Popen([str(root / "scripts/ci/musa" / spec.start_script)], env=e,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                            start_new_session=True))
            ports.append(port)
        for port, proc in zip(ports, servers, strict=True):
            _wait_ready(port, proc)
        start_cpu = [_cpu(p.pid) for p in servers]
        t0 = time.monotonic()
        benches = [subprocess.Popen([str(root / "scripts/ci/musa/run_tilelang_benchmark.sh")],
                                    env={**env, **extra, "MODEL_KEY": key, "SERVER_PORT": str(port)},
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) for port in ports]
        outs, bench_cpu = [], []
        for b in benches:
            _, status, usage = os.wait4(b.pid, 0)
            b.returncode = os.waitstatus_to_exitcode(status)
            outs.append((b.returncode, b.stdout.read().decode() if b.stdout else ""))
            bench_cpu.append(usage.ru_utime + usage.ru_stime)
        wall = time.monotonic() - t0
        server_cpu = [_cpu(p.pid) - c for p, c in zip(servers, start_cpu, strict=True)]
    finally:
        for p in servers:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, 15)
            p.wait(10)
    worst, ok = 0.0, True
    for code, text in outs:
        if code != 0:
            ok = False
            continue
        rows = parse_seed(text).get(key, [])
        ok = ok and len(rows) == len(expected)
        for got, exp in zip(rows, expected, strict=False):
            for f in FIELDS:
                want = getattr(exp, f)
                if want:
                    worst = max(worst, abs(getattr(got, f) / want - 1))
    return Outcome(worst=worst, wall=wall, server_cpu=sum(server_cpu) / modules / wall,
                   bench_cpu=sum(bench_cpu) / modules / wall, ok=ok)


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m simulator.measure")
    p.add_argument("--modules", default="1,4")
    p.add_argument("--key", default="qwen3")
    p.add_argument("--scale", type=float, default=50.0)
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="m1000-measure-") as tmp:
        root, env = _prepare(Path(tmp), args.scale)
        print(f"key {args.key}, time scale {args.scale:g}, load average {os.getloadavg()[0]:.1f} at start")
        print("modules  priority  worst-cell-error  sweep-wall-s  server-cpu  bench-cpu  (% of one core per module)")
        for n in (int(x) for x in args.modules.split(",")):
            for prio in ("rt", "off"):
                o = run(root, env, args.key, n, {"M1000_SIM_PRIORITY": prio})
                print(f"{n:7d}  {prio:8s}  {o.worst * 100:15.2f}%  {o.wall:12.1f}  {o.server_cpu * 100:9.2f}%"
                      f"  {o.bench_cpu * 100:8.2f}%" + ("" if o.ok else "  (a benchmark failed)"), flush=True)


if __name__ == "__main__":
    main()
