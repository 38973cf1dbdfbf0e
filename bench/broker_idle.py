"""Benchmark: an idle agent on a real Redis, next to a bare Celery worker in the same run (issue 47, items 3 and 5).

What each side costs the broker while it waits for work, and how fast it stops:

* its Redis connections while idle (``CLIENT LIST`` entries whose address is one of the worker process's own
  sockets, each with the last command it sent: what it is for), and again after one no-op task;
* its idle commands per second over ``--window`` s (``INFO commandstats`` after ``CONFIG RESETSTAT``, the bench's
  own INFO, CONFIG and CLIENT LIST left out);
* the seconds from SIGTERM to its exit, the SIGTERM sent just after the worker's BRPOP went out (the worst moment
  for a worker that waits for that BRPOP's reply), ``--stops`` times, a fresh worker each time, the sides
  interleaved.

Sides, each on a redis-server of its own (its command counts are its worker's), idle side by side:

* ``agent``: ``python -m agent.worker`` of this tree, as the demo starts it (heartbeat every 5 s, the default);
* ``agent@REV`` (``--before REV``, e.g. the commit before a change): the same agent from the tree at git revision
  ``REV`` (``git archive`` into a scratch folder, first on ``PYTHONPATH``): the figures before, in the same run;
* ``bare``: a bare Celery worker, ``celery worker -P solo -c 1`` (the agent's pool), Celery's defaults otherwise
  (gossip, mingle, event heartbeats, its Redis result backend on the same server).

Then (``--run-models``, on each agent side) one validation of those keys on a simulated release at
``--time-scale``, its connections sampled every 0.1 s: the most it held while it ran (heartbeat thread and run
thread at once).

Goals: every agent stop within 1.5 s of SIGTERM; the agent's idle commands/s at most bare Celery's (exit 1 when
missed).

Usage: python bench/broker_idle.py [--window 30] [--stops 3] [--before REV] [--run-models qwen3] [--time-scale 50]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import record  # noqa: E402 - bench/record.py, this script's folder
from contract.celery_app import NOOP_TASK, make_app, queue_name  # noqa: E402
from controller.cli.demo import inventory_toml, start_worker, stop_workers, wait_for_heartbeats  # noqa: E402
from controller.settings import ControllerSettings  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402

BENCH_COMMANDS = ("info", "config|resetstat", "client|list")  # the bench's own (one connection a side)
STOP_GOAL_S = 1.5

BARE_APP = textwrap.dedent("""
    import os, time
    from celery import Celery
    app = Celery("bare", broker=os.environ["BARE_BROKER"], backend=os.environ["BARE_BROKER"])
    @app.task(name="bare.noop")
    def noop(sent_at):
        return {"sent_at": sent_at, "started_at": time.time()}
""")


@dataclass
class Side:
    name: str
    base: Path
    redis: RedisServer
    pythonpath: str | None = None  # agent@REV: its tree
    proc: Any = None  # the worker: a controller.cli.demo.Worker (agent) or a Popen (bare)
    idle_conns: list[str] = field(default_factory=list)
    after_task_conns: list[str] = field(default_factory=list)
    cmds_per_s: float = 0.0
    by_command: dict[str, int] = field(default_factory=dict)
    stops: list[float] = field(default_factory=list)

    @property
    def is_agent(self) -> bool:
        return self.name != "bare"

    @property
    def pid(self) -> int:
        return int(self.proc.proc.pid if self.is_agent else self.proc.pid)

    def settings(self) -> ControllerSettings:
        return ControllerSettings(broker_url=self.redis.url, data_dir=self.base / "fleet",
                                  inventory=self.base / "inventory.toml", history=self.base / "h.sqlite",
                                  heartbeat_interval=5.0, offline_after=30.0)

    def start(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        if self.is_agent:
            (self.base / "inventory.toml").write_text(inventory_toml(["m1"], self.base, None))
            env = {"PYTHONPATH": self.pythonpath} if self.pythonpath else {}
            self.proc = start_worker("m1", self.base, self.settings(), sim_env=env)
            wait_for_heartbeats(self.settings(), [self.proc], 60)
            return
        (self.base / "bare_app.py").write_text(BARE_APP)
        env = dict(os.environ, PYTHONPATH=str(self.base), BARE_BROKER=self.redis.url)
        with (self.base / "worker.log").open("ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "celery", "-A", "bare_app", "worker", "-Q", "bare",
                                          "-P", "solo", "-c", "1", "-l", "WARNING"], env=env, cwd=self.base,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.noop()  # answered: the worker is up

    def noop(self) -> None:
        if self.is_agent:
            app = make_app(self.settings())
            app.send_task(NOOP_TASK, args=[time.time()], queue=queue_name("m1"),
                          task_id=f"m1:{uuid.uuid4()}").get(timeout=60)
        else:
            from celery import Celery

            app = Celery("bare", broker=self.redis.url, backend=self.redis.url)
            app.send_task("bare.noop", args=[time.time()], queue="bare").get(timeout=60)
        app.close()

    def stop(self) -> float:
        """SIGTERM just after the worker's BRPOP went out; seconds to its exit."""
        client = redis_client(self.redis)
        n = brpops(client)
        end = time.monotonic() + 15
        while brpops(client) == n and time.monotonic() < end:
            time.sleep(0.01)
        t0 = time.monotonic()
        os.killpg(self.pid, signal.SIGTERM)
        proc = self.proc.proc if self.is_agent else self.proc
        proc.wait(timeout=30)
        took = time.monotonic() - t0
        if self.is_agent:
            stop_workers([self.proc], grace=1)
        return took


_CLIENTS: dict[int, Any] = {}  # a server's port -> the bench's client of it


def redis_client(server: RedisServer) -> Any:
    """The bench's one client of ``server`` (one connection: no HELLO of a new one in the counted window)."""
    import redis

    if server.port not in _CLIENTS:
        _CLIENTS[server.port] = redis.Redis(port=server.port)
    return _CLIENTS[server.port]


def brpops(client: Any) -> int:
    return int(client.info("commandstats").get("cmdstat_brpop", {}).get("calls", 0))


def connections(side: Side) -> list[str]:
    """The worker's connections to its Redis, each as its last command (what it is for)."""
    import psutil

    mine = {f"{c.laddr.ip}:{c.laddr.port}" for c in psutil.Process(side.pid).net_connections(kind="tcp")
            if c.raddr and c.raddr.port == side.redis.port}
    return sorted(str(c["cmd"]) for c in redis_client(side.redis).client_list() if c["addr"] in mine)


def during_a_run(side: Side, models: str, scale: float) -> tuple[int, list[str], float]:
    """One validation on ``side``'s (running) agent, its connections sampled every 0.1 s: (the most at once, their
    last commands then, the run's seconds)."""
    from agent.validate import stage_local_release
    from contract.files import sha256_file
    from contract.records import parse_model_keys
    from controller.service import Session
    from simulator import build_release, make_models

    rel = build_release(side.base / "release", time_scale=scale, noise=0.0, seed=1)
    make_models(side.base / "modules" / "m1" / "models")
    st = Session(side.settings())
    try:
        fleet = st.fleet()
        st.history()
        mods = st.inventory().select("all")
        sha = sha256_file(rel.path)
        staged = stage_local_release(rel.path, sha, side.settings().data_dir)
        t0 = time.monotonic()
        fleet.dispatch(run_id="conns-1", modules=mods, tarballs={m.name: str(staged) for m in mods}, sha256=sha,
                       release=rel.version, models=parse_model_keys(models))
        most: list[str] = []
        while True:
            now = connections(side)
            if len(now) > len(most):
                most = now
            view = fleet.sync("conns-1")  # what the controller does while it follows a run
            if view.finished:
                break
            if time.monotonic() - t0 > 600:
                raise SystemExit("the validation did not end within 600 s")
            time.sleep(0.1)
        if view.state() != "done":
            raise SystemExit(f"the validation ended {view.state()}")
        return len(most), most, time.monotonic() - t0
    finally:
        st.close()


def checkout(rev: str, into: Path) -> Path:
    into.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--window", type=float, default=30.0, help="idle seconds counted")
    ap.add_argument("--stops", type=int, default=3)
    ap.add_argument("--before", default="", help="also the agent of this git revision")
    ap.add_argument("--run-models", default="qwen3", help="keys of the validation whose connections are sampled "
                    "('': none)")
    ap.add_argument("--time-scale", type=float, default=50.0)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-broker-idle-"))
    sides: list[Side] = []
    try:
        names = ["agent", *([f"agent@{args.before}"] if args.before else []), "bare"]
        before = checkout(args.before, tmp / "before") if args.before else None
        for name in names:
            server = RedisServer(tmp / name / "redis")
            server.start()
            sides.append(Side(name, tmp / name / "w", server, str(before) if name.startswith("agent@") else None))
        for s in sides:
            s.start()
        time.sleep(6)  # past start-up (mingle, the first restore of unacked messages)
        for s in sides:
            s.idle_conns = connections(s)
            redis_client(s.redis).config_resetstat()
        t0 = time.monotonic()
        time.sleep(args.window)
        for s in sides:
            stats = redis_client(s.redis).info("commandstats")
            calls = {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}
            s.by_command = {k: v for k, v in calls.items() if k not in BENCH_COMMANDS}
            s.cmds_per_s = sum(s.by_command.values()) / (time.monotonic() - t0)
        for s in sides:
            s.noop()
        time.sleep(6)
        for s in sides:
            s.after_task_conns = connections(s)
        runs = {s.name: during_a_run(s, args.run_models, args.time_scale) for s in sides if s.is_agent
                and args.run_models}
        for i in range(args.stops):
            for s in sides:
                if i:
                    s.start()
                s.stops.append(s.stop())
        bare = sides[-1]
        print(f"idle workers on a redis-server each, {args.window:g} s counted; stops: SIGTERM just after a BRPOP "
              f"went out, {args.stops} each, a fresh worker each time, interleaved")
        for s in sides:
            print(f"  {s.name:14s} connections idle {len(s.idle_conns)} ({', '.join(s.idle_conns)}), after a task "
                  f"{len(s.after_task_conns)} ({', '.join(s.after_task_conns)})")
        for name, run in runs.items():
            print(f"  {name:14s} connections during a validation ({args.run_models}, time scale "
                  f"{args.time_scale:g}, {run[2]:.0f} s, sampled every 0.1 s): at most {run[0]} ({', '.join(run[1])})")
        for s in sides:
            cmds = ", ".join(f"{k} {v}" for k, v in sorted(s.by_command.items(), key=lambda kv: -kv[1]))
            print(f"  {s.name:14s} idle commands/s {s.cmds_per_s:5.2f} ({cmds}); ratio to bare "
                  f"{s.cmds_per_s / bare.cmds_per_s:4.2f}")
        for s in sides:
            print(f"  {s.name:14s} stop after SIGTERM: " + ", ".join(f"{t:.2f}" for t in s.stops)
                  + f" s (max {max(s.stops):.2f} s)")
        agent = sides[0]
        missed = [f"stop {max(agent.stops):.2f} s > {STOP_GOAL_S} s"] if max(agent.stops) > STOP_GOAL_S else []
        if agent.cmds_per_s > bare.cmds_per_s:
            missed.append(f"idle commands/s {agent.cmds_per_s:.2f} > bare {bare.cmds_per_s:.2f}")
        print("goals (agent stop <= 1.5 s, idle commands/s <= bare Celery's): " + ("; ".join(missed) or "met"))
        return 1 if missed else 0
    finally:
        for s in sides:
            if s.proc is not None:
                if s.is_agent:
                    stop_workers([s.proc], grace=5)
                elif s.proc.poll() is None:
                    os.killpg(s.proc.pid, signal.SIGKILL)
                    s.proc.wait(timeout=10)
            s.redis.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
