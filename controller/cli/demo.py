"""``fleetctl demo``: a simulated fleet on this machine validates a simulated release.

N simulated modules, each a real ``fleet-agent`` Celery worker process with its own
model folders, work folder, server port and simulated device (``mthreads-gmi`` on its
PATH), on the embedded broker (no server, no root). One module can run slower
(``--slow``), because its device throttles (``--throttle``) or for no visible reason; the
release can be worse on one metric (``--regress``). Everything the demo starts is stopped
when it ends, however it ends: finished, interrupted (Ctrl-C), or stopped by ``SIGTERM`` or ``SIGHUP`` (what a
CI timeout or a closed terminal sends), each worker with the servers it started. Even when the demo itself is
killed (``SIGKILL``), each worker gets ``SIGTERM`` from the kernel (its parent-death signal) and stops what it
runs; a next demo into the same folder stops whatever an earlier one left running there before it clears it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import psutil
from rich.console import Console

from agent.procs import MARK
from agent.tables import parse_seed
from contract.records import MODEL_KEYS, ResultRow
from controller import service
from controller.cli.live import PROGRESS_INTERVAL, follow, follow_and_judge, print_launched
from controller.command import fleetctl
from controller.fleet import FleetError, read_heartbeats
from controller.service import BadRequest
from controller.settings import ControllerSettings
from simulator import (
    DEVICE_TOOL_DIR,
    ENV_DEVICE,
    ENV_DEVICE_DIR,
    SpecError,
    build_release,
    make_models,
    regress_spec,
    slow_factor,
)
from simulator.engine.build import SUPPORTED_KEYS, build_engine_release
from simulator.engine.llama_release import build_llama_release
from simulator.engine.llamacpp import installed
from simulator.fit import REFERENCE
from simulator.ports import free_port

MARKER = ".m1000-fleet-demo"
HISTORY = "history.sqlite"  # and its -wal / -shm: kept by the next demo
ENGINES = ("transformers", "llama.cpp")  # what a real module of the demo runs (--engine)
# what stops the demo: Ctrl-C, a CI timeout or cancel (SIGTERM), a closed terminal or SSH session (SIGHUP)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# each worker's parent-death signal (the kernel sends it when the process that started the worker dies,
# however it dies): the worker's warm shutdown stops its run and what the run started
PDEATHSIG = ("setpriv", "--pdeathsig", "TERM", "--")


class DemoStopped(BaseException):
    """A signal stopped the demo (a BaseException, as KeyboardInterrupt: no ``except Exception`` takes it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


@contextlib.contextmanager
def stopped_by_signals() -> Iterator[None]:
    """The first of :data:`STOP_SIGNALS` raises :class:`DemoStopped` where the demo is; later ones are
    ignored (the demo is stopping, within bounded time). The handlers before are restored at the end."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired: list[int] = []

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if not fired:
            fired.append(signum)
            raise DemoStopped(signum)

    old = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """:data:`STOP_SIGNALS` that arrive inside are delivered when it ends (stopping processes must not stop
    halfway); only in the main thread (elsewhere Python runs no signal handler)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []
    old = {sig: signal.signal(sig, lambda signum, frame: got.append(signum)) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        if got:
            signal.raise_signal(got[0])


@dataclass(frozen=True)
class DemoOptions:
    """``fleetctl demo``'s options. ``throttle``: the slow module is slow because its device throttles (it says
    so); ``real``: real-engine modules (transformers serve or llama-server on this CPU) beside the simulated ones,
    running ``engine``: "transformers" (transformers serve) or "llama.cpp"."""

    devices: int = 4
    models: tuple[str, ...] = tuple(MODEL_KEYS)
    noise: float = 0.01
    slow: float | None = None
    throttle: bool = False
    regress: tuple[str, ...] = ()
    seed: int = 1
    time_scale: float = 50.0
    out_dir: Path = Path("demo-out")
    heartbeat_interval: float = 1.0
    start_timeout: float = 60.0
    real: int = 0
    engine: str = "transformers"


def demo_processes(base: Path) -> list[psutil.Process]:
    """This user's processes of a demo in ``base``: its workers (their ``FLEET_WORKDIR``) and what those
    started (the agent's mark, :data:`agent.procs.MARK`), found by environment (a process whose
    environment cannot be read is not this user's)."""
    root = base.resolve()
    found = []
    for p in psutil.process_iter():
        if p.pid == os.getpid():
            continue
        try:
            env = p.environ()
        except (psutil.Error, OSError):
            continue
        for var in ("FLEET_WORKDIR", MARK):
            v = env.get(var)
            if v and Path(v).is_relative_to(root):
                found.append(p)
                break
    return found


def _running(procs: list[psutil.Process]) -> list[psutil.Process]:
    """Those of ``procs`` still running (the same processes: a pid taken again is not one): a zombie has ended
    (its parent, maybe not this process, reaps it)."""
    out = []
    for p in procs:
        with contextlib.suppress(psutil.Error):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
    return out


def stop_processes(procs: list[psutil.Process], grace: float) -> None:
    """SIGTERM, then SIGKILL what is left after ``grace`` (a worker's warm shutdown stops its run first)."""
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    end = time.monotonic() + grace
    while (alive := _running(procs)) and time.monotonic() < end:
        time.sleep(0.1)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    end = time.monotonic() + 5
    while _running(alive) and time.monotonic() < end:
        time.sleep(0.1)


def _fresh_dir(path: Path, err: Console | None = None, grace: float = 20.0) -> Path:
    """``path`` made empty for a demo: an earlier demo's folder is cleared, after what that demo left
    running there (it was killed) is stopped; a folder that is not a demo's is refused."""
    path = path.resolve()
    if path.exists():
        if not (path / MARKER).exists() and any(path.iterdir()):
            raise FileExistsError(f"{path}: exists and is not a demo folder; choose another --out")
        left = demo_processes(path)
        if left:
            if err is not None:
                err.print(f"demo: stopping {len(left)} processes an earlier demo left running in {path}",
                          highlight=False)
            stop_processes(left, grace)
        try:
            for child in (c for c in path.iterdir() if not c.name.startswith(HISTORY)):  # every demo's runs stay
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        except OSError as exc:
            raise FleetError(f"{path}: cannot clear the earlier demo's folder ({exc.strerror}: {exc.filename}); "
                             "remove it, or choose another --out") from None
    path.mkdir(parents=True, exist_ok=True)
    (path / MARKER).write_text("made by fleetctl demo; cleared by the next demo but for its history\n")
    return path


def module_names(n: int) -> list[str]:
    return [f"sim-{i + 1:02d}" for i in range(n)]


def real_names(n: int) -> list[str]:
    return [f"real-{i + 1:02d}" for i in range(n)]


def engine_python() -> Path:
    """The interpreter with torch + transformers[serving] for real-engine modules (``make engine``)."""
    raw = os.environ.get("M1000_ENGINE_PYTHON")
    path = Path(raw) if raw else Path(__file__).resolve().parents[2] / ".venv-engine" / "bin" / "python"
    if not path.exists():
        raise FleetError(f"real-engine modules need torch + transformers[serving]: {path} not found "
                         "(make engine, or set M1000_ENGINE_PYTHON)")
    return path


def llama_server() -> Path:
    """The llama-server that ``make engine`` built (real llama.cpp modules)."""
    built = installed()
    if built is None:
        raise FleetError("real llama.cpp modules need llama-server: make engine (it builds it from the pinned "
                         "llama.cpp source)")
    return built.server


def inventory_toml(names: list[str], base: Path, slow_name: str | None, real: tuple[str, ...] = (),
                   engine: str = "transformers") -> str:
    lines = []
    for name in [*names, *real]:
        label = f'engine = "{engine}"' if name in real else \
            f'sim = "true", speed = "{"slow" if name == slow_name else "normal"}"'
        lines += [
            "[[module]]",
            f'name = "{name}"',
            'host = "127.0.0.1"',
            'transport = "local"',
            f'model_root = "{base / "modules" / name / "models"}"',
            f'workdir = "{base / "modules" / name / "work"}"',
            f"labels = {{ {label} }}",
            "",
        ]
    return "\n".join(lines)


@dataclass
class Worker:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path


def start_worker(name: str, base: Path, settings: ControllerSettings, *, sim_env: dict[str, str],
                 argv_prefix: tuple[str, ...] = ()) -> Worker:
    """One simulated module's worker (``argv_prefix``: e.g. ``ip netns exec NS`` to put it in a namespace)."""
    mod = base / "modules" / name
    (mod / "work").mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEET_", "M1000_SIM_"))}
    # the release's scripts run `python3` from PATH: give them this interpreter's own folder first,
    # so that a version-manager shim (pyenv: a few bash processes per call) is not paid per script
    real_bin = str(Path(os.path.realpath(sys.executable)).parent)
    env["PATH"] = os.pathsep.join([real_bin, *(p for p in env.get("PATH", "").split(os.pathsep) if p != real_bin)])
    # the simulated module's device tool, found by the agent's telemetry sampler like a real mthreads-gmi
    (mod / "device").mkdir(exist_ok=True)
    env["PATH"] = os.pathsep.join([str(DEVICE_TOOL_DIR), env["PATH"]])
    env[ENV_DEVICE_DIR] = str(mod / "device")
    env.update({
        "FLEET_BROKER_URL": settings.broker_url,
        "FLEET_DATA_DIR": str(settings.data_dir),
        "FLEET_MODULE": name,
        "FLEET_WORKDIR": str(mod / "work"),
        "FLEET_MODEL_ROOT": str(mod / "models"),
        "FLEET_SERVER_PORT": str(free_port()),
        "FLEET_METRICS_PORT": "0",
        "FLEET_HEARTBEAT_INTERVAL": str(settings.heartbeat_interval),
        "FLEET_OFFLINE_AFTER": str(settings.offline_after),
        **sim_env,
    })
    log = mod / "worker.log"
    # the kernel sends the worker SIGTERM when this process dies, even by SIGKILL (setpriv execs: the same pid)
    die_with_us = PDEATHSIG if sys.platform.startswith("linux") and shutil.which(PDEATHSIG[0]) else ()
    with log.open("ab") as fh:
        proc = subprocess.Popen([*die_with_us, *argv_prefix, sys.executable, "-m", "agent.worker"], env=env,
                                stdout=fh,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                cwd=str(mod))
    return Worker(name, proc, log)


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return list(psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        return []


def stop_workers(workers: list[Worker], grace: float = 15.0) -> None:
    """SIGTERM every worker's process group (warm shutdown: it stops its run and what the run started),
    SIGKILL what is left after ``grace``, and then what a worker killed so had started (its servers run in
    sessions of their own; a worker, their subreaper, holds them as descendants until it dies). A stop
    signal that arrives meanwhile is delivered after (:func:`deferred_signals`)."""
    with deferred_signals():
        started = {p.pid: p for w in workers for p in descendants(w.proc.pid)}
        for w in workers:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(w.proc.pid, signal.SIGTERM)
        end = time.monotonic() + grace
        for w in workers:
            with contextlib.suppress(subprocess.TimeoutExpired):
                w.proc.wait(timeout=max(0.1, end - time.monotonic()))
        for w in workers:
            # still running after the grace: what it started is killed with it
            if w.proc.poll() is None:
                started.update((p.pid, p) for p in descendants(w.proc.pid))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(w.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                w.proc.wait(timeout=5)
        left = _running(list(started.values()))
        for p in left:
            with contextlib.suppress(psutil.Error):
                p.kill()
        end = time.monotonic() + 5
        while _running(left) and time.monotonic() < end:
            time.sleep(0.1)


@contextlib.contextmanager
def simulated_fleet(names: list[str], base: Path, settings: ControllerSettings, *, noise: float, seed: int,
                    slow: dict[str, float], timeout: float = 60.0, device: dict[str, str] | None = None,
                    real: tuple[str, ...] = (), engine: str = "transformers",
                    env: dict[str, dict[str, str]] | None = None) -> Iterator[list[Worker]]:
    """Start one worker per simulated module (and per real-engine module in ``real``), wait for their first
    heartbeats, stop them all at the end.

    ``device``: module -> its simulated device's condition (``M1000_SIM_DEVICE``, e.g. ``throttle:0.89``);
    ``env``: module -> more simulator variables of its own (e.g. ``M1000_SIM_DRIVER``: another driver).
    """
    workers: list[Worker] = []
    try:
        for i, name in enumerate(names):
            make_models(base / "modules" / name / "models")
            sim_env = {"M1000_SIM_NOISE": str(noise), "M1000_SIM_SEED": str(seed * 1000 + i)}
            if name in slow:
                sim_env["M1000_SIM_SPEED"] = f"{1.0 / slow[name]:.6f}"
            if device and name in device:
                sim_env[ENV_DEVICE] = device[name]
            sim_env.update((env or {}).get(name, {}))
            workers.append(start_worker(name, base, settings, sim_env=sim_env))
        if real:
            py = engine_python()
            llama = {"M1000_LLAMA_SERVER": str(llama_server())} if engine == "llama.cpp" else {}
            # random models made once, offline; every real module reads them
            shared = base / "engine-models"
            subprocess.run([str(py), "-m", "simulator", "make-models", "--engine", engine, str(shared)],
                           check=True, capture_output=True, timeout=600, cwd=Path(__file__).resolve().parents[2])
            for name in real:
                (base / "modules" / name).mkdir(parents=True, exist_ok=True)
                (base / "modules" / name / "models").symlink_to(shared, target_is_directory=True)
                workers.append(start_worker(name, base, settings,
                                            sim_env={"M1000_ENGINE_PYTHON": str(py), **llama}))
        wait_for_heartbeats(settings, workers, timeout)
        yield workers
    finally:
        stop_workers(workers)


def wait_for_heartbeats(settings: ControllerSettings, workers: list[Worker], timeout: float) -> None:
    end = time.monotonic() + timeout
    missing = [w.name for w in workers]
    while missing:
        hbs = read_heartbeats(settings, missing)
        missing = [m for m, hb in hbs.items() if hb is None]
        dead = [w for w in workers if w.proc.poll() is not None]
        if dead:
            tail = dead[0].log.read_text(errors="replace").strip().splitlines()[-3:]
            raise FleetError(f"worker {dead[0].name} exited ({dead[0].proc.returncode}): {' | '.join(tail)}")
        if not missing:
            return
        if time.monotonic() > end:
            raise FleetError(f"no heartbeat within {timeout:.0f} s from {', '.join(missing)}")
        time.sleep(0.2)


def reference_rows() -> list[ResultRow]:
    """The reference tables the simulated release reproduces, as baseline rows."""
    return [r for rows in parse_seed(REFERENCE.read_text(encoding="utf-8"), str(REFERENCE)).values() for r in rows]


def _validate_real(s: Any, base: Path, models: tuple[str, ...], out: Console, err: Console,
                   engine: str = "transformers") -> int:
    """The real-engine release on the real modules, twice: the first run becomes that release's own
    baseline (its figures are its own, not the seed's), the second is judged against it."""
    served = tuple(MODEL_KEYS) if engine == "llama.cpp" else SUPPORTED_KEYS
    keys = tuple(k for k in models if k in served)
    if not keys:
        err.print(f"demo: none of {', '.join(models)} is served by the real-engine release "
                  f"({', '.join(served)}): real modules idle", highlight=False)
        return 0
    if engine == "llama.cpp":
        rel, server = build_llama_release(base / "release-engine"), "llama-server"
    else:
        rel, server = build_engine_release(base / "release-engine"), "transformers serve"
    err.print(f"demo: built {rel.path.name} (real engine: {server}, sha256 {rel.sha256[:12]}); "
              "a reference run on the real modules first, then the judged run", highlight=False)
    req = service.ValidateRequest(release=rel.path, models=keys, devices=f"engine={engine}")
    ref = service.validate(s, req)
    print_launched(ref, err, len(ref.modules))
    follow(lambda: service.sync(s, ref.run_id), err, title=f"reference run {ref.run_id}",
           progress_every=PROGRESS_INTERVAL)
    rows = s.history().rows(ref.run_id)
    if not rows:
        err.print(f"demo: the reference run {ref.run_id} of the real-engine release measured nothing", highlight=False)
        return 1
    s.history().add_baseline(rel.version, rows, f"reference run {ref.run_id} of the real-engine modules")
    judged = service.validate(s, service.ValidateRequest(release=rel.path, models=keys, devices=f"engine={engine}",
                                                         baseline=rel.version))
    print_launched(judged, err, len(judged.modules))
    return follow_and_judge(s, judged.run_id, rel.version, out, err, root=("--history", str(s.history_path)))


def release_speed(opts: DemoOptions) -> str:
    """The simulated release's speed spec from ``--regress``, with ``--slow``/``--throttle`` checked first
    (a bad knob: BadRequest, one line, before anything is built or removed)."""
    try:
        if opts.slow is not None:
            slow_factor(opts.slow)
        elif opts.throttle:
            raise SpecError("--throttle says why the slow module is slow: give --slow F too")
        return ",".join(regress_spec(r) for r in opts.regress) or "1.0"
    except SpecError as exc:
        raise BadRequest(str(exc)) from None


def run_demo(opts: DemoOptions, out: Console, err: Console) -> int:
    """The demo, from its folder to its verdict; a stop signal stops it (and everything it started) at once:
    the exit code is then 128 + the signal's number (130 for Ctrl-C, 143 for SIGTERM)."""
    t0 = time.monotonic()
    base = opts.out_dir.resolve()
    try:
        with stopped_by_signals():
            return _run_demo(opts, out, err, t0)
    except DemoStopped as stop:
        err.print(f"demo: stopped by {stop.name} after {time.monotonic() - t0:.0f} s; every simulated module it "
                  f"started is stopped, with what it ran; what it did so far is in {base}", highlight=False)
        return stop.exit_code


def _run_demo(opts: DemoOptions, out: Console, err: Console, t0: float) -> int:
    speed = release_speed(opts)
    if opts.engine not in ENGINES:
        raise BadRequest(f"--engine {opts.engine!r}: expected one of {', '.join(ENGINES)}")
    base = _fresh_dir(opts.out_dir, err)
    settings = ControllerSettings(
        broker_url="filesystem://", data_dir=base / "fleet", inventory=base / "inventory.toml",
        history=str(base / HISTORY), heartbeat_interval=opts.heartbeat_interval,
        offline_after=max(10.0, 10 * opts.heartbeat_interval))
    names = module_names(opts.devices)
    real = tuple(real_names(opts.real))
    slow_name = names[-1] if opts.slow and len(names) > 1 else (names[0] if opts.slow else None)
    (base / "inventory.toml").write_text(inventory_toml(names, base, slow_name, real, opts.engine), encoding="utf-8")
    rel = build_release(base / "release", noise=opts.noise, speed=speed, time_scale=opts.time_scale, seed=opts.seed)
    err.print(f"demo: built {rel.path.name} (sha256 {rel.sha256[:12]}), speed {speed}, noise {opts.noise}, "
              f"time scale {opts.time_scale:g}; starting {len(names)} simulated modules"
              + (f" ({slow_name} {opts.slow:g}x slower{', its device throttling' if opts.throttle else ''})"
                 if slow_name else ""), highlight=False)
    slow: dict[str, float] = {}
    device: dict[str, str] = {}
    if slow_name and opts.slow and opts.throttle:  # slow through its device: a lower clock and HW slowdown
        device[slow_name] = f"throttle:{1.0 / opts.slow:.6f}"
    elif slow_name and opts.slow:
        slow[slow_name] = opts.slow
    with service.Session(settings) as s:
        earlier = s.history().runs(limit=10_000)
        if earlier:
            err.print(f"demo: the {len(earlier)} earlier demo run(s) in this folder stay in its history "
                      f"({fleetctl('--history', str(settings.history_path), 'runs')})", highlight=False, markup=False)
        if not any(b["release"] == rel.version for b in s.history().baselines()):
            s.history().add_baseline(rel.version, reference_rows(), "simulator reference tables (seed)")
        # device samples every 0.25 s: at time scale 50 a key's benchmark window lasts seconds, and an energy
        # figure needs 20 samples inside its window (agent.telemetry.energy.MIN_SAMPLES)
        period = {n: {"FLEET_TELEMETRY_PERIOD": "0.25"} for n in names}
        with simulated_fleet(names, base, settings, noise=opts.noise, seed=opts.seed, slow=slow, device=device,
                             timeout=opts.start_timeout + opts.devices, real=real, engine=opts.engine,
                             env=period) as workers:
            # a worker starts in ~1.5 s of CPU (ADR 0042)
            try:
                launched = service.validate(s, service.ValidateRequest(release=rel.path, models=opts.models,
                                                                       devices="sim=true" if real else "all"))
                print_launched(launched, err, len(launched.modules))
                # Ctrl-C: DemoStopped, not detached
                code = follow_and_judge(s, launched.run_id, None, out, err, root=("--history", str(s.history_path)))
                # the real-engine release on its own modules: judged against their own figures
                if real:
                    code = max(code, _validate_real(s, base, opts.models, out, err, opts.engine))
            except DemoStopped as stop:
                err.print(f"demo: {stop.name}: stopping its {len(workers)} simulated modules", highlight=False)
                raise
        err.print(f"demo: finished in {time.monotonic() - t0:.0f} s; everything is in {base} "
                  f"({fleetctl('--history', str(settings.history_path), 'report', 'latest')})", markup=False,
                  highlight=False)
        return code
