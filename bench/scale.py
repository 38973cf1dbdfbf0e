"""Fleet scale on Redis: N cheap simulated modules validate one release; what grows with N.

One redis-server (AOF everysec, as deployed). Modules are real ``fleet-agent`` workers running the
real release's scripts, made cheap (``simulator/cheap.py``: one profile per table, a few requests, time
scale 0.25: a run of ~190 s of simulated waiting around ~0.6 s of CPU, so that N of them side by side
measure the fleet, not this machine's CPU). Worker start-up is not in the wall.
Workers are started once, in batches, and kept: the run on N modules uses the first N, the others
stay idle (they still heartbeat). For each N, one validation through the controller's seam, as
``fleetctl validate`` drives it: ``Fleet.statuses`` + ``Fleet.dispatch``, then ``Fleet.sync`` every
0.5 s and the live view rendered (into a null console) after each pass. Measured per N:

- fan-out: dispatch start -> the last module started (its ``started_at``); dispatch CPU
- wall: dispatch start -> every module terminal, and wall(N)/wall(1)
- controller CPU: per sync pass (mean, sync + render), per pass per module, whole run per module
- history: SQLite rows changed per second of the run (``total_changes``), rows in the history
- module states (``Fleet.statuses``: what ``validate``, ``devices`` and every /metrics scrape of
  ``fleetctl serve`` compute) over a history holding ``--past-runs`` earlier runs of every module,
  with the ``module_runs (module, updated_at)`` index and, on a copy of the same history, without it
- Redis: commands/s during the run, idle commands/s per live module (heartbeats), used memory
  added by the run per module, peak used memory
- modules: CPU of one module's run (the worker + every process of the run, waited; the worker is one
  process since the agent runs Celery's solo pool, two with the earlier prefork pool), PSS of one worker

Exits 1 when wall(100)/wall(1) is above 1.05 (when N=1 and N=100 were both measured).

Usage: python bench/scale.py [--sizes 1,25,50,100] [--models qwen3] [--time-scale 0.25] [--telemetry-period 10]
       [--heartbeat 5] [--history-runs 0]
"""

from __future__ import annotations

import argparse
import io
import os
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import psutil  # noqa: E402
import record  # noqa: E402 - bench/record.py, this script's folder
import redis  # noqa: E402
from rich.console import Console  # noqa: E402

from agent.validate import stage_local_release  # noqa: E402
from contract.files import sha256_file  # noqa: E402
from controller.cli.demo import Worker, inventory_toml, start_worker, stop_workers, wait_for_heartbeats  # noqa: E402
from controller.cli.live import render  # noqa: E402
from controller.fleet import Fleet  # noqa: E402
from controller.history import History  # noqa: E402
from controller.inventory import load_inventory  # noqa: E402
from controller.settings import ControllerSettings  # noqa: E402
from simulator import build_release, make_models  # noqa: E402
from simulator.cheap import CHEAP_TELEMETRY_PERIOD, CHEAP_TIME_SCALE, cheap_module_env  # noqa: E402
from tests.support.redis_server import RedisServer  # noqa: E402


@dataclass
class Result:
    n: int
    wall: float
    fanout: float
    dispatch_cpu: float
    passes: int
    pass_cpu: float  # mean CPU of one sync pass + render, s
    run_cpu: float  # controller CPU of the whole run (dispatch + passes), s
    writes_per_s: float
    rows: int
    cmds_per_s: float
    idle_cmds_per_s_per_module: float
    mem_per_module: float  # bytes the run added to Redis, per module
    mem_peak: float
    mem_per_live_module: float  # Redis used memory above an empty server, per live module (after the run)
    clients_per_module: float  # Redis connections per live module
    module_cpu: float  # CPU of one module's run, s (mean)
    statuses_cpu: float  # Fleet.statuses over the N modules, s
    statuses_cpu_noindex: float  # the same without the module_runs index (as before it existed)
    worker_pss: float  # bytes (mean)
    load: float
    idle_worker_cpu: float  # CPU of one idle worker (its processes), s per s
    module_cpu_parts: tuple[float, ...]  # module_cpu as: worker, its running children (a prefork pool child), waited
    timeline: dict[str, list[float]]  # milestone -> s after dispatch, one value per module that reached it


def tree_cpu(pid: int) -> float:
    """CPU of a worker: its process, its running children, and every waited child of them (s)."""
    total = 0.0
    try:
        main = psutil.Process(pid)
        procs = [main, *main.children()]
    except psutil.Error:
        return 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            continue
    return total


def cpu_parts(pid: int) -> tuple[float, float, float]:
    """A worker's CPU in three parts (s): its process (the pipeline runs there: solo pool), its running children
    (a prefork pool child, in the agent before it ran solo), their waited children (the release's processes)."""
    try:
        main = psutil.Process(pid)
        procs = [main, *main.children()]
        times = [p.cpu_times() for p in procs]
    except psutil.Error:
        return 0.0, 0.0, 0.0
    return (times[0].user + times[0].system, sum(t.user + t.system for t in times[1:]),
            sum(t.children_user + t.children_system for t in times))


def worker_pss(pid: int) -> float:
    total = 0.0
    try:
        main = psutil.Process(pid)
        for p in (main, *main.children()):
            total += p.memory_full_info().pss
    except psutil.Error:
        pass
    return total


def redis_info(port: int) -> dict:
    with redis.Redis(port=port) as r:
        return {**r.info("stats"), **r.info("memory"), **r.info("clients")}


def start_batch(names: list[str], base: Path, settings: ControllerSettings, models: tuple[str, ...],
                env: dict[str, str], batch: int = 10) -> list[Worker]:
    """Start workers ``batch`` at a time, each batch up (first heartbeat) before the next: no start-up storm."""
    out: list[Worker] = []
    for i in range(0, len(names), batch):
        ws = []
        for name in names[i:i + batch]:
            make_models(base / "modules" / name / "models", keys=list(models))
            ws.append(start_worker(name, base, settings, sim_env=env))
        wait_for_heartbeats(settings, ws, 300)
        out += ws
    return out


def add_past_runs(history: History, names: list[str], runs: int) -> None:
    """``runs`` earlier finished runs of every module, as weeks of a lab's use leave them."""
    from contract.records import RunProgress, RunState

    now = time.time() - 86400
    with history.tx() as c:
        for k in range(runs):
            rid = f"past-{k:04d}"
            c.execute("INSERT OR IGNORE INTO runs (run_id, created_at, release, models, modules, state) "
                      "VALUES (?,?,?,?,?,?)", (rid, now + k, "1.4.0", '["qwen3"]', "[]", "done"))
            c.executemany(
                "INSERT OR REPLACE INTO module_runs (run_id, module, state, updated_at, progress) VALUES (?,?,?,?,?)",
                [(rid, m, "done", now + k, RunProgress(run_id=rid, module=m, release="1.4.0", state=RunState.DONE,
                                                       keys_total=1, keys_done=1, updated_at=now + k,
                                                       finished_at=now + k).model_dump_json()) for m in names])


def statuses_cpu(settings: ControllerSettings, mods: list, index: bool) -> float:
    """CPU of ``Fleet.statuses(mods)``; ``index=False``: on a copy of the history without the index."""
    import sqlite3

    path = settings.history_path
    if not index:
        copy = path.with_name("history-noindex.sqlite")
        copy.unlink(missing_ok=True)
        with sqlite3.connect(path) as src, sqlite3.connect(copy) as dst:
            src.backup(dst)
            dst.execute("DROP INDEX IF EXISTS module_runs_module")
        settings = settings.model_copy(update={"history": copy})
    history = History(settings.history_path)
    if not index:
        history.conn.execute("DROP INDEX IF EXISTS module_runs_module")  # History() creates it again
    fleet = Fleet(settings, history)
    try:
        c = time.process_time()
        fleet.statuses(mods)
        return time.process_time() - c
    finally:
        fleet.close()
        history.close()


MILESTONES = (
    ("received", "the worker took the run message (its log)"),
    ("started", "the pipeline began (progress started_at)"),
    ("unpacked", "unpack done"),
    ("precompile", "generate and environment done, precompile started"),
    ("compiled", "precompile done"),
    ("server up", "the server answered /health"),
    ("benchmarked", "the release's benchmark done"),
    ("last row", "the probe done: the key's rows final"),
    ("final", "the module's final state (finished_at)"),
    ("seen", "the controller's sync saw it"),
)
_EVENT_MILESTONES = {("unpack", "ok"): "unpacked", ("unpack", "skipped"): "unpacked",
                     ("precompile", "start"): "precompile", ("precompile", "ok"): "compiled",
                     ("precompile", "skipped"): "compiled", ("server", "ok"): "server up",
                     ("benchmark", "ok"): "benchmarked", ("probe", "ok"): "last row"}
_RECEIVED = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) INFO celery\.worker\.strategy: Task \S+\[([^\]]+)\] "
                       r"received")


def module_timeline(mod_dir: Path, run_id: str, t0: float, progress: Any, seen: float | None) -> dict[str, float]:
    """When one module reached each milestone of ``MILESTONES``, in s after ``t0`` (dispatch), from its own files:
    the worker's log, the run's ``events.jsonl``, and its final progress."""
    import json

    out: dict[str, float] = {}
    try:
        for line in (mod_dir / "worker.log").read_text(encoding="utf-8", errors="replace").splitlines():
            m = _RECEIVED.match(line)
            if m and run_id in m.group(3):
                stamp = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + int(m.group(2)) / 1000
                out.setdefault("received", stamp - t0)
    except OSError:
        pass
    if progress is not None and progress.started_at:
        out["started"] = progress.started_at - t0
    try:
        lines = (mod_dir / "work" / "runs" / run_id / "events.jsonl").read_text(encoding="utf-8").splitlines()
    except OSError:
        lines = []
    for line in lines:
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        name = _EVENT_MILESTONES.get((ev.get("step"), ev.get("status")))
        if name is not None:
            out.setdefault(name, float(ev["ts"]) - t0)
    if progress is not None and progress.finished_at:
        out["final"] = progress.finished_at - t0
    if seen is not None:
        out["seen"] = seen - t0
    return out


def timeline_table(results: list[Result]) -> str:
    """Milestones of every module's run, s after dispatch: N=1, then median / max over the N modules."""
    lines = ["| milestone (s after dispatch) | " + " | ".join(
        f"N={r.n}" if r.n == 1 else f"N={r.n} median / max" for r in results) + " |"]
    lines.append("|" + " --- |" * (len(results) + 1))
    for name, what in MILESTONES:
        cells = []
        for r in results:
            vals = sorted(r.timeline.get(name, []))
            if not vals:
                cells.append("-")
            elif r.n == 1:
                cells.append(f"{vals[0]:.2f}")
            else:
                cells.append(f"{statistics.median(vals):.2f} / {vals[-1]:.2f}")
        lines.append(f"| {name}: {what} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def measure(n: int, run_no: int, base: Path, settings: ControllerSettings, workers: list[Worker], port: int,
            release_path: Path, version: str, models: tuple[str, ...], alive: int, empty_mem: int) -> Result:
    history = History(settings.history_path)
    fleet = Fleet(settings, history)
    inv = load_inventory(settings.inventory)
    mods = [m for m in inv.modules if m.name in {w.name for w in workers[:n]}]
    sha = sha256_file(release_path)
    staged = stage_local_release(release_path, sha, settings.data_dir)
    console = Console(file=io.StringIO(), width=140, force_terminal=True)
    # idle Redis traffic: every live worker heartbeats (after the last ones started have settled)
    time.sleep(5.0)
    idle0 = sum(tree_cpu(w.proc.pid) for w in workers[:alive])
    i0, t0 = redis_info(port), time.monotonic()
    time.sleep(10.0)
    i1, t1 = redis_info(port), time.monotonic()
    idle_cpu = (sum(tree_cpu(w.proc.pid) for w in workers[:alive]) - idle0) / (t1 - t0) / alive
    idle = (i1["total_commands_processed"] - i0["total_commands_processed"]) / (t1 - t0) / alive
    cpu0 = {w.name: tree_cpu(w.proc.pid) for w in workers[:n]}
    parts0 = {w.name: cpu_parts(w.proc.pid) for w in workers[:n]}
    mem0 = i1["used_memory"]
    changes0 = history.conn.total_changes
    run_id = f"scale-{n}-{run_no}"
    load = os.getloadavg()[0]
    st_cpu, st_cpu_noindex = statuses_cpu(settings, mods, True), statuses_cpu(settings, mods, False)
    c0, w0 = time.process_time(), time.monotonic()
    fleet.dispatch(run_id=run_id, modules=mods, tarballs={m.name: str(staged) for m in mods}, sha256=sha,
                   release=version, models=models)
    dispatch_cpu = time.process_time() - c0
    pass_cpus: list[float] = []
    peak = mem0
    seen: dict[str, float] = {}
    while True:
        time.sleep(0.5)
        c = time.process_time()
        view = fleet.sync(run_id)
        console.print(render(view, title=f"run {run_id}"))
        console.file = io.StringIO()
        pass_cpus.append(time.process_time() - c)
        now = time.time()
        for m, p in view.progress.items():
            if p is not None and p.state.terminal and m not in seen:
                seen[m] = now
        if len(pass_cpus) % 4 == 0:
            peak = max(peak, redis_info(port)["used_memory"])
        if view.finished:
            break
        if time.monotonic() - w0 > 1800:
            raise SystemExit(f"run on {n} modules not finished after 30 min")
    wall = time.monotonic() - w0
    run_cpu = time.process_time() - c0
    i2 = redis_info(port)
    if view.state() != "done":
        bad = {m: (p.state.value, p.error.one_line() if p and p.error else "") for m, p in view.progress.items()
               if p is None or p.state.value != "done"}
        raise SystemExit(f"run on {n} modules ended {view.state()}: {list(bad.items())[:5]}")
    started = [p.started_at for p in view.progress.values() if p is not None and p.started_at]
    fanout = max(started) - history.run(run_id).created_at
    time.sleep(1.0)  # the workers' last waits reaped
    module_cpu = statistics.mean(tree_cpu(w.proc.pid) - cpu0[w.name] for w in workers[:n])
    parts = tuple(statistics.mean(cpu_parts(w.proc.pid)[i] - parts0[w.name][i] for w in workers[:n]) for i in range(3))
    pss = statistics.mean(worker_pss(w.proc.pid) for w in workers[:n])
    created = history.run(run_id).created_at
    marks = [module_timeline(base / "modules" / w.name, run_id, created, view.progress.get(w.name), seen.get(w.name))
             for w in workers[:n]]
    timeline = {name: [m[name] for m in marks if name in m] for name, _ in MILESTONES}
    res = Result(
        n=n, wall=wall, fanout=fanout, dispatch_cpu=dispatch_cpu, passes=len(pass_cpus),
        pass_cpu=statistics.mean(pass_cpus), run_cpu=run_cpu,
        writes_per_s=(history.conn.total_changes - changes0) / wall, rows=history.row_count(run_id),
        cmds_per_s=(i2["total_commands_processed"] - i1["total_commands_processed"]) / wall,
        idle_cmds_per_s_per_module=idle, mem_per_module=(i2["used_memory"] - mem0) / n,
        mem_peak=max(peak, i2["used_memory"]),
        mem_per_live_module=(i2["used_memory"] - empty_mem) / alive,
        clients_per_module=(i2["connected_clients"] - 1) / alive, module_cpu=module_cpu, statuses_cpu=st_cpu,
        statuses_cpu_noindex=st_cpu_noindex, worker_pss=pss, load=load, idle_worker_cpu=idle_cpu,
        module_cpu_parts=parts, timeline=timeline)
    fleet.close()
    history.close()
    return res


def redis_capacity(port: int) -> str:
    """What one redis-server takes on this machine: redis-benchmark's SET / GET / LPUSH requests per second."""
    import shutil
    import subprocess

    exe = shutil.which("redis-benchmark")
    if not exe:
        return "redis-benchmark not installed"
    out = subprocess.run([exe, "-p", str(port), "-q", "-n", "100000", "-c", "50", "-t", "set,get,lpush"],
                         capture_output=True, text=True, timeout=300).stdout
    figures = [line.split(" requests per second")[0].replace(":", "") for line in out.splitlines()
               if "requests per second" in line]
    return ", ".join(f.split("\r")[-1].strip() + " req/s" for f in figures)


def fake_modules(settings: ControllerSettings, names: list[str], run_id: str, release: str, go: Any,
                 done: Any) -> None:
    """Stand-in for N agents at the broker seam (a process of its own, so its CPU is not the controller's).

    Every module beats every ``heartbeat_interval``; once ``go`` is set, each takes its run message off
    its queue, reports benchmarking, then done with the seed's 11 qwen3 rows, through the agents' own
    ``KV`` records, as a real agent publishes them.
    """
    from contract.celery_app import make_app, queue_name
    from contract.kv import KV
    from contract.records import Heartbeat, KeyOutcome, RunProgress, RunState
    from controller.cli.demo import reference_rows

    app = make_app(settings)
    kv = KV(app)
    client = app.backend.client
    seed = [r for r in reference_rows() if r.model_key == "qwen3"]

    def beat(run: str | None) -> None:
        now = time.time()
        for m in names:
            kv.put_heartbeat(Heartbeat(module=m, agent_version="fake", ts=now, run_id=run))

    beat(None)
    last = time.monotonic()
    while not go.wait(0.2):
        if time.monotonic() - last >= settings.heartbeat_interval:
            beat(None)
            last = time.monotonic()
    for m in names:
        client.delete(queue_name(m))  # the run message, taken
        now = time.time()
        kv.put_progress(RunProgress(run_id=run_id, module=m, release=release, state=RunState.BENCHMARKING,
                                    step="benchmark", model_key="qwen3", keys_total=1, started_at=now,
                                    updated_at=now, progress=0.5))
    beat(run_id)
    time.sleep(2.0)
    for m in names:
        rows = [r.model_copy(update={"run_id": run_id, "module": m, "release": release}) for r in seed]
        kv.put_rows(run_id, m, rows)
        now = time.time()
        kv.put_progress(RunProgress(run_id=run_id, module=m, release=release, state=RunState.DONE, step="done",
                                    keys_total=1, keys_done=1, progress=1.0, started_at=now - 2, updated_at=now,
                                    finished_at=now, rows=len(rows), outcomes=(KeyOutcome(
                                        model_key="qwen3", status="passed", rows=len(rows)),)))
    beat(None)
    done.set()


def controller_only(sizes: list[int], base: Path, server: RedisServer, past_runs: int) -> str:
    """The controller and Redis at N beyond what real workers fit in: agents faked at the broker seam."""
    import multiprocessing

    lines = ["| N (fake agents) | dispatch CPU s | statuses ms (no index) | sync passes | CPU/pass ms | "
             "CPU/pass/module ms | controller CPU/module ms | history writes/s | rows | "
             "Redis KiB/module (data) | Redis cmds/s |"]
    lines.append("|" + " --- |" * (lines[0].count("|") - 1))
    ctx = multiprocessing.get_context("spawn")
    for k, n in enumerate(sizes):
        folder = base / f"fake-{n}"
        folder.mkdir(parents=True)
        names = [f"fake-{i + 1:05d}" for i in range(n)]
        (folder / "inventory.toml").write_text(inventory_toml(names, folder, None))
        settings = ControllerSettings(broker_url=f"redis://127.0.0.1:{server.port}/{1 + k % 15}",
                                      data_dir=folder / "fleet", inventory=folder / "inventory.toml",
                                      history=folder / "history.sqlite", heartbeat_interval=5.0, offline_after=30.0)
        history = History(settings.history_path)
        add_past_runs(history, names, past_runs)
        fleet = Fleet(settings, history)
        mods = list(load_inventory(settings.inventory).modules)
        go, done = ctx.Event(), ctx.Event()
        run_id = f"fake-{n}"
        proc = ctx.Process(target=fake_modules, args=(settings, names, run_id, "1.5.0", go, done))
        proc.start()
        from contract.kv import KV
        while any(hb is None for hb in KV(fleet.app).heartbeats(names[-1:]).values()):
            time.sleep(0.2)
        time.sleep(1.0)
        i0 = redis_info(server.port)
        st_cpu = statuses_cpu(settings, mods, True)
        st_noindex = statuses_cpu(settings, mods, False) if n <= 2000 else float("nan")  # quadratic: minutes
        c0, w0 = time.process_time(), time.monotonic()
        changes0 = history.conn.total_changes
        tarball = "/srv/SGLang-MUSA-M1000-M1000_1.5.0_sglang.tar.gz"
        fleet.dispatch(run_id=run_id, modules=mods, tarballs={m.name: tarball for m in mods},
                       sha256="0" * 64, release="1.5.0", models=("qwen3",))
        dispatch_cpu = time.process_time() - c0
        go.set()
        console = Console(file=io.StringIO(), width=140, force_terminal=True)
        pass_cpus = []
        while True:
            time.sleep(0.5)
            c = time.process_time()
            view = fleet.sync(run_id)
            console.print(render(view, title=f"run {run_id}"))
            console.file = io.StringIO()
            pass_cpus.append(time.process_time() - c)
            if view.finished:
                break
            if time.monotonic() - w0 > 180 or not proc.is_alive() and not done.is_set():
                raise SystemExit(f"fake run on {n} modules not finished (fake agents alive: {proc.is_alive()})")
        wall, run_cpu = time.monotonic() - w0, time.process_time() - c0
        i1 = redis_info(server.port)
        proc.join(timeout=30)
        with redis.Redis(port=server.port, db=1 + k % 15) as r:
            data = sum(r.memory_usage(key) or 0 for key in r.scan_iter(count=1000))
        if view.state() != "done":
            raise SystemExit(f"fake run on {n} modules ended {view.state()}: " + "; ".join(
                f"{m} {p.error.one_line() if p and p.error else p}" for m, p in list(view.progress.items())[:3]))
        lines.append(f"| {n} | {dispatch_cpu:.2f} | {st_cpu * 1e3:.0f} ({st_noindex * 1e3:.0f}) | {len(pass_cpus)} | "
                     f"{statistics.mean(pass_cpus) * 1e3:.0f} | {statistics.mean(pass_cpus) * 1e3 / n:.2f} | "
                     f"{run_cpu * 1e3 / n:.1f} | {(history.conn.total_changes - changes0) / wall:.0f} | "
                     f"{history.row_count(run_id)} | {data / n / 1024:.1f} | "
                     f"{(i1['total_commands_processed'] - i0['total_commands_processed']) / wall:.0f} |")
        print(lines[-1], file=sys.stderr, flush=True)
        fleet.close()
        history.close()
    return "\n".join(lines)


def table(results: list[Result]) -> str:
    one = next((r for r in results if r.n == 1), results[0])
    cores = os.cpu_count() or 1
    a = ["| N | wall s | wall(N)/wall(1) | modules' own CPU / cores, s | fan-out s | dispatch CPU ms | "
         "statuses ms (no index) | sync passes | CPU/pass ms | CPU/pass/module ms | controller CPU/module ms | "
         "history writes/s | rows |"]
    b = ["| N | Redis cmds/s (run) | idle cmds/s per module | Redis KiB added per module by the run | "
         "Redis KiB per live module | Redis clients per live module | Redis peak MiB | module CPU/run s | "
         "worker PSS MiB | load |"]
    for lines in (a, b):
        lines.append("|" + " --- |" * (lines[0].count("|") - 1))
    for r in results:
        a.append(f"| {r.n} | {r.wall:.1f} | {r.wall / one.wall:.2f} | {r.n * r.module_cpu / cores:.1f} | "
                 f"{r.fanout:.2f} | {r.dispatch_cpu * 1e3:.0f} | {r.statuses_cpu * 1e3:.0f} "
                 f"({r.statuses_cpu_noindex * 1e3:.0f}) | {r.passes} | {r.pass_cpu * 1e3:.1f} | "
                 f"{r.pass_cpu * 1e3 / r.n:.2f} | {r.run_cpu * 1e3 / r.n:.1f} | {r.writes_per_s:.0f} | {r.rows} |")
        b.append(f"| {r.n} | {r.cmds_per_s:.0f} | {r.idle_cmds_per_s_per_module:.2f} | "
                 f"{r.mem_per_module / 1024:.1f} | {r.mem_per_live_module / 1024:.1f} | {r.clients_per_module:.1f} | "
                 f"{r.mem_peak / 2**20:.1f} | {r.module_cpu:.2f} | "
                 f"{r.worker_pss / 2**20:.0f} | {r.load:.1f} |")
    return "\n".join(a) + "\n\n" + "\n".join(b)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1,25,50,100")
    ap.add_argument("--models", default="qwen3")
    ap.add_argument("--time-scale", type=float, default=CHEAP_TIME_SCALE)
    ap.add_argument("--telemetry-period", type=float, default=CHEAP_TELEMETRY_PERIOD,
                    help="the agents' device telemetry period, s (0: off)")
    ap.add_argument("--heartbeat", type=float, default=5.0, help="agent heartbeat interval, s (production: 5)")
    ap.add_argument("--fake", default="", help="also N agents faked at the broker seam, e.g. 1000,5000")
    ap.add_argument("--past-runs", type=int, default=20, help="earlier runs of every module in the history")
    ap.add_argument("--keep", help="keep everything in this folder (default: a temporary one, removed)")
    args = ap.parse_args()
    sizes = sorted(int(x) for x in args.sizes.split(","))
    models = tuple(args.models.split(","))
    tmp = tempfile.TemporaryDirectory(prefix="fleet-scale-") if not args.keep else None
    base = Path(args.keep or tmp.name)  # type: ignore[union-attr]
    server = RedisServer(base / "redis")
    server.start()
    empty_mem = redis_info(server.port)["used_memory"]
    workers: list[Worker] = []
    results: list[Result] = []
    try:
        settings = ControllerSettings(
            broker_url=server.url, data_dir=base / "fleet", inventory=base / "inventory.toml",
            history=base / "history.sqlite", heartbeat_interval=args.heartbeat,
            offline_after=max(30.0, 3 * args.heartbeat))
        names = [f"sim-{i + 1:03d}" for i in range(sizes[-1])]
        (base / "inventory.toml").write_text(inventory_toml(names, base, None))
        history = History(settings.history_path)
        add_past_runs(history, names, args.past_runs)
        history.close()
        env = cheap_module_env(args.time_scale, telemetry_period=args.telemetry_period)
        for k, n in enumerate(sizes):
            need = (n - len(workers)) * 100 * 2**20 + 4 * 2**30  # ~80 MiB PSS a worker, and room for the others
            if psutil.virtual_memory().available < need:
                print(f"N={n}: skipped, {psutil.virtual_memory().available / 2**30:.1f} GiB available and "
                      f"{n - len(workers)} more workers need ~{need / 2**30:.1f} GiB", file=sys.stderr, flush=True)
                break
            t = time.monotonic()
            workers += start_batch(names[len(workers):n], base, settings, models, env)
            print(f"N={n}: {len(workers)} workers up ({time.monotonic() - t:.0f} s to start the new ones); "
                  f"validating", file=sys.stderr, flush=True)
            # a new release per N: every module fetches, unpacks and precompiles it, as for a real new release
            rel = build_release(base / f"release-{k}", version=f"1.5.{k}", time_scale=args.time_scale, noise=0.0,
                                seed=1)
            r = measure(n, k, base, settings, workers, server.port, rel.path, rel.version, models, len(workers),
                        empty_mem)
            print(f"N={n}: wall {r.wall:.1f} s, fan-out {r.fanout:.2f} s, CPU/pass {r.pass_cpu * 1e3:.1f} ms, "
                  f"module CPU/run {r.module_cpu:.2f} s (worker {r.module_cpu_parts[0]:.2f}, pipeline "
                  f"{r.module_cpu_parts[1]:.2f}, release processes {r.module_cpu_parts[2]:.2f}), idle worker CPU "
                  f"{r.idle_worker_cpu * 100:.3f} % of a core, load {r.load:.1f}", file=sys.stderr, flush=True)
            results.append(r)
        stop_workers(workers, grace=20)
        workers = []
        fake = controller_only([int(x) for x in args.fake.split(",") if x], base, server, args.past_runs)
        capacity = redis_capacity(server.port)
        print(f"cheap modules (simulator/cheap.py, time scale {args.time_scale:g}, telemetry every "
              f"{args.telemetry_period:g} s), models {','.join(models)}, heartbeat {args.heartbeat:g} s, Redis "
              f"{server.url}; {os.cpu_count()} cores; load average now "
              f"{' / '.join(f'{x:.1f}' for x in os.getloadavg())} (1 / 5 / 15 min; other engineers' work included)")
        print(table(results))
        print(f"\nwhere the time goes: each module's milestones\n{timeline_table(results)}")
        print(budget(results))
        if args.fake:
            print(f"\nagents faked at the broker seam (heartbeats, progress, 11 rows each, through contract.kv; "
                  f"history with {args.past_runs} earlier runs of every module)\n{fake}")
        print(f"\nthis Redis on this machine (redis-benchmark, 50 clients, same server): {capacity}")
    finally:
        stop_workers(workers, grace=20)
        server.stop()
        if tmp is not None:
            tmp.cleanup()
    ratio = ratio_at(results, 100)
    if ratio is not None and ratio > GOAL:
        print(f"wall(100)/wall(1) = {ratio:.3f} > {GOAL}: goal not met", file=sys.stderr)
        raise SystemExit(1)


GOAL = 1.05  # wall(100)/wall(1), cheap modules


def ratio_at(results: list[Result], n: int) -> float | None:
    one = next((r for r in results if r.n == 1), None)
    at = next((r for r in results if r.n == n), None)
    return None if one is None or at is None else at.wall / one.wall


def budget(results: list[Result]) -> str:
    """What simulating N cheap modules costs this machine, next to the fleet's own part."""
    one = next((r for r in results if r.n == 1), results[0])
    cores = os.cpu_count() or 1
    cpu = statistics.mean(r.module_cpu for r in results)
    idle = statistics.mean(r.idle_worker_cpu for r in results)
    fit = int(0.25 * cores * one.wall / cpu)
    lines = [f"\nbudget: one cheap run = {cpu:.2f} s of CPU (mean over every N; worker and release "
             f"processes) in a {one.wall:.0f} s run; an idle worker {idle * 1e3:.2f} ms of CPU per s "
             f"({idle * 100:.3f} % of a core). On {cores} cores, N runs side by side take N x {cpu:.2f} s / "
             f"({cores} x {one.wall:.0f} s) of the machine: N <= {fit} keeps the simulated modules under 25 %."]
    for r in results:
        share = r.n * r.module_cpu / (cores * r.wall)
        lines.append(f"  N={r.n}: modules' CPU {r.n * r.module_cpu:.0f} s = {share:.0%} "
                     f"of {cores} cores x {r.wall:.0f} s; idle workers {r.n * r.idle_worker_cpu:.2f} cores; "
                     f"wall(N)/wall(1) {r.wall / one.wall:.3f}")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
