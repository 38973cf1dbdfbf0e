"""What the standard library would cost in place of the hand-written pieces, side by side in one run.

Part 1, the simulated release (``simulator/runtime``: ``jsonc.py``, ``record.py``, ``net.py`` and the HTTP/1.1
handler in ``server.py``). The release is built several times from copies of ``simulator/runtime`` in which one or
all of the stand-ins are replaced by the standard library doing the same job:

- ``json``: ``jsonc.py`` becomes ``from json import dumps, loads``;
- ``typing``: ``record.py`` becomes ``from typing import NamedTuple``;
- ``socketserver``: ``net.py`` on ``socket`` (``create_connection``, ``makefile``), ``socketserver``'s
  ``ThreadingTCPServer`` (daemon threads, ``serve_forever`` on a ``threading.Thread``);
- ``http.server``: the server's ``HTTPHandler`` is ``http.server.BaseHTTPRequestHandler`` (HTTP/1.1,
  keep-alive, Nagle off; the routes, streaming and bodies unchanged);
- ``all stdlib``: the four together (what "use the standard library" means).

Each is run as ``bench/release_cpu.py`` runs a cheap module's processes (``bash SCRIPT``, the cheap environment at
time scale 1000, qwen3), all variants interleaved, each round in another order: per process its CPU (``wait4``;
the server's at "ready" from ``/proc/PID/task/*/schedstat``) and peak RSS, median of the rounds; then on a ready
server its CPU per ``/health`` poll (a new connection each, as the agent polls; ``/proc/PID/stat``, which keeps
the CPU of the connections' ended threads), per streamed completion (``/v1/completions``, 8 tokens, one keep-alive
connection, as the benchmark asks; its thread's CPU before it closes) and per second left alone.
An asyncio server is not built (the handler paces tokens with blocking sleeps on its threads: it would be a
rewrite); what ``asyncio`` alone adds to an interpreter's start is measured with the other imports: each module
imported by ``python3 -S`` (as the release's scripts run), CPU minus that of ``python3 -S -c pass``, interleaved.

Part 2, the probe's HTTP/1.1 client (``agent/probe/transport.py``): ``bench/probe.py`` run as it is (its probe,
its transport alone, bare asyncio streams, aiohttp, httpx and h11 loops against one loopback SSE server,
interleaved rounds).

Ratios, not absolute times: the machine is shared. Raw output: ``bench/results/stdlib_standins_<stamp>.txt``
(kept by ``bench/record.py``).

    .venv/bin/python bench/stdlib_standins.py [--rounds 10] [--requests 200] [--probe-rounds 4]
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TextIO

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from agent.steps import parse_env_capture, plan_environment  # noqa: E402
from bench import record, release_cpu  # noqa: E402 - bench/release_cpu.py: the release's processes as the agent runs them
from simulator import DEVICE_TOOL_DIR, make_models  # noqa: E402
from simulator.build import RUNTIME_DIR, TEMPLATE_DIR  # noqa: E402
from simulator.cheap import cheap_module_env  # noqa: E402

SHIPPED = "shipped"
VARIANTS = (SHIPPED, "json", "typing", "socketserver", "http.server", "all stdlib")
PHASES = ("generate", "environment", "precompile", "server to ready", "benchmark", "server whole")
RSS = ("server", "benchmark", "precompile")
IMPORTS = ("json", "typing", "collections", "socket", "socketserver", "threading", "http.server", "asyncio",
           "m1000_sim.jsonc", "m1000_sim.record", "m1000_sim.net")

JSON_STDLIB = '"""json itself (bench/stdlib_standins.py)."""\nfrom json import dumps, loads  # noqa: F401\n'
RECORD_STDLIB = '"""typing itself (bench/stdlib_standins.py)."""\nfrom typing import NamedTuple  # noqa: F401\n'
NET_STDLIB = '''"""net.py's names on socket and socketserver (bench/stdlib_standins.py)."""
import socket
import socketserver
import threading

Socket = socket.socket
Writer = socketserver._SocketWriter


def no_delay(sock):
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def reader(sock):  # socket's file has no kernel receive time: the clock starts at parse, as before acee841
    f = sock.makefile("rb")
    f.raw.stamp_ns = 0
    return f


def connect(host, port, timeout):
    sock = socket.create_connection((host, port), timeout)
    no_delay(sock)
    return sock


class Listener(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True

    def __init__(self, address, serve, backlog=5):
        self.serve = serve
        self.request_queue_size = backlog
        super().__init__(address, None)

    def finish_request(self, request, client_address):
        self.serve(request, client_address)

    def start(self):
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)
        self._thread.start()

    def wait(self):
        self._thread.join()

    def close(self):
        self.server_close()
'''
HANDLER_STDLIB = '''import http.server


class HTTPHandler(http.server.BaseHTTPRequestHandler):
    """http.server's handler (bench/stdlib_standins.py), with the server's own error body."""

    server_version = "sglang-musa-sim"
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    arrived_ns = 0  # http.server reads no kernel receive time: the clock starts at parse

    def __init__(self, conn, client_address):
        super().__init__(conn, client_address, None)

    def setup(self):  # the connection's halves as this release's net makes them (a _socket has no makefile)
        self.connection = self.request
        net.no_delay(self.connection)
        self.rfile = net.reader(self.connection)
        self.wfile = net.Writer(self.connection)

    def finish(self):
        self.rfile.close()

    def log_message(self, format, *args):
        pass

    def send_error(self, code, message=None, explain=None):
        self.close_connection = True
        data = jsonc.dumps({"error": {"message": message, "code": code}}).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


'''


def make_runtime(dest: Path, variant: str) -> Path:
    """A copy of ``simulator/runtime`` with ``variant``'s stand-ins replaced by the standard library."""
    shutil.copytree(RUNTIME_DIR, dest, ignore=shutil.ignore_patterns("__pycache__"))
    parts = {"json", "typing", "socketserver", "http.server"} if variant == "all stdlib" else {variant}
    if "json" in parts:
        (dest / "jsonc.py").write_text(JSON_STDLIB)
    if "typing" in parts:
        (dest / "record.py").write_text(RECORD_STDLIB)
    if "socketserver" in parts:
        (dest / "net.py").write_text(NET_STDLIB)
    if "http.server" in parts:
        src = (dest / "server.py").read_text()
        start, end = src.index("class HTTPHandler:"), src.index("_REASONS = {")
        (dest / "server.py").write_text(src[:start] + HANDLER_STDLIB + src[end:])
    return dest


def run_usage(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """(CPU ms, peak RSS MiB) of a process run to its end. Run under ``/usr/bin/time``: a child forked from this
    interpreter keeps its parent's peak RSS across ``exec`` in ``wait4``'s figure, one forked from ``time`` only
    time's (~2 MiB); the CPU (``wait4``, its waited children) includes time's own, ~0.3 ms, alike for every variant."""
    with tempfile.NamedTemporaryFile("r", prefix="maxrss-") as rss:
        proc = subprocess.Popen(["/usr/bin/time", "-f", "%M", "-o", rss.name, *argv], env=env, cwd=cwd,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        assert proc.stderr is not None  # PIPE
        err = proc.stderr.read()
        _, status, ru = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        proc.stderr.close()
        if proc.returncode:
            raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}: {err.decode(errors='replace')[-500:]}")
        return release_cpu._cpu_ms(ru), int(rss.read().split()[-1]) / 1024


def process_cpu_ms(pid: int) -> float:
    """CPU of a live process so far, its exited threads included (``/proc/PID/stat``; clock ticks, 10 ms): a
    connection's thread is gone, with its ``/proc/PID/task`` entry, once its connection is closed."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def peak_rss_mib(pid: int) -> float:
    """A live process's peak RSS (VmHWM: its own since its exec)."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


class Variant(release_cpu.Release):
    def round(self) -> dict[str, float]:
        out: dict[str, float] = {}
        out["generate"], _ = run_usage(self.script("generate_tilelang_workflow.sh"), self.base_env, self.top)
        plan = plan_environment(self.top, self.base_env, 60.0)
        out["environment"], blob = release_cpu.run_cpu(list(plan.argv), self.base_env, self.top)
        self.env = {**self.base_env, **parse_env_capture(blob, self.base_env), "SERVER_HOST": "127.0.0.1",
                    "SERVER_PORT": str(self.port)}
        out["precompile"], out["rss precompile"] = run_usage(self.script("precompile_tilelang_kernels.sh"),
                                                             self.env, self.top)
        server = subprocess.Popen(self.script("start_qwen3_server.sh"), env=self.env, cwd=self.top,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        assert server.stderr is not None  # PIPE
        t0 = time.monotonic()
        try:
            for line in server.stderr:
                if b"ready to roll" in line:
                    out["server to ready"] = release_cpu.task_cpu_ms(server.pid)
                    out["server wall to ready"] = (time.monotonic() - t0) * 1000
                    break
            else:
                raise SystemExit(f"{self.name}: the server ended before it was ready")
            out["benchmark"], out["rss benchmark"] = run_usage(self.script("run_tilelang_benchmark.sh"),
                                                               {**self.env, "MODEL_KEY": "qwen3"}, self.top)
            out["rss server"] = peak_rss_mib(server.pid)
        finally:
            server.terminate()
            _, _, ru = os.wait4(server.pid, 0)
            server.returncode = 0
            server.stderr.close()
        out["server whole"] = release_cpu._cpu_ms(ru)
        return out

    def requests(self, polls: int, completions: int, idle_s: float) -> dict[str, float]:
        """A ready server's CPU (ms) per /health poll, per streamed completion, per second left alone."""
        server = subprocess.Popen(self.script("start_qwen3_server.sh"), env=self.env, cwd=self.top,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        assert server.stderr is not None  # PIPE
        body = b'{"model":"m","prompt":"hello world, a short prompt","max_tokens":8,"stream":true}'
        req = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        try:
            for line in server.stderr:
                if b"ready to roll" in line:
                    break
            time.sleep(0.1)
            c0 = process_cpu_ms(server.pid)
            for _ in range(polls):  # a new connection each, as the agent polls: its thread ends with it
                with socket.create_connection(("127.0.0.1", self.port)) as conn:
                    conn.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                    while conn.recv(4096):
                        pass
            time.sleep(0.05)
            c1 = process_cpu_ms(server.pid)
            with socket.create_connection(("127.0.0.1", self.port)) as conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                s0 = release_cpu.task_cpu_ms(server.pid)  # one keep-alive connection: its thread is alive
                for _ in range(completions):
                    conn.sendall(req)
                    got = b""
                    while not got.endswith(b"0\r\n\r\n"):
                        data = conn.recv(65536)
                        if not data:
                            raise SystemExit(f"{self.name}: the server closed a keep-alive connection")
                        got += data
                    if b"[DONE]" not in got:
                        raise SystemExit(f"{self.name}: no [DONE] in {got[:200]!r}")
                time.sleep(0.05)
                s1 = release_cpu.task_cpu_ms(server.pid)
            time.sleep(0.05)
            c2 = release_cpu.task_cpu_ms(server.pid)
            time.sleep(idle_s)
            c3 = release_cpu.task_cpu_ms(server.pid)
        finally:
            server.terminate()
            server.wait()
            server.stderr.close()
        idle = (c3 - c2) / idle_s
        return {"per /health poll": (c1 - c0 - idle * 0.05) / polls,
                "per streamed completion": (s1 - s0 - idle * 0.05) / completions, "per s left alone": idle}


def import_costs(runtime_parent: Path, rounds: int) -> dict[str, float]:
    """CPU ms each module adds to ``python3 -S``'s start (median of ``rounds``, modules interleaved)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = str(runtime_parent)
    py = str(Path(os.path.realpath(sys.executable)).parent / "python3")
    samples: dict[str, list[float]] = {m: [] for m in ("pass", *IMPORTS)}
    for m in IMPORTS:  # warm-up: the copy's bytecode written, the page cache
        run_usage([py, "-S", "-c", f"import {m}"], env, ROOT)
    for i in range(rounds):
        names = list(samples)
        names = names[i % len(names):] + names[:i % len(names)]
        for m in names:
            code = "pass" if m == "pass" else f"import {m}"
            cpu, _ = run_usage([py, "-S", "-c", code], env, ROOT)
            samples[m].append(cpu)
    floor = statistics.median(samples["pass"])
    return {"pass": floor, **{m: statistics.median(samples[m]) - floor for m in IMPORTS}}


def part1(args: argparse.Namespace, out: TextIO) -> None:
    with tempfile.TemporaryDirectory(prefix="stdlib-standins-") as tmp:
        base = Path(tmp)
        release_cpu.MODELS.update(make_models(base / "models", ["qwen3"]))
        real_bin = str(Path(os.path.realpath(sys.executable)).parent)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("FLEET_", "M1000_SIM_", "PYTHON"))}
        env["PATH"] = os.pathsep.join([str(DEVICE_TOOL_DIR), real_bin, env.get("PATH", "")])
        env.update(cheap_module_env(1000.0))
        (base / "device").mkdir()
        env["M1000_SIM_DEVICE_DIR"] = str(base / "device")
        variants: list[Variant] = []
        for i, name in enumerate(VARIANTS):
            rt = RUNTIME_DIR if name == SHIPPED else make_runtime(base / f"rt{i}" / "runtime", name)
            top = release_cpu.build(base / f"rel{i}", TEMPLATE_DIR, rt)
            variants.append(Variant(name, top, env, release_cpu.free_port()))
        (base / "imp").mkdir()
        shutil.copytree(RUNTIME_DIR, base / "imp" / "m1000_sim", ignore=shutil.ignore_patterns("__pycache__"))
        for v in variants:  # warm-up: page cache, the kernel cache of precompile, bytecode
            v.round()
        samples: dict[str, dict[str, list[float]]] = {v.name: {} for v in variants}
        load0 = os.getloadavg()[0]
        t0 = time.monotonic()
        for i in range(args.rounds):
            for v in variants[i % len(variants):] + variants[:i % len(variants)]:
                for k, ms in v.round().items():
                    samples[v.name].setdefault(k, []).append(ms)
        wall = time.monotonic() - t0
        serving: dict[str, dict[str, list[float]]] = {v.name: {} for v in variants}
        for i in range(2):
            for v in variants if i % 2 == 0 else list(reversed(variants)):
                for k, ms in v.requests(args.polls, args.requests, 1.0).items():
                    serving[v.name].setdefault(k, []).append(ms)
        imports = import_costs(base / "imp", args.import_rounds)
        load1 = os.getloadavg()[0]
    med = {n: {k: statistics.median(v) for k, v in s.items()} for n, s in samples.items()}
    ship = med[SHIPPED]
    w = out.write
    w(f"## Part 1: the simulated release, stand-ins vs the standard library\n"
      f"cheap qwen3 module at time scale 1000, processes run as the agent runs them; {args.rounds} rounds, "
      f"{len(variants)} variants interleaved (each round another order), {wall:.0f} s; medians; "
      f"load average {load0:.2f} -> {load1:.2f}; {os.cpu_count()} cores; Python {sys.version.split()[0]}\n\n")
    w("CPU ms per process (ratio to shipped in parentheses)\n")
    w(f"{'process':<22}" + "".join(f"{v:>19}" for v in VARIANTS) + "\n")
    for phase in (*PHASES, "server wall to ready"):
        w(f"{phase:<22}" + "".join(f"{med[v][phase]:>10.1f} ({med[v][phase] / ship[phase]:4.2f})" for v in VARIANTS)
          + "\n")
    tot = {v: sum(med[v][p] for p in ("generate", "environment", "precompile", "benchmark", "server whole"))
           for v in VARIANTS}
    w(f"{'per run (all five)':<22}" + "".join(f"{tot[v]:>10.1f} ({tot[v] / tot[SHIPPED]:4.2f})" for v in VARIANTS)
      + "\n\npeak RSS MiB per process\n")
    for p in RSS:
        k = f"rss {p}"
        w(f"{p:<22}" + "".join(f"{med[v][k]:>10.1f} ({med[v][k] / ship[k]:4.2f})" for v in VARIANTS) + "\n")
    sv = {n: {k: statistics.median(v) for k, v in s.items()} for n, s in serving.items()}
    w(f"\na ready server's CPU ms (median of 2 rounds, alternating; {args.polls} /health polls on new connections "
      f"(CPU in 10 ms ticks, exited threads included), "
      f"{args.requests} streamed 8-token completions on one keep-alive connection, 1 s alone)\n")
    for k in ("per /health poll", "per streamed completion", "per s left alone"):
        base_v = sv[SHIPPED][k]
        w(f"{k:<24}" + "".join(f"{sv[v][k]:>10.3f}" + (f" ({sv[v][k] / base_v:4.2f})" if base_v > 0.001 else
                                                      "       ") for v in VARIANTS) + "\n")
    w(f"\nCPU ms an import adds to `python3 -S -c pass` ({imports['pass']:.1f} ms; median of "
      f"{args.import_rounds}, interleaved; a module imported alone includes what it imports)\n")
    for m in IMPORTS:
        w(f"  {m:<20}{imports[m]:>7.1f}\n")
    d_ready = med["all stdlib"]["server to ready"] - ship["server to ready"]
    d_early = sum(med["all stdlib"][p] - ship[p] for p in ("generate", "environment", "precompile"))
    d_run = tot["all stdlib"] - tot[SHIPPED]
    w(f"\nat 100 cheap modules on 2 cores (estimate: 100 x difference / 2): all stdlib adds {d_run:.1f} ms of CPU "
      f"per module and run ({d_run * 100 / 2 / 1000:.2f} s of the 2 cores per fleet run), "
      f"{d_ready * 100 / 2 / 1000:.2f} s to the last of 100 servers starting together being ready, "
      f"{d_early * 100 / 2 / 1000:.2f} s before the last module's precompile starts waiting\n")


def part2(args: argparse.Namespace, out: TextIO) -> None:
    cmd = [sys.executable, str(ROOT / "bench" / "probe.py"), "--requests", str(args.probe_requests),
           "--seconds", str(args.probe_seconds), "--rounds", str(args.probe_rounds)]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    out.write("\n## Part 2: the probe's HTTP/1.1 client against bare client loops (bench/probe.py)\n$ "
              + " ".join(["bench/probe.py", *cmd[2:]]) + "\n" + res.stdout + res.stderr[-2000:])
    rows = {}
    for line in res.stdout.splitlines():
        m = re.match(r"(\S+) \((chosen|bare)\)\s+([\d.]+)\s+([\d.]+)\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)", line)
        if m:
            rows[m.group(1)] = [float(x) for x in m.groups()[2:]]
    if "probe" in rows:
        p = rows["probe"]
        out.write("\nratios to the probe (TTFT p50, TTFT p99, req/s, CPU per request, import, RSS)\n")
        for name, r in rows.items():
            out.write(f"  {name:<18}" + "  ".join(f"{a / b if b else float('nan'):5.2f}"
                                                 for a, b in zip(r, p, strict=True)) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--polls", type=int, default=500)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--import-rounds", type=int, default=10)
    ap.add_argument("--probe-requests", type=int, default=500)
    ap.add_argument("--probe-seconds", type=float, default=1.0)
    ap.add_argument("--probe-rounds", type=int, default=4)
    ap.add_argument("--skip-probe", action="store_true")
    args = ap.parse_args()
    out = sys.stdout
    t0 = time.monotonic()
    part1(args, out)
    t1 = time.monotonic()
    if not args.skip_probe:
        part2(args, out)
    out.write(f"\npart 1 {t1 - t0:.0f} s, part 2 {time.monotonic() - t1:.0f} s; "
              f"this process's children {resource.getrusage(resource.RUSAGE_CHILDREN).ru_utime:.0f} s user\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
