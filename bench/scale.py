"""Fleet scale: the controller and the broker at 1,000 and 10,000 modules (issue 47), not the modules' waiting.

Default (``--modules 1000,10000``):

1. **A real idle agent first.** One real ``fleet-agent`` (Celery's solo worker, the simulator's module) on a
   redis-server with the shipped ``deploy/redis/redis.conf.example``: the TCP connections its process holds to
   Redis (psutil) and the commands Redis takes from it idle over 20 s (INFO commandstats). Measured here: 3
   connections (kombu's consumer in ``BRPOP`` with a 5 s timeout, the result backend / ``contract.kv`` client
   writing heartbeat and lease every 5 s, kombu's restore channel idle), 0.60 commands/s.
2. **Per N, a fresh redis-server on the shipped configuration** (its port and folder set, its ``aclfile`` line
   dropped: no ACL file on this machine; ``maxclients`` as shipped unless ``--maxclients``). This bench raises its
   own open-file limit to the hard limit (``ulimit -n`` to what the machine allows; redis-server and the fake agents
   inherit it); the table names the limit Redis got and its effective ``maxclients``.
3. **N fake agents, each on connections of its own** (``bench/fake_agents.py``: asyncio processes of at most 12,000
   connections, as many connections per module as the real agent held, or ``--conns``), sending the real idle
   agent's commands; what they do and do not do is in that file. Idle for ``--idle`` s: Redis connections, memory,
   commands/s and CPU (INFO deltas).
4. **The controller, in this process, as ``fleetctl validate`` drives it:** ``Fleet.statuses`` (module states:
   ``validate``, ``devices``, each ``/metrics`` scrape), ``Fleet.dispatch`` of one validation to all N, then
   ``Fleet.sync`` every 0.5 s and the live view rendered into a null console after each pass, until every module
   ended: CPU per sync pass (and per module), the view's refresh (CPU and wall), dispatch CPU and wall, fan-out
   (dispatch start -> each fake took its message), Redis commands/s and CPU during the run, rows in the history.

Every figure is printed side by side per N in one table; ``record.py`` keeps the raw output in ``bench/results/``.
The default run took 2.6 min here (2 cores, load 6-8), `--modules 10000 --conns 1 --maxclients 12000` 4.2 min.

``--real`` runs the earlier bench instead: real cheap ``fleet-agent`` workers (``--sizes 1,25,50,100``), one
validation each, wall(N)/wall(1) (goal 1.05), milestones per module; its wall time is ~99.6 % the simulated
modules' sleep, so it measures the fleet's overhead on a validation, not the controller or the broker.

Usage: python bench/scale.py [--modules 1000,10000] [--conns K] [--maxclients M] [--idle 20] [--hold 5]
       python bench/scale.py --real [--sizes 1,25,50,100] [--models qwen3] [--time-scale 0.25] [--heartbeat 5]
"""

from __future__ import annotations

import argparse
import collections
import gc
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
import redis  # noqa: E402
from rich.console import Console  # noqa: E402

from agent.validate import stage_local_release  # noqa: E402
from bench import record  # noqa: E402 - bench/record.py (importable from the tests too)
from contract.files import sha256_file  # noqa: E402
from contract.settings import RESULT_EXPIRES  # noqa: E402
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
    assert isinstance(path, Path), "the bench's history is a SQLite file"
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
        bad = {m: (p.state.value if p else "no progress", p.error.one_line() if p and p.error else "")
               for m, p in view.progress.items() if p is None or p.state.value != "done"}
        raise SystemExit(f"run on {n} modules ended {view.state()}: {list(bad.items())[:5]}")
    started = [p.started_at for p in view.progress.values() if p is not None and p.started_at]
    info = history.run(run_id)
    assert info is not None, f"run {run_id} not in the history"
    fanout = max(started) - info.created_at
    time.sleep(1.0)  # the workers' last waits reaped
    module_cpu = statistics.mean(tree_cpu(w.proc.pid) - cpu0[w.name] for w in workers[:n])
    parts = tuple(statistics.mean(cpu_parts(w.proc.pid)[i] - parts0[w.name][i] for w in workers[:n]) for i in range(3))
    pss = statistics.mean(worker_pss(w.proc.pid) for w in workers[:n])
    created = info.created_at
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


# ------------------------------------------------------------------ the controller and the broker (issue 47)
SHIPPED_CONF = ROOT / "deploy" / "redis" / "redis.conf.example"


@dataclass
class Broker:
    """A redis-server on the shipped configuration, as this machine can run it."""

    proc: Any
    port: int
    conf: str  # what was changed from the shipped file, in words

    def info(self, section: str = "everything") -> dict:
        with redis.Redis(port=self.port) as r:
            return r.info(section)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=30)


def start_broker(folder: Path, maxclients: int | None) -> Broker:
    """``deploy/redis/redis.conf.example`` with this machine's port and folder; its ``aclfile`` line dropped (no ACL
    file here: every client is the default user) and ``bind``/``protected-mode`` kept; ``maxclients`` as the
    file sets it (Redis's default 10000 where it sets none) unless ``maxclients`` overrides it."""
    import shutil
    import subprocess

    from simulator.ports import free_port

    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    changed = [f"port {port}", f"dir {folder}", "aclfile dropped"]
    lines = []
    for line in SHIPPED_CONF.read_text().splitlines():
        word = line.split(maxsplit=1)[0] if line.strip() and not line.lstrip().startswith("#") else ""
        if word == "port":
            line = f"port {port}"
        elif word == "dir":
            line = f"dir {folder}"
        elif word == "aclfile" or word == "maxclients" and maxclients is not None:
            continue
        lines.append(line)
    if maxclients is not None:
        lines.append(f"maxclients {maxclients}")
        changed.append(f"maxclients {maxclients}")
    conf = folder / "redis.conf"
    conf.write_text("\n".join(lines) + "\n")
    exe = shutil.which("redis-server")
    if not exe:
        raise SystemExit("redis-server not installed (apt-get install redis-server)")
    proc = subprocess.Popen([exe, str(conf)], stdout=(folder / "redis.log").open("wb"), stderr=subprocess.STDOUT)
    end = time.monotonic() + 20
    while True:
        try:
            with redis.Redis(port=port) as r:
                r.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > end or proc.poll() is not None:
                raise SystemExit(f"redis-server did not start: {(folder / 'redis.log').read_text()[-500:]}") from None
            time.sleep(0.1)
    return Broker(proc, port, ", ".join(changed))


def fd_limit(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    return -1


def commands(i0: dict, i1: dict) -> dict[str, int]:
    """Calls per command between two INFO commandstats."""
    out = {k.removeprefix("cmdstat_"): v["calls"] - i0.get(k, {"calls": 0})["calls"]
           for k, v in i1.items() if k.startswith("cmdstat_")}
    return {k: v for k, v in sorted(out.items(), key=lambda kv: -kv[1]) if v > 0}


def top(cmds: dict[str, int], seconds: float, k: int = 5) -> str:
    return ", ".join(f"{c} {n / seconds:.1f}" for c, n in list(cmds.items())[:k])


def real_agent(base: Path) -> dict[str, Any]:
    """One real idle ``fleet-agent`` (the simulator's module) on the shipped configuration: the TCP connections its
    process holds to Redis (psutil, once it beat), and the commands Redis took from it over 20 s (INFO
    commandstats; nothing else talks to this server then but one INFO connection of this bench)."""
    from simulator.cheap import cheap_module_env

    broker = start_broker(base / "redis-real", None)
    try:
        settings = ControllerSettings(broker_url=f"redis://127.0.0.1:{broker.port}/0", data_dir=base / "fleet-real",
                                      inventory=base / "inventory-real.toml", history=base / "real.sqlite")
        make_models(base / "modules" / "real-01" / "models", keys=["qwen3"])
        w = start_worker("real-01", base, settings, sim_env=cheap_module_env(CHEAP_TIME_SCALE))
        try:
            wait_for_heartbeats(settings, [w], 120)
            time.sleep(6.0)  # start-up done (its first beats, kombu's restore)
            conns = [c for c in psutil.Process(w.proc.pid).net_connections(kind="tcp")
                     if c.raddr and c.raddr.port == broker.port]
            with redis.Redis(port=broker.port) as r:
                i0, t0 = r.info("commandstats"), time.monotonic()
                time.sleep(20.0)
                i1, t1 = r.info("commandstats"), time.monotonic()
            polling = brpop_timeout(broker.port, 12.0)
        finally:
            stop_workers([w], grace=20)
        got = commands(i0, i1)
        got.pop("info", None)  # this bench's own
        return {"conns": len(conns), "cmds_per_s": sum(got.values()) / (t1 - t0), "commands": top(got, t1 - t0, 8),
                "polling": polling}
    finally:
        broker.stop()


def brpop_timeout(port: int, within: float) -> float:
    """The timeout of the idle agent's ``BRPOP`` (kombu's ``polling_interval``), read off MONITOR; 5 s (kombu's
    default) when none came ``within`` s."""
    end = time.monotonic() + within
    with redis.Redis(port=port, socket_timeout=within) as r, r.monitor() as m:
        while time.monotonic() < end:
            try:
                got = m.next_command()
            except redis.TimeoutError:
                break
            words = got["command"].split(" ")
            if words[0].upper() == "BRPOP":
                return float(words[-1])
    return 5.0


def start_fakes(folder: Path, names: list[str], conns: int, port: int, run_id: str, hold: float,
                settings: ControllerSettings, polling: float = 5.0) -> list[tuple[Any, Path]]:
    """Fake agents (``bench/fake_agents.py``), in processes of at most 12,000 connections each."""
    import json
    import subprocess

    from contract.records import Heartbeat, KeyOutcome, RunProgress, RunState
    from controller.cli.demo import reference_rows

    rows = [r.model_copy(update={"run_id": run_id, "release": "1.5.0"}).model_dump(mode="json")
            for r in reference_rows() if r.model_key == "qwen3"]
    base = {"host": "127.0.0.1", "port": port, "conns": conns, "heartbeat": settings.heartbeat_interval,
            "polling": polling, "hold": hold, "run_id": run_id, "expires": int(RESULT_EXPIRES), "rows": rows,
            "hb": Heartbeat(module="x", agent_version="0.1.0", ts=0.0, free_disk_bytes=75 * 2**30).model_dump(
                mode="json"),
            "lease": {"host": "fake", "pid": 1, "created": time.time(), "workdir": "/srv/m1000-fleet/work"},
            "progress_benchmarking": RunProgress(
                run_id=run_id, module="x", release="1.5.0", state=RunState.BENCHMARKING, step="benchmark",
                model_key="qwen3", keys_total=1, progress=0.5).model_dump(mode="json", exclude={"telemetry"}),
            "progress_done": RunProgress(
                run_id=run_id, module="x", release="1.5.0", state=RunState.DONE, step="done", keys_total=1,
                keys_done=1, progress=1.0, rows=len(rows),
                outcomes=(KeyOutcome(model_key="qwen3", status="passed", rows=len(rows)),)).model_dump(
                mode="json", exclude={"telemetry"})}
    per = max(1, 12000 // conns)
    procs = []
    for i in range(0, len(names), per):
        spec = folder / f"fake-{i}.json"
        spec.write_text(json.dumps({**base, "names": names[i:i + per], "out": str(folder / f"fake-{i}.out.json")}))
        proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "fake_agents.py"), str(spec)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        procs.append((proc, folder / f"fake-{i}.out.json"))
    return procs


def broker_run(n: int, base: Path, args: argparse.Namespace, conns: int, polling: float) -> dict[str, Any]:
    """One validation of ``n`` fake agents through the controller's seam on a fresh redis-server (the shipped
    configuration): what the idle fleet holds and sends, then dispatch, the sync passes and the live view."""
    import json

    folder = base / f"n{n}"
    folder.mkdir(parents=True)
    broker = start_broker(folder / "redis", args.maxclients)
    procs: list[tuple[Any, Path]] = []
    out: dict[str, Any] = {"n": n, "conns": conns, "redis_conf": broker.conf}
    try:
        with redis.Redis(port=broker.port) as r:
            out["maxclients"] = int(r.config_get("maxclients")["maxclients"])
        out["redis_fd_limit"] = fd_limit(broker.proc.pid)
        empty = broker.info()
        names = [f"fake-{i + 1:05d}" for i in range(n)]
        (folder / "inventory.toml").write_text(inventory_toml(names, folder, None))
        settings = ControllerSettings(broker_url=f"redis://127.0.0.1:{broker.port}/0", data_dir=folder / "fleet",
                                      inventory=folder / "inventory.toml", history=folder / "history.sqlite",
                                      heartbeat_interval=5.0, offline_after=30.0)
        run_id = f"scale-{n}"
        t = time.monotonic()
        procs = start_fakes(folder, names, conns, broker.port, run_id, args.hold, settings, polling)
        opened = refused = 0
        whys = set()
        for proc, _ in procs:
            line = proc.stdout.readline()
            if not line:
                raise SystemExit(f"a fake agent process exited ({proc.poll()})")
            doc = json.loads(line)
            opened, refused = opened + doc["open"], refused + doc["refused"]
            if doc["why"]:
                whys.add(doc["why"])
        out.update(opened=opened, refused=refused, refused_why="; ".join(sorted(whys))[:200],
                   connect_s=time.monotonic() - t)
        print(f"N={n}: {opened} connections open, {refused} refused ({out['refused_why']}), "
              f"{out['connect_s']:.1f} s", file=sys.stderr, flush=True)
        time.sleep(6.0)  # every fake beat once, its first BRPOP waiting
        # idle: what the idle fleet holds and sends
        i0, t0 = broker.info(), time.monotonic()
        time.sleep(args.idle)
        i1, t1 = broker.info(), time.monotonic()
        idle_cmds = commands(i0, i1)
        for own in ("info", "hello", "ping"):  # this bench's INFO connection (the fakes' PINGs were at connect)
            idle_cmds.pop(own, None)
        out.update(clients=i1["connected_clients"] - 1, rejected=i1["rejected_connections"],
                   mem=i1["used_memory"] - empty["used_memory"], mem_clients=i1.get("mem_clients_normal", 0),
                   rss=i1["used_memory_rss"], idle_cmds_per_s=sum(idle_cmds.values()) / (t1 - t0),
                   idle_top=top(idle_cmds, t1 - t0),
                   idle_redis_cpu=(i1["used_cpu_sys"] + i1["used_cpu_user"] - i0["used_cpu_sys"]
                                   - i0["used_cpu_user"]) / (t1 - t0))
        # the controller: module states, dispatch, sync passes and the live view, in this process
        history = History(settings.history_path)
        add_past_runs(history, names, args.past_runs)
        fleet = Fleet(settings, history)
        mods = list(load_inventory(settings.inventory).modules)
        c = time.process_time()
        states = fleet.statuses(mods)
        out["statuses_cpu"] = time.process_time() - c
        out["states"] = dict(collections.Counter(st.state for st in states.values()))
        i0 = broker.info()
        w0, c0 = time.time(), time.process_time()
        fleet.dispatch(run_id=run_id, modules=mods, tarballs={m.name: "/srv/SGLang-MUSA-M1000-M1000_1.5.0_sglang.tar.gz"
                                                              for m in mods},
                       sha256="0" * 64, release="1.5.0", models=("qwen3",))
        out["dispatch_cpu"], out["dispatch_wall"] = time.process_time() - c0, time.time() - w0
        console = Console(file=io.StringIO(), width=160, force_terminal=True)
        sync_cpu, view_cpu, view_wall = [], [], []
        gc_spent = [0.0, 0.0]  # total in collections, start of the one in progress

        def on_gc(phase: str, info: dict[str, Any]) -> None:
            if phase == "start":
                gc_spent[1] = time.process_time()
            else:
                gc_spent[0] += time.process_time() - gc_spent[1]

        gc.callbacks.append(on_gc)
        gc.freeze()  # as fleetctl validate/watch do before following a run (controller.cli.live.follow)
        gc_in_pass: list[float] = []
        while True:
            time.sleep(0.5)
            c, g = time.process_time(), gc_spent[0]
            view = fleet.sync(run_id)
            c2, w2 = time.process_time(), time.perf_counter()
            gc_in_pass.append(gc_spent[0] - g)
            console.print(render(view, title=f"run {run_id}"))
            console.file = io.StringIO()
            sync_cpu.append(c2 - c)
            view_cpu.append(time.process_time() - c2)
            view_wall.append(time.perf_counter() - w2)
            if view.finished or time.time() - w0 > args.timeout:
                break
        wall = time.time() - w0
        run_cpu = time.process_time() - c0
        gc.callbacks.remove(on_gc)
        print(f"N={n}: sync passes CPU ms, in order: " + " ".join(f"{t * 1e3:.0f}" for t in sync_cpu), flush=True)
        print(f"N={n}: of it in Python's garbage collector: " + " ".join(f"{t * 1e3:.0f}" for t in gc_in_pass),
              flush=True)
        i1 = broker.info()
        run_cmds = commands(i0, i1)
        run_cmds.pop("info", None)
        out.update(run_wall=wall, run_cpu=run_cpu, passes=len(sync_cpu), sync_cpu=statistics.mean(sync_cpu),
                   sync_cpu_max=max(sync_cpu), view_cpu=statistics.mean(view_cpu), view_wall=statistics.mean(view_wall),
                   state=view.state() if view.finished else f"not finished in {args.timeout:.0f} s",
                   done=sum(1 for p in view.progress.values() if p is not None and p.state.value == "done"),
                   run_cmds_per_s=sum(run_cmds.values()) / wall, run_top=top(run_cmds, wall),
                   run_redis_cpu=(i1["used_cpu_sys"] + i1["used_cpu_user"] - i0["used_cpu_sys"]
                                  - i0["used_cpu_user"]) / wall, peak_mem=i1["used_memory_peak"] - empty["used_memory"],
                   rows=history.row_count(run_id))
        fleet.close()
        history.close()
        for proc, _ in procs:
            proc.stdin.write("stop\n")
            proc.stdin.flush()
        received: list[float] = []
        for proc, path in procs:
            proc.wait(timeout=60)
            received += json.loads(path.read_text())["received"].values()
        procs = []
        lag = sorted(x - w0 for x in received)
        out.update(received=len(lag), fanout_p50=statistics.median(lag) if lag else float("nan"),
                   fanout_max=lag[-1] if lag else float("nan"))
        return out
    finally:
        for proc, _ in procs:
            proc.kill()
            proc.wait()
        broker.stop()


def broker_table(agent: dict[str, Any], runs: list[dict[str, Any]]) -> str:
    """The figures of every N side by side (one column each)."""
    rows: list[tuple[str, Any]] = [
        ("modules (fake agents)", lambda r: f"{r['n']}"),
        ("module states by Fleet.statuses before dispatch",
         lambda r: ", ".join(f"{k} {v}" for k, v in r["states"].items())),
        ("connections per fake agent", lambda r: f"{r['conns']}"),
        ("Redis maxclients (effective) / its fd limit", lambda r: f"{r['maxclients']} / {r['redis_fd_limit']}"),
        ("connections open / refused", lambda r: f"{r['opened']} / {r['refused']}"),
        ("Redis connected_clients (idle) / per module", lambda r: f"{r['clients']} / {r['clients'] / r['n']:.2f}"),
        ("Redis rejected_connections", lambda r: f"{r['rejected']}"),
        ("Redis used memory above empty, idle: total / per module",
         lambda r: f"{r['mem'] / 2**20:.1f} MiB / {r['mem'] / r['n'] / 1024:.1f} KiB"),
        ("  of it client buffers (mem_clients_normal) per connection",
         lambda r: f"{r['mem_clients'] / max(1, r['clients']) / 1024:.1f} KiB"),
        ("Redis RSS, idle", lambda r: f"{r['rss'] / 2**20:.0f} MiB"),
        ("idle: Redis commands/s (per module)",
         lambda r: f"{r['idle_cmds_per_s']:.0f} ({r['idle_cmds_per_s'] / r['n']:.2f})"),
        ("idle: Redis CPU, share of one core", lambda r: f"{r['idle_redis_cpu'] * 100:.1f} %"),
        ("idle: top commands /s", lambda r: r["idle_top"]),
        ("controller: Fleet.statuses CPU (ms per module)",
         lambda r: f"{r['statuses_cpu']:.2f} s ({r['statuses_cpu'] * 1e3 / r['n']:.3f})"),
        ("controller: dispatch CPU / wall", lambda r: f"{r['dispatch_cpu']:.2f} / {r['dispatch_wall']:.2f} s"),
        ("fan-out: dispatch start -> module took its message, p50 / last",
         lambda r: f"{r['fanout_p50']:.2f} / {r['fanout_max']:.2f} s ({r['received']} took one)"),
        ("controller: sync pass CPU, mean / max", lambda r: f"{r['sync_cpu']:.3f} / {r['sync_cpu_max']:.3f} s"),
        ("controller: sync pass CPU per module", lambda r: f"{r['sync_cpu'] * 1e3 / r['n']:.3f} ms"),
        ("controller: live view refresh (render), CPU / wall",
         lambda r: f"{r['view_cpu']:.3f} / {r['view_wall']:.3f} s"),
        ("controller: sync passes, run wall, run CPU (dispatch + passes)",
         lambda r: f"{r['passes']}, {r['run_wall']:.1f} s, {r['run_cpu']:.1f} s"),
        ("run: Redis commands/s (per module)",
         lambda r: f"{r['run_cmds_per_s']:.0f} ({r['run_cmds_per_s'] / r['n']:.2f})"),
        ("run: Redis commands per module in the run, dispatch to end",
         lambda r: f"{r['run_cmds_per_s'] * r['run_wall'] / r['n']:.1f}"),
        ("run: Redis CPU, share of one core", lambda r: f"{r['run_redis_cpu'] * 100:.1f} %"),
        ("run: top commands /s", lambda r: r["run_top"]),
        ("run: Redis peak memory above empty", lambda r: f"{r['peak_mem'] / 2**20:.1f} MiB"),
        ("run: state, modules done, rows in the history", lambda r: f"{r['state']}, {r['done']}, {r['rows']}"),
    ]
    out = [f"real idle agent (fleet-agent, solo pool, simulated module): {agent['conns']} TCP connections to Redis "
           f"(its process, psutil), {agent['cmds_per_s']:.2f} commands/s idle ({agent['commands']} /s), BRPOP timeout "
           f"{agent['polling']:g} s (MONITOR); the fakes do the same", ""]
    out.append("| | " + " | ".join(f"N = {r['n']}" for r in runs) + " |")
    out.append("| --- |" + " --- |" * len(runs))
    for label, fn in rows:
        cells = []
        for r in runs:
            try:
                cells.append(fn(r))
            except (KeyError, ZeroDivisionError):
                cells.append("-")
        out.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def broker_main(args: argparse.Namespace) -> int:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # redis-server inherits it (ulimit -n <hard>)
    sizes = [int(x) for x in args.modules.split(",") if x]
    tmp = tempfile.TemporaryDirectory(prefix="fleet-scale-") if not args.keep else None
    base = Path(args.keep) if tmp is None else Path(tmp.name)
    try:
        agent = real_agent(base)
        conns = args.conns or agent["conns"]
        print(f"real agent: {agent}", file=sys.stderr, flush=True)
        runs = []
        for n in sizes:
            runs.append(broker_run(n, base, args, conns, agent["polling"]))
            print(f"N={n}: {runs[-1]}", file=sys.stderr, flush=True)
        print(f"one redis-server per N, {SHIPPED_CONF.relative_to(ROOT)} ({runs[0]['redis_conf'] if runs else ''}); "
              f"fd limit of this bench and its children raised from {soft} to the hard limit {hard} (ulimit -n; "
              f"no higher here); fake agents: bench/fake_agents.py, each with its own connections; controller in "
              f"this process: Fleet.statuses, Fleet.dispatch, Fleet.sync every 0.5 s + the live view rendered into "
              f"a null console; history with {args.past_runs} earlier run(s) of every module; each fake holds its "
              f"run {args.hold:g} s; {os.cpu_count()} cores, load average now "
              f"{' / '.join(f'{x:.1f}' for x in os.getloadavg())}")
        print(broker_table(agent, runs))
        print(f"\nthis Redis on this machine (redis-benchmark, 50 clients): {redis_capacity_of(base)}")
    finally:
        if tmp is not None:
            tmp.cleanup()
    return 0


def redis_capacity_of(base: Path) -> str:
    broker = start_broker(base / "redis-capacity", None)
    try:
        return redis_capacity(broker.port)
    finally:
        broker.stop()


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


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modules", default="1000,10000",
                    help="fake agents (own connections each) per run, comma separated: the controller and the broker")
    ap.add_argument("--conns", type=int, default=0,
                    help="connections per fake agent (default: as many as the real agent measured first holds)")
    ap.add_argument("--maxclients", type=int, default=None,
                    help="override the shipped redis.conf.example's maxclients (default: as shipped)")
    ap.add_argument("--idle", type=float, default=20.0, help="idle window measured before the run, s")
    ap.add_argument("--hold", type=float, default=5.0, help="how long each fake agent holds its run, s")
    ap.add_argument("--timeout", type=float, default=300.0, help="give a run up after this many s")
    ap.add_argument("--real", action="store_true",
                    help="instead: real cheap fleet-agent workers (--sizes), wall(N)/wall(1) (before issue 47)")
    ap.add_argument("--sizes", default="1,25,50,100", help="with --real: workers per run")
    ap.add_argument("--models", default="qwen3")
    ap.add_argument("--time-scale", type=float, default=CHEAP_TIME_SCALE)
    ap.add_argument("--telemetry-period", type=float, default=CHEAP_TELEMETRY_PERIOD,
                    help="the agents' device telemetry period, s (0: off)")
    ap.add_argument("--heartbeat", type=float, default=5.0, help="agent heartbeat interval, s (production: 5)")
    ap.add_argument("--past-runs", type=int, default=None,
                    help="earlier runs of every module in the history (default: 1, with --real 20)")
    ap.add_argument("--keep", help="keep everything in this folder (default: a temporary one, removed)")
    args = ap.parse_args()
    if not args.real:
        args.past_runs = 1 if args.past_runs is None else args.past_runs
        return broker_main(args)
    args.past_runs = 20 if args.past_runs is None else args.past_runs
    sizes = sorted(int(x) for x in args.sizes.split(","))
    models = tuple(args.models.split(","))
    tmp = tempfile.TemporaryDirectory(prefix="fleet-scale-") if not args.keep else None
    base = Path(args.keep) if tmp is None else Path(tmp.name)
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
        capacity = redis_capacity(server.port)
        print(f"cheap modules (simulator/cheap.py, time scale {args.time_scale:g}, telemetry every "
              f"{args.telemetry_period:g} s), models {','.join(models)}, heartbeat {args.heartbeat:g} s, Redis "
              f"{server.url}; {os.cpu_count()} cores; load average now "
              f"{' / '.join(f'{x:.1f}' for x in os.getloadavg())} (1 / 5 / 15 min; other engineers' work included)")
        print(table(results))
        print(f"\nwhere the time goes: each module's milestones\n{timeline_table(results)}")
        print(budget(results))
        print(f"\nthis Redis on this machine (redis-benchmark, 50 clients, same server): {capacity}")
    finally:
        stop_workers(workers, grace=20)
        server.stop()
        if tmp is not None:
            tmp.cleanup()
    ratio = ratio_at(results, 100)
    if ratio is not None and ratio > GOAL:
        print(f"wall(100)/wall(1) = {ratio:.3f} > {GOAL}: goal not met", file=sys.stderr)
        return 1
    return 0


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
