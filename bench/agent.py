"""Benchmark: the agent's own footprint, next to bare Celery workers in the same run.

Starts, the same way (``python -m ...`` with the same interpreter, embedded broker, a new
session): one simulated module's agent (``python -m agent.worker``: one process, Celery's solo
pool, the run in its main thread, the /metrics exporter and heartbeat threads) and two bare
Celery workers with one no-op task: prefork with concurrency 1 (the issue's anchor: worker and
pool child) and solo (the same form as the agent). Samples every process of each (the release's
own server and benchmark scripts are the benchmark, not the agent) and prints, per process and
in total:

* RSS and PSS (PSS shares the pages a forked pool child has in common with its parent), the
  largest seen in the phase, and where that RSS lies (``/proc/<pid>/smaps_rollup`` at that sample):
  anonymous pages (heap, Python's arenas: what the process built) against file pages (code of the
  interpreter and of the extension modules it ran), and private dirty (what fork did not share);
* CPU in *module time*: CPU-seconds per hour of validation at time scale 1 (the simulator runs
  N x faster than a module; an hour of a module's time passes in 1/N hour here).

Phases: ``idle`` (heartbeats only, ``--idle`` seconds) and ``run`` (a validation of
``--models`` on the simulated module, at ``--time-scale``).

Goal (issue 18): the agent's RSS while a benchmark runs (all its processes, exporter included)
<= 80 MiB (``--goal-mib``); the median over ``--rounds`` rounds (each: fresh agent, fresh bare workers,
side by side) is printed with its spread, and the bench exits 1 when the median misses the goal.

``--agent-venv DIR`` runs all three (agent and bare workers) in a virtualenv holding only what a module
installs (``requirements-agent.lock``; made there when missing, with uv): the development venv
also holds the controller's and the tests' packages, some of which Celery and redis-py load when
they are present (pyyaml, greenlet, cffi, opentelemetry), for the agent and the bare workers alike.

``--how cli`` starts the agent as its systemd unit does (``fleet-agent worker``) instead of
``python -m agent.worker`` (the demo's form).

Usage: flock /tmp/bench.lock .venv/bin/python bench/agent.py [--rounds 3] [--idle 10] [--models qwen3]
       [--time-scale 50] [--how module|cli] [--agent-venv .venv-agent] [--goal-mib 80]
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import record  # noqa: E402 - bench/record.py, this script's folder

if TYPE_CHECKING:
    from controller.settings import ControllerSettings

BARE = """
import sys
from pathlib import Path
from celery import Celery
base, pool = Path(sys.argv[1]), sys.argv[2]
folders = {k: base / k for k in ("in", "processed", "results", "control")}
for f in folders.values():
    f.mkdir(parents=True, exist_ok=True)
app = Celery("bare", broker="filesystem://", backend=f"file://{folders['results']}")
app.conf.broker_transport_options = {"data_folder_in": str(folders["in"]), "data_folder_out": str(folders["in"]),
                                     "processed_folder": str(folders["processed"]),
                                     "control_folder": str(folders["control"])}  # kombu's default is ./control
app.conf.accept_content = ["json"]
app.conf.task_serializer = app.conf.result_serializer = "json"
@app.task(name="bare.noop")
def noop():
    return None
app.Worker(concurrency=1, pool=pool, loglevel="WARNING", without_gossip=True, without_mingle=True,
           without_heartbeat=True, redirect_stdouts=False).start()
"""


FIELDS = ("rss", "pss", "anon", "file", "private_dirty")
POOLS = ("prefork", "solo")  # the bare Celery workers: the anchor, and the agent's own form


def read_rollup(pid: int) -> dict[str, float]:
    """MiB of ``/proc/<pid>/smaps_rollup``: rss, pss, anon (anonymous), file (rss - anon), private_dirty."""
    kib: dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as fh:
        for line in fh:
            parts = line.split()
            if len(parts) == 3 and parts[0].endswith(":"):
                kib[parts[0][:-1]] = int(parts[1])
    mib = {"rss": kib["Rss"], "pss": kib["Pss"], "anon": kib["Anonymous"], "file": kib["Rss"] - kib["Anonymous"],
           "private_dirty": kib["Private_Dirty"]}
    return {k: v / 1024 for k, v in mib.items()}


IMPORTS = """
import gc, sys
from pathlib import Path

def rollup():
    kib = {}
    for line in open("/proc/self/smaps_rollup"):
        parts = line.split()
        if len(parts) == 3 and parts[0].endswith(":"):
            kib[parts[0][:-1]] = int(parts[1])
    return kib["Rss"] / 1024, kib["Anonymous"] / 1024

last = rollup()

def stage(name, who):
    global last
    gc.collect()
    now = rollup()
    rss, anon = now[0] - last[0], now[1] - last[1]
    print(f"{name:48s} {who:15s} {rss:+7.1f} {anon:+7.1f} {rss - anon:+7.1f} {now[0]:7.1f}")
    last = now

import celery.apps.worker, celery.concurrency.solo, kombu.transport.filesystem
stage("Celery's worker, solo pool, embedded broker", "bare too")
import pydantic_core
stage("pydantic_core", "agent")
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
stage("pydantic (BaseModel, Field, validators)", "agent")
import contract.records
stage("contract.records (its models built)", "agent")
import contract.celery_app, contract.kv, contract.settings
from agent.settings import AgentSettings
base = Path(sys.argv[1])
settings = AgentSettings(module="m1", workdir=base / "work", data_dir=base / "fleet")
stage("contract settings, kv, celery_app; AgentSettings", "agent")
import agent.worker, agent.heartbeat
agent.heartbeat.make_heartbeat(settings, "1").model_dump_json()
stage("agent.worker (the run task and its pipeline), one heartbeat", "agent")
import agent.metrics
stage("agent.metrics (/metrics, once it serves)", "agent")
import asyncio, agent.probe
stage("asyncio, agent.probe (a run's probe)", "agent, a run")
from agent import malloc
malloc.trim()
stage("malloc_trim(0)", "-")
"""


class Sampler(threading.Thread):
    """Samples the processes of one process tree whose command line is the root's (worker + pool child)."""

    def __init__(self, pid: int, interval: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.root = psutil.Process(pid)
        self.cmd = self.root.cmdline()
        self.interval = interval
        self.stop_at = threading.Event()
        self.lock = threading.Lock()
        self.peak: dict[str, dict[str, float]] = {}  # role -> smaps_rollup MiB at its largest RSS; pss: largest
        self.cpu: dict[int, float] = {}  # pid -> user+system s, last seen

    def procs(self) -> list[psutil.Process]:
        try:
            kids = self.root.children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        mine = [self.root]
        for k in kids:
            try:
                if k.cmdline() == self.cmd:
                    mine.append(k)
            except psutil.Error:
                pass
        return mine

    def sample(self) -> None:
        for p in self.procs():
            try:
                role = "worker" if p.pid == self.root.pid else "pool child"  # the agent and bare solo: worker only
                mem = read_rollup(p.pid)
                t = p.cpu_times()
            except (psutil.Error, OSError, KeyError):
                continue
            with self.lock:
                self.cpu[p.pid] = t.user + t.system
                was = self.peak.get(role)
                if was is None or mem["rss"] > was["rss"]:
                    self.peak[role] = {**mem, "pss": max(mem["pss"], was["pss"] if was else 0.0)}
                else:
                    was["pss"] = max(was["pss"], mem["pss"])

    def run(self) -> None:
        while not self.stop_at.is_set():
            self.sample()
            self.stop_at.wait(self.interval)

    def phase(self) -> tuple[dict[int, float], float]:
        self.sample()
        with self.lock:
            return dict(self.cpu), time.monotonic()

    def take_peak(self) -> dict[str, dict[str, float]]:
        with self.lock:
            peak, self.peak = self.peak, {}
            return peak


def cpu_between(a: tuple[dict[int, float], float], b: tuple[dict[int, float], float]) -> float:
    return sum(v - a[0].get(pid, 0.0) for pid, v in b[0].items())


Peaks = dict[str, dict[str, dict[str, float]]]  # who -> role -> smaps_rollup MiB


def one_round(args: argparse.Namespace, python: Path) -> dict[str, Any]:
    """Agent and bare worker side by side: idle, then one validation; their peaks and CPU per phase."""
    from controller.cli.demo import inventory_toml, start_worker, stop_workers, wait_for_heartbeats
    from controller.settings import ControllerSettings
    from simulator import build_release, make_models

    with tempfile.TemporaryDirectory(prefix="bench-agent-") as tmp:
        base = Path(tmp)
        settings = ControllerSettings(broker_url="filesystem://", data_dir=base / "fleet",
                                      inventory=base / "inventory.toml", history=str(base / "history.sqlite"))
        name = "sim-01"
        (base / "inventory.toml").write_text(inventory_toml([name], base, None), encoding="utf-8")
        rel = build_release(base / "release", time_scale=args.time_scale, seed=1)
        make_models(base / "modules" / name / "models")
        port = _free_port()
        # `sh -c 'exec ...' sh python -m agent.worker`: the shell becomes the agent (its own interpreter, its form)
        how = f"{python.parent / 'fleet-agent'} worker" if args.how == "cli" else f"{python} -m agent.worker"
        agent = start_worker(name, base, settings, sim_env={"FLEET_METRICS_PORT": str(port)},
                             argv_prefix=("/bin/sh", "-c", f"exec {how}", "sh"))
        bare = {pool: subprocess.Popen([str(python), "-c", BARE, str(base / f"bare-{pool}"), pool],
                                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                       start_new_session=True) for pool in POOLS}
        try:
            wait_for_heartbeats(settings, [agent], 60)
            time.sleep(2.0)  # the bare workers are up too (the prefork one's pool child forked)
            samplers = {"agent": Sampler(agent.proc.pid)}
            samplers.update({f"bare {pool}": Sampler(b.pid) for pool, b in bare.items()})
            for s in samplers.values():
                s.start()
            t0 = {k: s.phase() for k, s in samplers.items()}
            time.sleep(args.idle)
            t1 = {k: s.phase() for k, s in samplers.items()}
            idle_peak = {k: s.take_peak() for k, s in samplers.items()}
            run_s = _validate(settings, rel.path, args.models)
            t2 = {k: s.phase() for k, s in samplers.items()}
            run_peak = {k: s.take_peak() for k, s in samplers.items()}
            for s in samplers.values():
                s.stop_at.set()
        finally:
            stop_workers([agent])
            for b in bare.values():
                with _suppress():
                    os.killpg(b.pid, signal.SIGTERM)
                with _suppress():
                    b.wait(timeout=10)
                with _suppress():
                    os.killpg(b.pid, signal.SIGKILL)
    per_hour: dict[tuple[str, str], float] = {}
    for who in samplers:
        idle_cpu, run_cpu = cpu_between(t0[who], t1[who]), cpu_between(t1[who], t2[who])
        # idle: heartbeats tick in real time (no compression); run: simulated module time
        per_hour[who, "idle"] = idle_cpu / (t1[who][1] - t0[who][1]) * 3600
        per_hour[who, "run"] = run_cpu / ((t2[who][1] - t1[who][1]) * args.time_scale) * 3600
    return {"idle": idle_peak, "run": run_peak, "cpu": per_hour, "run_s": run_s}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3, help="fresh agent and bare worker each round; medians printed")
    ap.add_argument("--idle", type=float, default=10.0, help="seconds of the idle phase")
    ap.add_argument("--models", default="qwen3")
    ap.add_argument("--time-scale", type=float, default=50.0)
    ap.add_argument("--how", choices=("module", "cli"), default="module",
                    help="start the agent as `python -m agent.worker` or as `fleet-agent worker` (the unit's form)")
    ap.add_argument("--agent-venv", type=Path, default=None,
                    help="run agent and bare worker in this venv of the agent's lock only (made when missing)")
    ap.add_argument("--goal-mib", type=float, default=80.0,
                    help="the agent's RSS during a run, all processes, at most this (median of the rounds)")
    ap.add_argument("--imports", action="store_true",
                    help="only: what each import of the agent adds to a process's RSS (one fresh interpreter)")
    args = ap.parse_args()
    if not Path("/proc/self/smaps_rollup").exists():
        raise SystemExit("bench/agent.py needs /proc/<pid>/smaps_rollup (Linux 4.14+)")
    python = _agent_venv(args.agent_venv) if args.agent_venv else Path(sys.executable)
    if args.imports:
        print(f"bench/agent.py --imports: MiB each import adds to one fresh interpreter ({python}), in the "
              f"order the worker loads them; process: which of the agent's processes holds it")
        print(f"{'import':48s} {'process':15s} {'RSS':>7s} {'anon':>7s} {'file':>7s} {'RSS now':>7s}")
        with tempfile.TemporaryDirectory(prefix="bench-agent-") as tmp:
            subprocess.run([str(python), "-c", IMPORTS, tmp], check=True, cwd=ROOT)
        return 0
    rounds = [one_round(args, python) for _ in range(max(1, args.rounds))]

    form = "fleet-agent worker" if args.how == "cli" else "python -m agent.worker"
    where = f" in {args.agent_venv} (agent lock only)" if args.agent_venv else ""
    run_s = statistics.median(float(r["run_s"]) for r in rounds)
    print(f"bench/agent.py: agent started as `{form}`{where}; {len(rounds)} round(s), each: idle {args.idle:.0f} s, "
          f"then a validation of {args.models} at time scale {args.time_scale:g} ({run_s:.0f} s here = "
          f"{run_s * args.time_scale / 60:.0f} min of module time); load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("MiB, the sample of largest RSS per process (PSS: its largest); median over the rounds [min-max] "
          "where they differ; anon: heap and Python's arenas, file: code pages mapped; CPU s per module-hour")
    print(f"{'':12s} {'phase':5s} {'process':11s} {'RSS':>16s} {'PSS':>16s} {'anon':>6s} {'file':>6s} "
          f"{'priv.dirty':>10s} {'CPU':>6s}")
    run_rss: dict[str, list[float]] = {}
    for who in ("agent", *(f"bare {pool}" for pool in POOLS)):
        for phase in ("idle", "run"):
            peaks: list[dict[str, dict[str, float]]] = [r[phase][who] for r in rounds]
            for role in sorted({role for p in peaks for role in p}):
                vals = {f: [p[role][f] for p in peaks if role in p] for f in FIELDS}
                print(f"{who:12s} {phase:5s} {role:11s} {_spread(vals['rss']):>16s} {_spread(vals['pss']):>16s} "
                      f"{statistics.median(vals['anon']):6.1f} {statistics.median(vals['file']):6.1f} "
                      f"{statistics.median(vals['private_dirty']):10.1f}")
            totals = {f: [sum(p[role][f] for role in p) for p in peaks] for f in ("rss", "pss")}
            cpu = statistics.median(float(r["cpu"][who, phase]) for r in rounds)
            print(f"{who:12s} {phase:5s} {'all':11s} {_spread(totals['rss']):>16s} {_spread(totals['pss']):>16s} "
                  f"{'':6s} {'':6s} {'':10s} {cpu:6.1f}")
            if phase == "run":
                run_rss[who] = totals["rss"]
    agent = statistics.median(run_rss["agent"])
    prefork, solo = (statistics.median(run_rss[f"bare {pool}"]) for pool in POOLS)
    ok = agent <= args.goal_mib
    print(f"goal: agent RSS during a run (all processes, exporter thread included) <= {args.goal_mib:g} MiB: "
          f"{'met' if ok else 'NOT met'} ({agent:.1f} MiB; in the same rounds a bare Celery prefork worker "
          f"(concurrency 1) {prefork:.1f} MiB, agent/prefork {agent / prefork:.2f}; a bare solo worker {solo:.1f} MiB, "
          f"agent - solo {agent - solo:+.1f} MiB)")
    return 0 if ok else 1


def _spread(values: list[float]) -> str:
    med, lo, hi = statistics.median(values), min(values), max(values)
    return f"{med:.1f}" if hi - lo < 0.05 else f"{med:.1f} [{lo:.1f}-{hi:.1f}]"


def _validate(settings: ControllerSettings, tarball: Path, models: str) -> float:
    """One validation through the service layer, followed to its end; its wall time."""
    from contract.records import parse_model_keys
    from controller import service

    t = time.monotonic()
    with service.Session(settings) as s:
        launched = service.validate(s, service.ValidateRequest(release=tarball, models=parse_model_keys(models)))
        view = service.follow(s, launched.run_id, timeout=600)
    if view.state() != "done":
        errors = [f"{m}: {p.error}" for m, p in view.progress.items() if p is not None and p.error]
        raise SystemExit(f"validation {launched.run_id} did not end done: {view.state()} ({'; '.join(errors)})")
    return time.monotonic() - t


def _agent_venv(path: Path) -> Path:
    """The python of ``path``, a venv of requirements-agent.lock plus this project (made with uv when missing)."""
    python = path.resolve() / "bin" / "python"
    if not python.exists():
        uv = str(Path(sys.executable).parent / "uv")
        subprocess.run([uv, "venv", "-q", "--python", sys.executable, str(path)], check=True)
        subprocess.run([uv, "pip", "sync", "-q", "--python", str(python), str(ROOT / "requirements-agent.lock")],
                       check=True)
        subprocess.run([uv, "pip", "install", "-q", "--no-deps", "--python", str(python), "-e", str(ROOT)],
                       check=True)
    return python


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return True


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
