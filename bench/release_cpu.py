"""CPU of each process a cheap module's run starts from the simulated release: an earlier commit's release beside
this tree's, side by side in one run.

Both releases are built (the earlier one from ``--base``'s ``simulator/runtime`` and ``simulator/release``, the
same fitted model and knobs), unpacked, configured for qwen3, and their processes run as the agent runs them
(``bash SCRIPT``, the agent's environment capture of ``setup_env.sh``, the cheap module's environment of
``simulator/cheap.py`` at time scale 1000, this interpreter's folder first on PATH as ``fleetctl demo`` puts it),
old and new alternately, ``--rounds`` times. Per process: its CPU (user + system, its waited children included,
``wait4``), in ms, median and range, old and new:

- generate, environment, precompile (whole, and to its first wait: its own threads' CPU when it prints its first
  line, after its first sleep; the old scripts' reaped subshells not included): the start of every run, before its
  first wait (100 cheap modules start at once on 2 cores: the last one starts after ~100 x this / 2);
- server to ready: its CPU when it prints that it is ready (``/proc/PID/task/*/schedstat``), what 100 servers
  starting at once queue on; server whole: at the end, after the benchmark;
- benchmark: the release's benchmark of the cheap profile set (one profile, one request per figure, 8 tokens);
- one ``mthreads-gmi`` sample (the simulated device tool, not part of the release: the same for both);
- the floor of any script: bash starting ``python3 -S`` that does nothing;
- then a ready server's CPU per second left alone (at the cheap time scale 0.25 a server lives ~110 s of a ~190 s run)
  and per ``/health`` poll, twice each, alternating.

Usage: flock /tmp/bench.lock .venv/bin/python bench/release_cpu.py [--base REF] [--rounds 15]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from agent.steps import parse_env_capture, plan_environment  # noqa: E402
from bench import record  # noqa: E402 - bench/record.py, this script's folder
from simulator import DEVICE_TOOL_DIR, make_models  # noqa: E402
from simulator.build import RUNTIME_DIR, TEMPLATE_DIR, release_files, release_mtime, write_release  # noqa: E402
from simulator.cheap import cheap_module_env  # noqa: E402
from simulator.runtime.core import Knobs  # noqa: E402

MUSA = "scripts/ci/musa"
PHASES = ("generate", "environment", "precompile", "precompile to its wait", "server to ready", "benchmark",
          "server whole", "mthreads-gmi", "floor: bash + python3 -S")
EARLY = ("generate", "environment", "precompile to its wait")  # before the run's first wait


def _cpu_ms(rusage: resource.struct_rusage) -> float:
    return (rusage.ru_utime + rusage.ru_stime) * 1000


def run_cpu(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, bytes]:
    """(CPU in ms of the process and its waited children, its stdout); fails loudly on a non-zero exit."""
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None  # PIPE
    out, err = proc.stdout.read(), proc.stderr.read()
    _, status, rusage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}: {err.decode(errors='replace')[-500:]}")
    return _cpu_ms(rusage), out


def task_cpu_ms(pid: int) -> float:
    """CPU of every thread of a live process so far (ns precision)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/schedstat") as fh:
            total += int(fh.read().split()[0])
    return total / 1e6


class Release:
    def __init__(self, name: str, top: Path, base_env: dict[str, str], port: int) -> None:
        self.name, self.top, self.port = name, top, port
        musa = top / MUSA
        (musa / "tilelang_workflow_config.json").write_text(json.dumps({"model_paths": [str(MODELS["qwen3"])]}))
        self.base_env = {**base_env, "TILELANG_CACHE_DIR": str(top / ".cache")}
        self.env: dict[str, str] = {}

    def script(self, name: str) -> list[str]:
        return ["bash", str(self.top / MUSA / name)]

    def round(self) -> dict[str, float]:
        out: dict[str, float] = {}
        out["generate"], _ = run_cpu(self.script("generate_tilelang_workflow.sh"), self.base_env, self.top)
        plan = plan_environment(self.top, self.base_env, 60.0)
        out["environment"], blob = run_cpu(list(plan.argv), self.base_env, self.top)
        self.env = {**self.base_env, **parse_env_capture(blob, self.base_env), "SERVER_HOST": "127.0.0.1",
                    "SERVER_PORT": str(self.port)}
        pre = subprocess.Popen(self.script("precompile_tilelang_kernels.sh"), env=self.env, cwd=self.top,
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert pre.stdout is not None  # PIPE
        pre.stdout.readline()
        out["precompile to its wait"] = task_cpu_ms(pre.pid)
        pre.stdout.read()
        _, status, rusage = os.wait4(pre.pid, 0)
        pre.returncode = os.waitstatus_to_exitcode(status)
        pre.stdout.close()
        if pre.returncode:
            raise SystemExit(f"{self.name}: precompile exited {pre.returncode}")
        out["precompile"] = _cpu_ms(rusage)
        server = subprocess.Popen(self.script("start_qwen3_server.sh"), env=self.env, cwd=self.top,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        assert server.stderr is not None  # PIPE
        try:
            for line in server.stderr:
                if b"ready to roll" in line:
                    out["server to ready"] = task_cpu_ms(server.pid)
                    break
            else:
                raise SystemExit(f"{self.name}: the server ended before it was ready")
            out["benchmark"], _ = run_cpu(self.script("run_tilelang_benchmark.sh"), {**self.env, "MODEL_KEY": "qwen3"},
                                          self.top)
        finally:
            server.terminate()
            _, _, rusage = os.wait4(server.pid, 0)
            server.returncode = 0
            server.stderr.close()
        out["server whole"] = _cpu_ms(rusage)
        gmi = [str(DEVICE_TOOL_DIR / "mthreads-gmi"), "--query-gpu=index,temperature.gpu,power.draw,clocks.sm,"
               "utilization.gpu,memory.used", "--format=csv,noheader,nounits"]
        out["mthreads-gmi"], _ = run_cpu(gmi, self.env, self.top)
        floor = ["bash", "-c", "exec python3 -S -c pass"]  # the least of a script: the shell, an interpreter
        out["floor: bash + python3 -S"], _ = run_cpu(floor, self.env, self.top)
        return out

    def serving(self, idle_s: float, polls: int) -> tuple[float, float]:
        """A ready server's CPU (ms) per second left alone, and per ``/health`` poll on a new connection (as the
        agent waits for it: every 0.5 s through the model load, ~80 s at the cheap time scale 0.25)."""
        server = subprocess.Popen(self.script("start_qwen3_server.sh"), env=self.env, cwd=self.top,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        assert server.stderr is not None  # PIPE
        try:
            for line in server.stderr:
                if b"ready to roll" in line:
                    break
            time.sleep(0.2)
            c0 = task_cpu_ms(server.pid)
            time.sleep(idle_s)
            c1 = task_cpu_ms(server.pid)
            for _ in range(polls):
                with socket.create_connection(("127.0.0.1", self.port)) as conn:
                    conn.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                    while conn.recv(4096):
                        pass
            time.sleep(0.2)
            c2 = task_cpu_ms(server.pid)
        finally:
            server.terminate()
            server.wait()
            server.stderr.close()
        idle = (c1 - c0) / idle_s
        return idle, (c2 - c1 - idle * 0.2) / polls


MODELS: dict[str, Path] = {}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def build(dest: Path, template_dir: Path, runtime_dir: Path) -> Path:
    version, date = "1.4.1", "20260803"
    knobs = Knobs(time_scale=1000.0)
    files = release_files(version=version, knobs=knobs, date=date, template_dir=template_dir, runtime_dir=runtime_dir)
    rel = write_release(dest, version, date, release_mtime(version, date), files)
    with tarfile.open(rel.path) as tar:
        tar.extractall(dest / "x", filter="data")
    return dest / "x" / rel.top


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="f784f45", help="the earlier commit (default: main measured by the lead)")
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="release-cpu-") as tmp:
        base = Path(tmp)
        old_src = base / "old-src"
        old_src.mkdir()
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.base, "simulator/runtime",
                                  "simulator/release"], check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(old_src)], input=archive, check=True)
        MODELS.update(make_models(base / "models", ["qwen3"]))
        real_bin = str(Path(os.path.realpath(sys.executable)).parent)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEET_", "M1000_SIM_", "PYTHON"))}
        env["PATH"] = os.pathsep.join([str(DEVICE_TOOL_DIR), real_bin, env.get("PATH", "")])
        env.update(cheap_module_env(1000.0))
        (base / "device").mkdir()
        env["M1000_SIM_DEVICE_DIR"] = str(base / "device")
        releases = [
            Release(f"old ({args.base})", build(base / "old", old_src / "simulator/release",
                                                old_src / "simulator/runtime"), env, free_port()),
            Release("new (this tree)", build(base / "new", TEMPLATE_DIR, RUNTIME_DIR), env, free_port()),
        ]
        for r in releases:  # warm-up: page cache, the kernel cache of precompile
            r.round()
        samples: dict[str, dict[str, list[float]]] = {r.name: {p: [] for p in PHASES} for r in releases}
        t0 = time.monotonic()
        for i in range(args.rounds):
            for r in releases if i % 2 == 0 else reversed(releases):
                for phase, ms in r.round().items():
                    samples[r.name][phase].append(ms)
        wall = time.monotonic() - t0
        serving: dict[str, list[tuple[float, float]]] = {r.name: [] for r in releases}
        for i in range(2):
            for r in releases if i % 2 == 0 else reversed(releases):
                serving[r.name].append(r.serving(2.0, 100))
    old, new = (samples[r.name] for r in releases)
    for s in (old, new):
        s["before the first wait"] = [sum(v) for v in zip(*(s[p] for p in EARLY), strict=True)]
    load = os.getloadavg()
    print(f"CPU per process of a cheap qwen3 run (ms; median [min-max] of {args.rounds} rounds, old and new "
          f"alternating; {wall:.0f} s; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f})")
    print(f"{'process':<24}{releases[0].name:>30}{releases[1].name:>30}{'new/old':>10}")
    for phase in (*PHASES, "before the first wait"):
        a, b = old[phase], new[phase]
        cell = [f"{statistics.median(v):7.1f} [{min(v):5.1f}-{max(v):5.1f}]" for v in (a, b)]
        print(f"{phase:<24}{cell[0]:>30}{cell[1]:>30}{statistics.median(b) / statistics.median(a):>10.2f}")
    whole = ("generate", "environment", "precompile", "benchmark", "server whole")
    per_run = [[sum(v) for v in zip(*(s[p] for p in whole), strict=True)] for s in (old, new)]
    print(f"the release's processes per run (generate + environment + precompile + server + benchmark): "
          f"{statistics.median(per_run[0]):.1f} -> {statistics.median(per_run[1]):.1f} ms")
    for r in releases:
        idle, poll = (", ".join(f"{v[k]:.3f}" for v in serving[r.name]) for k in (0, 1))
        print(f"a ready server, {r.name}: {idle} ms of CPU per s left alone; {poll} ms per /health poll "
              f"(two rounds, alternating)")


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
