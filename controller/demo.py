"""``fleetctl demo``: a simulated fleet on this machine validates a simulated release.

N simulated modules, each a real ``fleet-agent`` Celery worker process with its own
model folders, work folder and server port, on the embedded broker (no server, no
root). One module can run slower (``--slow``), the release can be worse on one metric
(``--regress``). Everything the demo starts is stopped when it ends, however it ends.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from agent.records import MODEL_KEYS
from controller.settings import ControllerSettings

MARKER = ".m1000-fleet-demo"


@dataclass(frozen=True)
class DemoOptions:
    devices: int = 4
    models: tuple[str, ...] = tuple(MODEL_KEYS)
    noise: float = 0.01
    slow: float | None = None
    regress: tuple[str, ...] = ()
    seed: int = 1
    time_scale: float = 50.0
    out_dir: Path = Path("demo-out")
    heartbeat_interval: float = 1.0
    start_timeout: float = 60.0


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _fresh_dir(path: Path) -> Path:
    path = path.resolve()
    if path.exists():
        if not (path / MARKER).exists() and any(path.iterdir()):
            raise FileExistsError(f"{path}: exists and is not a demo folder; choose another --out")
        shutil.rmtree(path)
    path.mkdir(parents=True)
    (path / MARKER).write_text("made by fleetctl demo; removed by the next demo\n")
    return path


def module_names(n: int) -> list[str]:
    return [f"sim-{i + 1:02d}" for i in range(n)]


def inventory_toml(names: list[str], base: Path, slow_name: str | None) -> str:
    lines = []
    for name in names:
        lines += [
            "[[module]]",
            f'name = "{name}"',
            'host = "127.0.0.1"',
            'transport = "local"',
            f'model_root = "{base / "modules" / name / "models"}"',
            f'workdir = "{base / "modules" / name / "work"}"',
            f'labels = {{ sim = "true", speed = "{"slow" if name == slow_name else "normal"}" }}',
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
    with log.open("ab") as fh:
        proc = subprocess.Popen([*argv_prefix, sys.executable, "-m", "agent.worker"], env=env, stdout=fh,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                cwd=str(mod))
    return Worker(name, proc, log)


def stop_workers(workers: list[Worker], grace: float = 15.0) -> None:
    """SIGTERM every worker's process group (warm shutdown), SIGKILL what is left after ``grace``."""
    for w in workers:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(w.proc.pid, signal.SIGTERM)
    end = time.monotonic() + grace
    for w in workers:
        with contextlib.suppress(subprocess.TimeoutExpired):
            w.proc.wait(timeout=max(0.1, end - time.monotonic()))
    for w in workers:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(w.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            w.proc.wait(timeout=5)


@contextlib.contextmanager
def simulated_fleet(names: list[str], base: Path, settings: ControllerSettings, *, noise: float, seed: int,
                    slow: dict[str, float], timeout: float = 60.0) -> Iterator[list[Worker]]:
    """Start one worker per simulated module, wait for their first heartbeats, stop them all at the end."""
    from simulator import make_models

    workers: list[Worker] = []
    try:
        for i, name in enumerate(names):
            make_models(base / "modules" / name / "models")
            sim_env = {"M1000_SIM_NOISE": str(noise), "M1000_SIM_SEED": str(seed * 1000 + i)}
            if name in slow:
                sim_env["M1000_SIM_SPEED"] = f"{1.0 / slow[name]:.6f}"
            workers.append(start_worker(name, base, settings, sim_env=sim_env))
        wait_for_heartbeats(settings, workers, timeout)
        yield workers
    finally:
        stop_workers(workers)


def wait_for_heartbeats(settings: ControllerSettings, workers: list[Worker], timeout: float) -> None:
    from controller.fleet import FleetError, read_heartbeats

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


def reference_rows() -> list:  # type: ignore[type-arg]
    """The reference tables the simulated release reproduces, as baseline rows."""
    from agent.tables import parse_seed
    from simulator.fit import REFERENCE

    return [r for rows in parse_seed(REFERENCE.read_text(encoding="utf-8"), str(REFERENCE)).values() for r in rows]


def run_demo(opts: DemoOptions, out: Console, err: Console) -> int:
    from controller.cli import State, run_validation
    from simulator import build_release, regress_spec

    base = _fresh_dir(opts.out_dir)
    settings = ControllerSettings(
        broker_url="filesystem://", data_dir=base / "fleet", inventory=base / "inventory.toml",
        history=base / "history.sqlite", heartbeat_interval=opts.heartbeat_interval,
        offline_after=max(10.0, 10 * opts.heartbeat_interval))
    names = module_names(opts.devices)
    slow_name = names[-1] if opts.slow and len(names) > 1 else (names[0] if opts.slow else None)
    (base / "inventory.toml").write_text(inventory_toml(names, base, slow_name), encoding="utf-8")
    speed = ",".join(regress_spec(r) for r in opts.regress) or "1.0"
    t0 = time.monotonic()
    rel = build_release(base / "release", noise=opts.noise, speed=speed, time_scale=opts.time_scale, seed=opts.seed)
    err.print(f"demo: built {rel.path.name} (sha256 {rel.sha256[:12]}), speed {speed}, noise {opts.noise}, "
              f"time scale {opts.time_scale:g}; starting {len(names)} simulated modules"
              + (f" ({slow_name} {opts.slow:g}x slower)" if slow_name else ""), highlight=False)
    st = State.for_settings(settings)
    try:
        version, _ = st.history().add_baseline(rel.version, reference_rows(), "simulator reference tables (seed)")
        with simulated_fleet(names, base, settings, noise=opts.noise, seed=opts.seed,
                             slow={slow_name: opts.slow} if slow_name and opts.slow else {},
                             timeout=opts.start_timeout + opts.devices):  # a worker starts in ~1.5 s of CPU
            code = run_validation(st, rel.path, opts.models, "all")
        err.print(f"demo: finished in {time.monotonic() - t0:.0f} s; everything is in {base} "
                  f"(fleetctl --history {settings.history_path} report latest)", highlight=False)
        return code
    finally:
        st.close()
