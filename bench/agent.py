"""Benchmark: the agent's own footprint, next to a bare Celery prefork worker in the same run.

Starts, the same way (``python -m ...`` with the same interpreter, embedded broker, a new
session): one simulated module's agent (``python -m agent.worker``: worker, prefork pool child,
the /metrics exporter thread) and a bare Celery worker (prefork, concurrency 1, one no-op
task). Samples every process of each (the release's own server and benchmark scripts are the
benchmark, not the agent) and prints, per process and in total:

* RSS and PSS (PSS shares the pages a forked pool child has in common with its parent), the
  largest seen in the phase;
* CPU in *module time*: CPU-seconds per hour of validation at time scale 1 (the simulator runs
  N x faster than a module; an hour of a module's time passes in 1/N hour here).

Phases: ``idle`` (heartbeats only, ``--idle`` seconds) and ``run`` (a validation of
``--models`` on the simulated module, at ``--time-scale``).

Goal (issue 18): the agent's RSS while a benchmark runs (all its processes, exporter included)
<= the bare worker's in the same run; exits 1 when missed.

``--agent-venv DIR`` runs both (agent and bare worker) in a virtualenv holding only what a module
installs (``requirements-agent.lock``; made there when missing, with uv): the development venv
also holds the controller's and the tests' packages, some of which Celery and redis-py load when
they are present (pyyaml, greenlet, cffi, opentelemetry), for the agent and the bare worker alike.

``--how cli`` starts the agent as its systemd unit does (``fleet-agent worker``) instead of
``python -m agent.worker`` (the demo's form).

Usage: .venv/bin/python bench/agent.py [--idle 20] [--models qwen3] [--time-scale 50] [--how module|cli]
       [--agent-venv .venv-agent]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

BARE = """
import sys
from pathlib import Path
from celery import Celery
base = Path(sys.argv[1])
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
app.Worker(concurrency=1, pool="prefork", loglevel="WARNING", without_gossip=True, without_mingle=True,
           without_heartbeat=True, redirect_stdouts=False).start()
"""


class Sampler(threading.Thread):
    """Samples the processes of one process tree whose command line is the root's (worker + pool child)."""

    def __init__(self, pid: int, interval: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.root = psutil.Process(pid)
        self.cmd = self.root.cmdline()
        self.interval = interval
        self.stop_at = threading.Event()
        self.peak: dict[str, tuple[float, float]] = {}  # role -> (rss MiB, pss MiB), largest seen
        self.cpu: dict[int, float] = {}  # pid -> user+system s, last seen
        self.roles: dict[int, str] = {}

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
                role = "worker" if p.pid == self.root.pid else "pool child"
                mem = p.memory_full_info()
                t = p.cpu_times()
            except psutil.Error:
                continue
            self.roles[p.pid] = role
            self.cpu[p.pid] = t.user + t.system
            rss, pss = self.peak.get(role, (0.0, 0.0))
            self.peak[role] = (max(rss, mem.rss / 2**20), max(pss, mem.pss / 2**20))

    def run(self) -> None:
        while not self.stop_at.is_set():
            self.sample()
            self.stop_at.wait(self.interval)

    def phase(self) -> tuple[dict[int, float], float]:
        self.sample()
        return dict(self.cpu), time.monotonic()


def cpu_between(a: tuple[dict[int, float], float], b: tuple[dict[int, float], float]) -> float:
    return sum(v - a[0].get(pid, 0.0) for pid, v in b[0].items())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--idle", type=float, default=20.0, help="seconds of the idle phase")
    ap.add_argument("--models", default="qwen3")
    ap.add_argument("--time-scale", type=float, default=50.0)
    ap.add_argument("--how", choices=("module", "cli"), default="module",
                    help="start the agent as `python -m agent.worker` or as `fleet-agent worker` (the unit's form)")
    ap.add_argument("--agent-venv", type=Path, default=None,
                    help="run agent and bare worker in this venv of the agent's lock only (made when missing)")
    args = ap.parse_args()

    from controller.demo import inventory_toml, start_worker, stop_workers, wait_for_heartbeats
    from controller.settings import ControllerSettings
    from simulator import build_release, make_models

    with tempfile.TemporaryDirectory(prefix="bench-agent-") as tmp:
        base = Path(tmp)
        settings = ControllerSettings(broker_url="filesystem://", data_dir=base / "fleet",
                                      inventory=base / "inventory.toml", history=base / "history.sqlite")
        name = "sim-01"
        (base / "inventory.toml").write_text(inventory_toml([name], base, None), encoding="utf-8")
        rel = build_release(base / "release", time_scale=args.time_scale, seed=1)
        make_models(base / "modules" / name / "models")
        port = _free_port()
        python = _agent_venv(args.agent_venv) if args.agent_venv else Path(sys.executable)
        # `sh -c 'exec ...' sh python -m agent.worker`: the shell becomes the agent (its own interpreter, its form)
        how = f"{python.parent / 'fleet-agent'} worker" if args.how == "cli" else f"{python} -m agent.worker"
        agent = start_worker(name, base, settings, sim_env={"FLEET_METRICS_PORT": str(port)},
                             argv_prefix=("/bin/sh", "-c", f"exec {how}", "sh"))
        bare = subprocess.Popen([str(python), "-c", BARE, str(base / "bare")], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            wait_for_heartbeats(settings, [agent], 60)
            time.sleep(2.0)  # the bare worker is up too (its pool child forked)
            samplers = {"agent": Sampler(agent.proc.pid), "bare celery": Sampler(bare.pid)}
            for s in samplers.values():
                s.start()
            t0 = {k: s.phase() for k, s in samplers.items()}
            time.sleep(args.idle)
            t1 = {k: s.phase() for k, s in samplers.items()}
            idle_peak = {k: dict(s.peak) for k, s in samplers.items()}
            for s in samplers.values():
                s.peak.clear()
            run_s = _validate(settings, rel.path, args.models)
            t2 = {k: s.phase() for k, s in samplers.items()}
            run_peak = {k: dict(s.peak) for k, s in samplers.items()}
            for s in samplers.values():
                s.stop_at.set()
        finally:
            stop_workers([agent])
            with _suppress():
                os.killpg(bare.pid, signal.SIGTERM)
            with _suppress():
                bare.wait(timeout=10)
            with _suppress():
                os.killpg(bare.pid, signal.SIGKILL)

    form = "fleet-agent worker" if args.how == "cli" else "python -m agent.worker"
    where = f" in {args.agent_venv} (agent lock only)" if args.agent_venv else ""
    print(f"bench/agent.py: agent started as `{form}`{where}; idle {args.idle:.0f} s, then a validation of "
          f"{args.models} at time scale {args.time_scale:g} ({run_s:.0f} s here = "
          f"{run_s * args.time_scale / 60:.0f} min of module time)")
    print(f"{'':12s} {'phase':5s} {'process':11s} {'RSS MiB':>8s} {'PSS MiB':>8s}   CPU s per module-hour")
    total_run_rss = {}
    for who in samplers:
        for phase, peak, a, b, scale_s in (("idle", idle_peak, t0, t1, None), ("run", run_peak, t1, t2, run_s)):
            wall = b[who][1] - a[who][1]
            cpu = cpu_between(a[who], b[who])
            # idle: heartbeats tick in real time (no compression); run: simulated module time
            per_hour = cpu / wall * 3600 if scale_s is None else cpu / (wall * args.time_scale) * 3600
            rss_sum = sum(r for r, _ in peak[who].values())
            pss_sum = sum(p for _, p in peak[who].values())
            for role, (rss, pss) in sorted(peak[who].items()):
                print(f"{who:12s} {phase:5s} {role:11s} {rss:8.1f} {pss:8.1f}")
            print(f"{who:12s} {phase:5s} {'all':11s} {rss_sum:8.1f} {pss_sum:8.1f}   {per_hour:8.1f}")
            if phase == "run":
                total_run_rss[who] = rss_sum
    ok = total_run_rss["agent"] <= total_run_rss["bare celery"]
    print(f"goal: agent RSS during a run (all processes, exporter thread included) <= bare Celery worker: "
          f"{'met' if ok else 'NOT met'} ({total_run_rss['agent']:.0f} vs {total_run_rss['bare celery']:.0f} MiB)")
    return 0 if ok else 1


def _validate(settings, tarball: Path, models: str) -> float:  # type: ignore[no-untyped-def]
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
    raise SystemExit(main())
