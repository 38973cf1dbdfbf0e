"""The HTTP API of ``fleetctl serve --api-port`` under hostile clients, measured side by side in one run.

1. Slowloris: a legitimate client (a new connection per ``GET /api/v1/runs``, 20 a second) alone,
   then while ``--slowloris`` connections (300) each send one header byte a second and never end
   their headers (reconnecting when the server closes them, as an attacker would); alternating,
   ``--rounds`` times. p50/p99 of the legitimate client, the ratio attack/alone; how long the
   slow connections were held (the longest) and how many the server closed.
2. Memory: ``--bodies`` (4) parallel POSTs of ``--body-mb`` (200) MB without a token: the serve
   process's RSS before, its peak (VmHWM) growth, its RSS after; how many bytes the server took.

The serve process runs this checkout's code (``PYTHONPATH``): copy this script into an older
checkout to measure that one (``before``; ``BENCH_LABEL=before``: bench/record.py keeps the raw output).

Usage: python bench/api_hostile.py [--slowloris 300] [--seconds 15] [--rounds 2] [--bodies 4] [--body-mb 200]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import os
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from bench import record  # noqa: E402 - bench/record.py, this script's folder

TOKEN = "bench-token-0123456789abcdef"
INV = '[[module]]\nname = "m1"\ntransport = "local"\n'


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proc_status(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def legit(port: int, seconds: float) -> list[float]:
    """A new connection per request, 20 requests a second: latencies, s."""
    lat: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        c.request("GET", "/api/v1/runs", headers={"Authorization": f"Bearer {TOKEN}"})
        r = c.getresponse()
        r.read()
        c.close()
        if r.status != 200:
            raise SystemExit(f"GET /api/v1/runs: HTTP {r.status}")
        lat.append(time.perf_counter() - t0)
        time.sleep(max(0.0, 0.05 - (time.perf_counter() - t0)))
    return lat


class Slowloris:
    """``n`` connections, each sending one header byte a second, reopened when the server closes one."""

    def __init__(self, port: int, n: int) -> None:
        self.port, self.n = port, n
        self.stop = threading.Event()
        self.closed = 0
        self.longest = 0.0
        self.socks: dict[socket.socket, float] = {}
        self.thread = threading.Thread(target=self.run, daemon=True)

    def open_one(self) -> None:
        s = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        s.sendall(b"GET /api/v1/runs HTTP/1.1\r\nHost: x\r\n")
        s.setblocking(False)
        self.socks[s] = time.monotonic()

    def run(self) -> None:
        for _ in range(self.n):
            self.open_one()
        while not self.stop.wait(1.0):
            readable, _, _ = select.select(list(self.socks), [], [], 0)
            gone = []
            for s in readable:  # the server answered or closed: either way this one is done
                with contextlib.suppress(OSError):
                    s.recv(65536)
                gone.append(s)
            for s in list(self.socks):
                if s in gone:
                    continue
                try:
                    s.send(b"X")
                except OSError:
                    gone.append(s)
            for s in gone:
                self.longest = max(self.longest, time.monotonic() - self.socks.pop(s))
                s.close()
                self.closed += 1
                self.open_one()

    def __enter__(self) -> Slowloris:
        self.thread.start()
        time.sleep(2.0)  # all of them open and dripping
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()
        now = time.monotonic()
        for s, t in self.socks.items():
            self.longest = max(self.longest, now - t)
            s.close()


def flood(port: int, size: int, out: list[int]) -> None:
    """POST ``size`` bytes without a token, sending as long as the server takes them: bytes it took."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(f"POST /api/v1/runs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {size}\r\n\r\n".encode())
    chunk = b"x" * (1024 * 1024)
    sent = 0
    with contextlib.suppress(OSError):
        while sent < size:
            sent += sock.send(chunk[: size - sent])
    with contextlib.suppress(OSError):
        sock.recv(4096)
    sock.close()
    out.append(sent)


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * q))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--slowloris", type=int, default=300)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--bodies", type=int, default=4)
    ap.add_argument("--body-mb", type=int, default=200)
    args = ap.parse_args()

    def say(line: str) -> None:
        print(line, flush=True)

    tmp = Path(tempfile.mkdtemp(prefix="bench-api-hostile-"))
    serve = None
    try:
        (tmp / "inv.toml").write_text(INV)
        tokens = tmp / "tokens"
        tokens.write_text(TOKEN + "\n")
        tokens.chmod(0o600)
        port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
        env.update({"FLEET_BROKER_URL": "filesystem://", "FLEET_DATA_DIR": str(tmp / "fleet"),
                    "FLEET_INVENTORY": str(tmp / "inv.toml"), "FLEET_HISTORY": str(tmp / "history.sqlite"),
                    "FLEET_CONTROLLER_METRICS_PORT": "0", "PYTHONPATH": str(ROOT)})
        serve = subprocess.Popen([sys.executable, "-c", "from controller.cli.app import main; main()", "serve",
                                  "--interval", "1", "--api-port", str(port), "--tokens", str(tokens)],
                                 env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                 start_new_session=True)
        end = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > end or serve.poll() is not None:
                    raise SystemExit("fleetctl serve did not start") from None
                time.sleep(0.1)
        rev = subprocess.run(["git", "-C", str(ROOT), "log", "-1", "--format=%h %s"], capture_output=True,
                             text=True).stdout.strip()[:90]
        say(f"code: {rev} ({ROOT}); {os.cpu_count()} cores shared by clients and server")
        legit(port, 2.0)  # warm up
        alone: list[float] = []
        attacked: list[float] = []
        closed, longest = 0, 0.0
        for r in range(args.rounds):
            a = legit(port, args.seconds)
            with Slowloris(port, args.slowloris) as sl:
                b = legit(port, args.seconds)
            alone += a
            attacked += b
            closed += sl.closed
            longest = max(longest, sl.longest)
            say(f"round {r + 1}: alone p50 {statistics.median(a) * 1e3:6.2f} ms ({len(a)} requests) | "
                f"{args.slowloris} slowloris p50 {statistics.median(b) * 1e3:6.2f} ms ({len(b)} requests); "
                f"slow connections closed by the server {sl.closed}, longest held {sl.longest:5.1f} s")
        p_a, p_b = statistics.median(alone), statistics.median(attacked)
        say(f"legitimate client, {args.rounds} x {args.seconds:g} s each: alone p50 {p_a * 1e3:6.2f} ms "
            f"p99 {pct(alone, 0.99) * 1e3:6.2f} ms | under {args.slowloris} slowloris p50 {p_b * 1e3:6.2f} ms "
            f"p99 {pct(attacked, 0.99) * 1e3:6.2f} ms | ratio p50 {p_b / p_a:4.2f}; slow connections closed "
            f"{closed}, longest held {longest:5.1f} s")
        rss0, hwm0 = proc_status(serve.pid, "VmRSS"), proc_status(serve.pid, "VmHWM")
        took: list[int] = []
        t0 = time.monotonic()
        threads = [threading.Thread(target=flood, args=(port, args.body_mb * 1024 * 1024, took))
                   for _ in range(args.bodies)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.monotonic() - t0
        time.sleep(1.0)
        rss1, hwm1 = proc_status(serve.pid, "VmRSS"), proc_status(serve.pid, "VmHWM")
        mib = 1024 * 1024
        say(f"{args.bodies} parallel {args.body_mb} MB bodies without a token: RSS before {rss0 / mib:6.0f} MiB, "
            f"peak growth {(hwm1 - hwm0) / mib:6.0f} MiB (peak {hwm1 / mib:.0f} MiB), RSS after {rss1 / mib:6.0f} "
            f"MiB; server took {sum(took) / mib:6.0f} MiB of {args.bodies * args.body_mb} MiB in {wall:5.1f} s")
        after = legit(port, 2.0)
        say(f"afterwards: p50 {statistics.median(after) * 1e3:6.2f} ms")
    finally:
        if serve is not None:
            os.killpg(serve.pid, signal.SIGTERM)
            serve.wait(timeout=20)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
