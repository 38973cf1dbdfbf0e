"""The agent's own CPU in one run, per step: this tree against a baseline commit, side by side.

Each round runs, for each side (alternating which goes first), one run of a cheap simulated
module (``simulator/cheap.py`` at ``--time-scale``, default 1000: a ~1 s run) in a fresh
interpreter that does what a worker's pool child does: ``agent.pipeline`` and ``agent.worker``
imported first (the worker imports them before it forks, so they are not the run's CPU), then
``agent.task.execute_run`` (request validation, the cancel flag, the pipeline, progress and rows
published to a real redis-server, the final state through the outbox). A fresh work folder each
time: the release is verified and unpacked for real, as for a new release.

CPU is ``time.process_time`` of that process (its threads included: output pumps, the telemetry
sampler), taken at every event the pipeline records (``events.jsonl``: step start / end), so each
figure is the CPU from one event to the next; the release's processes are marked where they are
spawned too ("spawn <script>"). "before the first wait" is the CPU from the task's start to the
precompile's spawn, the last thing the agent does before the release's precompile (the first
long wait of a run; at N=100 modules every ms of it is ~50 ms of wall for the slowest module);
"with the processes" adds the CPU of the run's processes reaped by then (``RUSAGE_CHILDREN``: the
release's scripts, the agent's shell snippets, telemetry samples).

The baseline side imports ``agent`` and ``contract`` from ``git archive BASELINE`` (default: the
merge base with ``main``); the release and the simulator are this tree's, for both sides.

Usage: flock /tmp/bench.lock .venv/bin/python bench/agent_cpu.py [--rounds 7] [--baseline REV]
       [--models qwen3] [--time-scale 1000]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import record  # noqa: E402 - bench/record.py, this script's folder
from simulator import build_release  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402

# Run by a fresh interpreter per side and round, with PYTHONPATH=<that side's tree>:<this tree>.
# Written against what both sides have (execute_run, in agent.task or agent.worker; RunStore.add_event's keywords).
CHILD = r"""
import json, os, resource, socket, sys, time
from pathlib import Path
import agent.pipeline, agent.worker  # the pre-fork image of a worker
from agent.settings import AgentSettings
from agent.store import RunStore
try:
    from agent.task import execute_run
except ImportError:  # a baseline from before the worker's split (issue 26): the task in agent.worker
    from agent.worker import execute_run
from contract.celery_app import make_app
from simulator import DEVICE_TOOL_DIR, ENV_DEVICE_DIR, make_models
from simulator.cheap import cheap_module_env

spec = json.loads(sys.argv[1])
base = Path(spec["base"])
make_models(base / "models", spec["models"])
(base / "device").mkdir(parents=True, exist_ok=True)
os.environ.update({k: v for k, v in cheap_module_env(spec["time_scale"]).items() if not k.startswith("FLEET_")})
os.environ["PATH"] = os.pathsep.join([str(DEVICE_TOOL_DIR), spec["python_bin"], os.environ["PATH"]])
os.environ[ENV_DEVICE_DIR] = str(base / "device")
s = socket.socket(); s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]; s.close()
settings = AgentSettings(broker_url=spec["broker"], module="sim-001", workdir=base / "work",
                         model_root=base / "models", data_dir=Path(spec["data_dir"]), server_port=port,
                         metrics_port=0, telemetry_period=float(spec["telemetry_period"]))
app = make_app(settings, module=settings.module)
marks = []
real_add = RunStore.add_event
def children():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime
def add_event(self, run_id, **kw):
    marks.append((time.process_time(), children(), kw["step"], kw["status"], time.monotonic()))
    return real_add(self, run_id, **kw)
RunStore.add_event = add_event
import agent.executor
real_start = agent.executor.Executor.start
def start(self, argv, **kw):
    name = os.path.basename(argv[-1]) if argv[-1].endswith(".sh") else argv[0]
    marks.append((time.process_time(), children(), "spawn", name, time.monotonic()))
    return real_start(self, argv, **kw)
agent.executor.Executor.start = start
payload = {"run_id": spec["run_id"], "module": "sim-001", "tarball": spec["tarball"], "sha256": spec["sha256"],
           "release": "bench", "models": spec["models"], "model_root": str(base / "models")}
app.backend.client.ping()  # the connection is the worker's, made before any run
t0, c0, w0 = time.process_time(), children(), time.monotonic()
out = execute_run(app, settings, payload)
t1, c1, w1 = time.process_time(), children(), time.monotonic()
if out.get("state") != "done":
    raise SystemExit(f"run ended {out.get('state')}: {out.get('error')}")
print(json.dumps({"t0": t0, "c0": c0, "t1": t1, "c1": c1, "w0": w0, "w1": w1, "marks": marks}))
"""


def export_tree(rev: str, dest: Path) -> Path:
    """``agent`` and ``contract`` of ``rev`` under ``dest`` (a baseline to import instead of this tree's)."""
    data = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "agent", "contract"], check=True,
                          capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(dest)], check=True)  # as an installed agent
    return dest


def one_run(tree: Path, spec: dict[str, object]) -> dict[str, float]:
    """CPU (ms) of one run in a fresh interpreter importing the agent from ``tree``, per segment."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(ROOT)])}
    res = subprocess.run([sys.executable, "-c", CHILD, json.dumps(spec)], env=env, capture_output=True, text=True,
                         cwd=str(tree), timeout=300)
    if res.returncode != 0:
        raise SystemExit(f"run with {tree} failed:\n{res.stderr[-3000:]}{res.stdout[-1000:]}")
    data = json.loads(res.stdout.strip().splitlines()[-1])
    t0, c0, t1, c1, marks = data["t0"], data["c0"], data["t1"], data["c1"], data["marks"]
    seg: dict[str, float] = {}
    prev, prev_w, name = t0, data["w0"], "task start"
    for t, c, step, status, w in marks:
        seg[name] = seg.get(name, 0.0) + (t - prev) * 1e3
        seg[WALL + name] = seg.get(WALL + name, 0.0) + (w - prev_w) * 1e3
        prev, prev_w, name = t, w, f"{step} {status}"
        if (step, status) == ("spawn", "precompile_tilelang_kernels.sh") and FIRST_WAIT not in seg:
            seg[FIRST_WAIT] = (t - t0) * 1e3
            # the generate and environment steps' processes, reaped by then (the release's and the agent's snippet)
            seg[FIRST_WAIT_ALL] = (t - t0 + c - c0) * 1e3
    seg[name] = seg.get(name, 0.0) + (t1 - prev) * 1e3
    seg[WALL + name] = seg.get(WALL + name, 0.0) + (data["w1"] - prev_w) * 1e3
    seg[WHOLE] = (t1 - t0) * 1e3
    seg[WHOLE_ALL] = (t1 - t0 + c1 - c0) * 1e3
    return seg


WALL = "wall of "  # a segment's wall time, ms (kept beside its CPU; not printed as a row of its own)
FIRST_WAIT = "before the first wait"
FIRST_WAIT_ALL = "before the first wait, with the processes of generate and environment"
WHOLE = "whole run"
WHOLE_ALL = "whole run, with every process of the run"
TOTALS = (FIRST_WAIT, FIRST_WAIT_ALL, WHOLE, WHOLE_ALL)


def _cell(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--baseline", default="", help="git revision of the old agent (default: merge base with main)")
    ap.add_argument("--models", default="qwen3")
    ap.add_argument("--time-scale", type=float, default=1000.0)
    ap.add_argument("--telemetry-period", type=float, default=10.0)
    args = ap.parse_args()
    rev = args.baseline or subprocess.run(["git", "-C", str(ROOT), "merge-base", "HEAD", "main"], check=True,
                                          capture_output=True, text=True).stdout.strip()
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "agent"), str(ROOT / "contract")], check=True)
    tmp = Path(tempfile.mkdtemp(prefix="agent-cpu-"))
    server = RedisServer(tmp / "redis")
    server.start()
    try:
        old = export_tree(rev, tmp / "baseline")
        data_dir = tmp / "fleet"
        rel = build_release(data_dir / "releases", version="1.5.0", time_scale=args.time_scale, noise=0.0, seed=1)
        sides = {"old": old, "new": ROOT}
        got: dict[str, list[dict[str, float]]] = {"old": [], "new": []}
        load0 = os.getloadavg()[0]
        for i in range(args.rounds):
            order = ("old", "new") if i % 2 == 0 else ("new", "old")
            for side in order:
                base = tmp / f"{side}-{i}"
                spec = {"base": str(base), "models": args.models.split(","), "time_scale": args.time_scale,
                        "python_bin": str(Path(os.path.realpath(sys.executable)).parent), "broker": server.url,
                        "data_dir": str(data_dir), "telemetry_period": args.telemetry_period,
                        "run_id": f"cpu-{side}-{i}", "tarball": str(rel.path), "sha256": rel.sha256}
                got[side].append(one_run(sides[side], spec))
                shutil.rmtree(base, ignore_errors=True)
        load1 = os.getloadavg()[0]
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    names = list(dict.fromkeys(k for side in ("old", "new") for r in got[side] for k in r if not k.startswith(WALL)))
    names = [n for n in names if n not in TOTALS] + list(TOTALS)
    print(f"agent CPU per run, ms (median (min-max) of {args.rounds} rounds, interleaved; a fresh interpreter per run "
          f"doing a pool child's work; models {args.models}, time scale {args.time_scale:g}); old = {rev[:9]}, "
          f"new = this tree; load average {load0:.1f} -> {load1:.1f} on {os.cpu_count()} cores")
    print("| CPU from event | old | new | new - old |")
    print("| --- | --- | --- | --- |")
    for n in names:
        o = [r[n] for r in got["old"] if n in r]
        w = [r[n] for r in got["new"] if n in r]
        diff = f"{statistics.median(w) - statistics.median(o):+.1f}" if o and w else "-"
        print(f"| {n} | {_cell(o)} | {_cell(w)} | {diff} |")
    # the agent's CPU as a share of one core over two segments: the idle measurement (from the server's "ok" to the
    # benchmark's start) and the release's benchmark window (from its spawn to its end); its sampler thread included
    print("\n| agent process CPU, share of one core (wall of the segment) | old | new |")
    print("| --- | --- | --- |")
    for n in ("server ok", "spawn run_tilelang_benchmark.sh"):
        cells = []
        for side in ("old", "new"):
            shares = [r[n] / r[WALL + n] * 100 for r in got[side] if n in r and r.get(WALL + n)]
            walls = [r[WALL + n] / 1e3 for r in got[side] if WALL + n in r]
            cells.append(f"{_cell(shares)} % ({statistics.median(walls):.2f} s)" if shares else "-")
        print(f"| from {n} | {cells[0]} | {cells[1]} |")

if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
