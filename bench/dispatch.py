"""Dispatch cost and fleet scaling, measured side by side in one run.

1. Dispatch latency, like for like (Redis): 200 no-op jobs through the fleet's own path (``Fleet.send``
   onto a module queue, consumed by a real ``fleet-agent`` worker: solo pool, late acks, prefetch 1) and 200
   through bare Celery (Celery's defaults, its Redis result backend, the same pool, concurrency and prefetch),
   both workers running on one Redis, interleaved job by job: enqueue -> task start against enqueue -> task
   start, send -> result against send -> result (goal: the fleet at most 1.2x bare Celery, p50).
   Priorities: the send before priorities ("unprioritised": kombu's first list, no headers) next to
   ``normal`` and ``low`` sends, interleaved job by job on one worker.
2. Fleet scaling: wall time of one validation (simulated release, demo time scale) on
   1 module and on 16 simulated modules, workers already running.

Usage: python bench/dispatch.py [--broker embedded|redis|both] [--jobs 200] [--modules 16]
       [--models all] [--time-scale 50] [--skip-scaling] [--skip-dispatch] [--skip-priorities] [--skip-secure]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from agent.validate import stage_local_release  # noqa: E402
from bench import record  # noqa: E402 - bench/record.py, this script's folder
from contract.celery_app import NOOP_TASK  # noqa: E402
from controller.cli.demo import inventory_toml, start_worker, stop_workers, wait_for_heartbeats  # noqa: E402
from controller.fleet import Fleet  # noqa: E402
from controller.history import History  # noqa: E402
from controller.settings import ControllerSettings  # noqa: E402


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


BARE_APP = textwrap.dedent("""
    import os, time
    from celery import Celery
    app = Celery("bare", broker=os.environ["BARE_BROKER"], backend=os.environ["BARE_BROKER"])
    @app.task(name="bare.noop")
    def noop(sent_at):
        return {"sent_at": sent_at, "started_at": time.time()}
""")


@contextlib.contextmanager
def bare_worker(base: Path, broker_url: str) -> Iterator[Any]:
    """A bare Celery worker and client on ``broker_url``: Celery's defaults (its Redis result backend on the same
    server), with the agent's pool, concurrency and prefetch (solo, 1, 1) so that only the fleet's own path
    differs. Yields the client app."""
    from celery import Celery

    (base / "bare").mkdir(parents=True, exist_ok=True)
    (base / "bare" / "bare_app.py").write_text(BARE_APP)
    env = dict(os.environ, PYTHONPATH=str(base / "bare"), BARE_BROKER=broker_url)
    log = (base / "bare" / "worker.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "celery", "-A", "bare_app", "worker", "-Q", "bare", "-P", "solo",
                             "-c", "1", "--prefetch-multiplier", "1", "-l", "WARNING"],
                            env=env, cwd=base / "bare", stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    client = Celery("bare", broker=broker_url, backend=broker_url)
    try:
        client.send_task("bare.noop", args=[time.time()], queue="bare").get(timeout=60)  # warm up
        yield client
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=20)
        log.close()


@dataclass
class Arm:
    """One side's samples, s: enqueue -> task start (one way) and send -> result (round trip)."""

    one_way: list[float] = field(default_factory=list)
    round_trip: list[float] = field(default_factory=list)

    def time(self, send: Callable[[float], Any]) -> None:
        t0 = time.perf_counter()
        sent = time.time()
        res = send(sent).get(timeout=30, interval=0.005)
        self.round_trip.append(time.perf_counter() - t0)
        self.one_way.append(res["started_at"] - sent)


def like_for_like(base: Path, settings: ControllerSettings, jobs: int, seed: int = 1) -> tuple[Arm, Arm]:
    """The fleet's path (``Fleet.send`` onto a module queue, a real ``fleet-agent`` worker) and bare Celery
    (:func:`bare_worker`), both running on one broker, interleaved job by job in a random order per pair (the
    machine's noise falls on both alike): (fleet, bare)."""
    import random
    import uuid

    base.mkdir(parents=True, exist_ok=True)
    (base / "inventory.toml").write_text(inventory_toml(["bench-01"], base, None))
    w = start_worker("bench-01", base, settings, sim_env={})
    try:
        wait_for_heartbeats(settings, [w], 60)
        fleet = Fleet(settings, History(base / "history.sqlite"))
        app = fleet.app

        def fleet_send(sent: float) -> Any:
            # ids end in the module's name, as runs do (its ACL user's results)
            return app.AsyncResult(fleet.send("bench-01", NOOP_TASK, [sent], task_id=f"bench-01:{uuid.uuid4()}"))

        with bare_worker(base, str(app.conf.broker_url)) as bare_app:
            def bare_send(sent: float) -> Any:
                return bare_app.send_task("bare.noop", args=[sent], queue="bare")

            fleet_send(time.time()).get(timeout=60)  # warm up
            ours, bare = Arm(), Arm()
            rng = random.Random(seed)
            for _ in range(jobs):
                pair = [(ours, fleet_send), (bare, bare_send)]
                rng.shuffle(pair)
                for arm, send in pair:
                    arm.time(send)
            return ours, bare
    finally:
        stop_workers([w], grace=10)


def fleet_dispatch(base: Path, settings: ControllerSettings, jobs: int,
                   worker_env: dict[str, str] | None = None) -> tuple[list[float], list[float]]:
    """Enqueue -> start on the agent, and full round trips, through the fleet's path."""
    arms = fleet_dispatch_arms(base, settings, jobs, ("normal",), worker_env)
    return arms["normal"]


def fleet_dispatch_arms(base: Path, settings: ControllerSettings, jobs: int, arms: tuple[str, ...],
                        worker_env: dict[str, str] | None = None) -> dict[str, tuple[list[float], list[float]]]:
    """:func:`fleet_dispatch` for several ways of sending, interleaved job by job on one worker (the machine's
    noise falls on every arm alike): a priority name (``Fleet.send(priority=...)``), or ``unprioritised``:
    the send before priorities (no priority property, no headers: kombu's first list)."""
    import uuid

    from contract.celery_app import queue_name
    from controller.fleet.dispatch import args_label

    base.mkdir(parents=True, exist_ok=True)
    (base / "inventory.toml").write_text(inventory_toml(["bench-01"], base, None))
    w = start_worker("bench-01", base, settings, sim_env=worker_env or {})
    try:
        wait_for_heartbeats(settings, [w], 60)
        fleet = Fleet(settings, History(base / "history.sqlite"))
        app = fleet.app

        def send(arm: str, args: list[object]) -> str:
            tid = f"bench-01:{uuid.uuid4()}"  # ids end in the module's name, as runs do (its ACL user's results)
            if arm != "unprioritised":
                return fleet.send("bench-01", NOOP_TASK, args, task_id=tid, priority=arm)
            return str(app.send_task(NOOP_TASK, args=args, queue=queue_name("bench-01"), task_id=tid,
                                     argsrepr=args_label(args), kwargsrepr="{}").id)

        for arm in arms:  # warm up
            app.AsyncResult(send(arm, [time.time()])).get(timeout=60)
        out: dict[str, tuple[list[float], list[float]]] = {a: ([], []) for a in arms}
        for i in range(jobs * len(arms)):
            arm = arms[i % len(arms)]
            t0 = time.perf_counter()
            sent = time.time()
            res = app.AsyncResult(send(arm, [sent])).get(timeout=30, interval=0.005)
            out[arm][1].append(time.perf_counter() - t0)
            out[arm][0].append(res["started_at"] - sent)
        return out
    finally:
        stop_workers([w], grace=10)


def scaling(base: Path, settings: ControllerSettings, n: int, models: tuple[str, ...], scale: float) -> float:
    from contract.files import sha256_file
    from controller.service import Session
    from simulator import build_release, make_models

    rel = build_release(base / "release", time_scale=scale, noise=0.0, seed=1)
    names = [f"sim-{i + 1:02d}" for i in range(n)]
    base.mkdir(parents=True, exist_ok=True)
    (base / "inventory.toml").write_text(inventory_toml(names, base, None))
    workers = []
    try:
        for name in names:
            make_models(base / "modules" / name / "models")
            workers.append(start_worker(name, base, settings, sim_env={}))
        wait_for_heartbeats(settings, workers, 120)
        st = Session(settings)
        fleet = st.fleet()
        st.history()
        mods = st.inventory().select("all")
        sha = sha256_file(rel.path)
        staged = stage_local_release(rel.path, sha, settings.data_dir)
        t0 = time.perf_counter()
        fleet.dispatch(run_id=f"scale-{n}", modules=mods, tarballs={m.name: str(staged) for m in mods},
                       sha256=sha, release=rel.version, models=models)
        view = fleet.wait(f"scale-{n}", interval=0.25, timeout=900)
        wall = time.perf_counter() - t0
        if view.state() != "done":
            raise SystemExit(f"scaling run on {n} modules ended {view.state()}")
        st.close()
        return wall
    finally:
        stop_workers(workers, grace=10)


def secure_dispatch(base: Path, jobs: int) -> tuple[list[float], list[float]]:
    """The same dispatch over redis-server with TLS (client certificates) and one ACL user per module."""
    from controller.remote.acl import CONTROLLER_USER, write_acl
    from tests.support.secure import SecureRedis, broker_env, make_tls

    tls = make_tls(base / "tls")
    files = write_acl(base / "acl", ["bench-01"])
    server = SecureRedis(base / "redis", aclfile=files.acl, tls=tls)
    server.start()
    try:
        pw = files.passwords
        settings = ControllerSettings(
            broker_url=server.url(CONTROLLER_USER), broker_password_file=pw / f"{CONTROLLER_USER}.password",
            broker_tls_ca_file=tls["ca"], broker_tls_cert_file=tls["client_cert"],
            broker_tls_key_file=tls["client_key"], data_dir=base / "fleet", inventory=base / "inventory.toml",
            history=base / "history.sqlite", heartbeat_interval=1.0, offline_after=30.0)
        env = broker_env(server.url("bench-01"), pw / "bench-01.password", tls)
        return fleet_dispatch(base, settings, jobs, worker_env=env)
    finally:
        server.stop()


def settings_for(base: Path, broker: str, redis_url: str | None) -> ControllerSettings:
    url = "filesystem://"
    if broker == "redis":
        assert redis_url is not None, "the redis broker without a redis-server"
        url = redis_url
    return ControllerSettings(broker_url=url, data_dir=base / "fleet",
                              inventory=base / "inventory.toml", history=base / "history.sqlite",
                              heartbeat_interval=1.0, offline_after=30.0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--broker", default="both", choices=["embedded", "redis", "both"])
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--modules", type=int, default=16)
    ap.add_argument("--models", default="all")
    ap.add_argument("--time-scale", type=float, default=50.0)
    ap.add_argument("--skip-scaling", action="store_true")
    ap.add_argument("--skip-dispatch", action="store_true")
    ap.add_argument("--skip-priorities", action="store_true", help="no priority arms")
    ap.add_argument("--skip-secure", action="store_true", help="no ACL + TLS row next to plain Redis")
    args = ap.parse_args()
    from contract.records import parse_model_keys

    models = parse_model_keys(args.models)
    brokers = ["embedded", "redis"] if args.broker == "both" else [args.broker]
    redis = None
    tmp = Path(tempfile.mkdtemp(prefix="bench-dispatch-"))
    try:
        if "redis" in brokers:
            if not shutil.which("redis-server"):
                print("redis-server not installed: skipping the redis broker")
                brokers.remove("redis")
            else:
                from tests.support.redis_server import RedisServer

                redis = RedisServer(tmp / "redis")
                redis.start()
        if not args.skip_dispatch:
            print(f"dispatch latency, {args.jobs} no-op jobs each side, one worker each (solo pool, concurrency 1, "
                  "prefetch 1), interleaved job by job on one broker")
        for b in [] if args.skip_dispatch else brokers:
            s = settings_for(tmp / f"d-{b}", b, redis.url if redis else None)
            if b == "redis":
                ours, bare = like_for_like(tmp / f"d-{b}", s, args.jobs)
                for what, f, c in (("enqueue->start", ours.one_way, bare.one_way),
                                   ("round trip    ", ours.round_trip, bare.round_trip)):
                    print(f"  {b:8s} {what} fleet p50 {pct(f, 0.5) * 1e3:6.2f} ms p99 {pct(f, 0.99) * 1e3:6.2f} ms"
                          f" | bare Celery p50 {pct(c, 0.5) * 1e3:6.2f} ms p99 {pct(c, 0.99) * 1e3:6.2f} ms"
                          f" | ratio p50 {pct(f, 0.5) / pct(c, 0.5):4.2f} (goal <= 1.2)")
                p50, trips = pct(ours.one_way, 0.5), ours.round_trip
            if not args.skip_priorities:
                arms = fleet_dispatch_arms(tmp / f"p-{b}", s, args.jobs, ("unprioritised", "normal", "low"))
                u50 = pct(arms["unprioritised"][0], 0.5)
                print(f"  {b:8s} priorities, interleaved: enqueue->start p50 "
                      + ", ".join(f"{a} {pct(st, 0.5) * 1e3:6.2f} ms (p99 {pct(st, 0.99) * 1e3:6.2f})"
                                  for a, (st, _) in arms.items())
                      + f" | ratio p50 normal/unprioritised {pct(arms['normal'][0], 0.5) / u50:4.2f}, "
                      f"low/unprioritised {pct(arms['low'][0], 0.5) / u50:4.2f}")
            if b == "redis" and not args.skip_secure:
                sstarts, strips = secure_dispatch(tmp / "d-secure", args.jobs)
                s50, s99 = pct(sstarts, 0.5), pct(sstarts, 0.99)
                print(f"  {'acl+tls':8s} fleet enqueue->start p50 {s50 * 1e3:7.2f} ms  p99 {s99 * 1e3:7.2f} ms | "
                      f"fleet round trip p50 {statistics.median(strips) * 1e3:7.2f} ms "
                      f"(plain Redis {statistics.median(trips) * 1e3:7.2f} ms) | "
                      f"ratio p50 vs plain Redis {s50 / p50:4.2f}")
        if not args.skip_scaling:
            b = brokers[-1] if "redis" in brokers else "embedded"
            s1 = settings_for(tmp / "s1", b, redis.url if redis else None)
            w1 = scaling(tmp / "s1", s1, 1, models, args.time_scale)
            sn = settings_for(tmp / f"s{args.modules}", b, redis.url if redis else None)
            wn = scaling(tmp / f"s{args.modules}", sn, args.modules, models, args.time_scale)
            print(f"fleet scaling ({b} broker, {len(models)} model keys, time scale {args.time_scale:g}): "
                  f"1 module {w1:6.1f} s, {args.modules} modules {wn:6.1f} s, ratio {wn / w1:4.2f}")
    finally:
        if redis:
            redis.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
