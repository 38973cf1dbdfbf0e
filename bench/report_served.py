"""Benchmark: a report and a trend as a fresh ``fleetctl`` process reading the history, through a running
``fleetctl serve`` (a bare HTTP GET), and as ``fleetctl ... --service URL`` (a fresh process asking the service:
what a user types), side by side, on the histories ``bench/report.py --history`` built.

A fresh process pays python's start and the imports (pandas alone ~0.6 s on this machine) before it reads a
row; the service pays them once, at its start, keeps the frames of ended runs decoded and each report's analysis
(keyed by every input, ADR 0034), so a request pays what is left. ``--service`` adds python's start and the CLI's
(no pandas). This script measures the three on the same history in one run, interleaved (``--repeat`` rounds
after one untimed round), and checks that they give the same bytes: the report's Markdown and the trend's
records. The report is timed twice: with the same options each round (its analysis recalled), and with another
``--tolerance`` each round (the frames kept, the analysis made each time).

    .venv/bin/python bench/report.py --history 10000,1000000 --db /tmp/b/b.sqlite   # builds both histories
    .venv/bin/python bench/report_served.py --db /tmp/b/b.sqlite --rows 10000,1000000 [--postgresql]

``--postgresql`` also copies the history into a PostgreSQL server of the script's own
(tests/support/postgres_server.py, ``fleetctl history copy``) and times the reports there too.

The service runs in a folder of its own (an inventory of one local module, a read token), its /metrics on a free
port, its sync every hour (nothing runs on these histories).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench import record

FLEETCTL = str(Path(sys.executable).with_name("fleetctl"))
TREND = ("trend", "-m", "qwen3", "--metric", "decode_tps")  # as bench/report.py --history times it


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Service:
    """``fleetctl serve`` on ``history`` with its API on a free port and a read token of its own."""

    def __init__(self, history: Path | str, folder: Path) -> None:
        (folder / "inventory.toml").write_text(
            '[[module]]\nname = "bench-01"\nhost = "127.0.0.1"\ntransport = "local"\n'
            f'model_root = "{folder}/models"\nworkdir = "{folder}/work"\n')
        tokens = folder / "tokens"
        self.env = {**os.environ, "FLEET_HISTORY": str(history), "FLEET_CONTROLLER_METRICS_PORT": str(_free_port())}
        subprocess.run([FLEETCTL, "serve", "--new-token", "--tokens", str(tokens), "--role", "read", "--user", "bench"],
                       cwd=folder, env=self.env, check=True, capture_output=True)
        self.token = next(ln.split()[2] for ln in tokens.read_text().splitlines() if ln.startswith("bench "))
        self.port = _free_port()
        self.api = f"http://127.0.0.1:{self.port}/api/v1"
        self.proc = subprocess.Popen([FLEETCTL, "serve", "--interval", "3600", "--api-port", str(self.port),
                                      "--tokens", str(tokens)], cwd=folder, env=self.env, start_new_session=True,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 60
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"fleetctl serve did not start: {self.proc.stderr.read().decode()[-2000:]}"
                                     if self.proc.stderr else "fleetctl serve did not start") from None
                time.sleep(0.1)

    def get(self, path: str) -> tuple[float, bytes]:
        """(wall seconds, body) of one GET."""
        req = urllib.request.Request(self.api + path, headers={"Authorization": f"Bearer {self.token}"})
        t = time.perf_counter()
        with urllib.request.urlopen(req, timeout=120) as resp:
            body = resp.read()
        return time.perf_counter() - t, body

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def _fresh(history: Path | str, *args: str) -> tuple[float, bytes]:
    """(wall seconds, stdout) of ``fleetctl --history HISTORY ARGS`` as a fresh process."""
    t = time.perf_counter()
    out = subprocess.run([FLEETCTL, "--history", str(history), *args], capture_output=True, check=True).stdout
    return time.perf_counter() - t, out


def _client(svc: Service, *args: str) -> tuple[float, bytes]:
    """(wall seconds, stdout) of ``fleetctl ARGS --service URL`` as a fresh process."""
    env = {**os.environ, "FLEET_TOKEN": svc.token}
    t = time.perf_counter()
    out = subprocess.run([FLEETCTL, *args, "--service", svc.api], capture_output=True, check=True, env=env).stdout
    return time.perf_counter() - t, out


def _spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f} s [{min(xs):.3f}-{max(xs):.3f}]"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", required=True, help="the history bench/report.py --history built (and its -trend one)")
    ap.add_argument("--rows", default="10000,1000000", help="comma-separated sizes: the runs bench-N")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--postgresql", action="store_true", help="the reports from a PostgreSQL copy of the history too")
    args = ap.parse_args()
    if args.postgresql:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.support.postgres_server import postgres_server  # Debian's postgresql 15, a server of our own

        with postgres_server() as pg:
            url = pg.fresh_database()
            t = time.perf_counter()
            subprocess.run([FLEETCTL, "--history", args.db, "history", "copy", "--to", url], check=True,
                           capture_output=True)
            print(f"history copied into PostgreSQL in {time.perf_counter() - t:.1f} s")
            return _bench(args, url)
    return _bench(args, None)


def _bench(args: argparse.Namespace, pg_url: str | None) -> int:
    db = Path(args.db)
    trend_db = db.with_name(db.stem + "-trend" + db.suffix)
    cases: list[tuple[str, Path | str, tuple[str, ...], str]] = []
    for engine, history in (("SQLite", db), *((("PostgreSQL", pg_url),) if pg_url else ())):
        for n in (int(x) for x in args.rows.split(",")):
            cases.append((f"report of {n:,} rows (md), {engine}", history, ("report", f"bench-{n}"),
                          f"/runs/bench-{n}/report?format=md"))
            cases.append((f"report of {n:,} rows, another --tolerance each round, {engine}", history,
                          ("report", f"bench-{n}", "--tolerance", "{tol}"),
                          f"/runs/bench-{n}/report?format=md&tolerance={{tol}}"))
    if trend_db.exists():
        cases.append(("trend -m qwen3 --metric decode_tps (100 runs x 10 k rows)", trend_db, (*TREND, "-o", "json"),
                      "/trend?models=qwen3&metric=decode_tps"))
    # 0.050001, 0.050002, ...: never the same twice (no analysis recalled), the same report as at 0.05
    tolerances = iter(f"{0.05 + i * 1e-6:.6f}" for i in range(1, 100_000))
    services: dict[Path | str, Service] = {}
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        try:
            t = time.perf_counter()
            for i, history in enumerate(dict.fromkeys(c[1] for c in cases)):
                (Path(tmp) / str(i)).mkdir()
                services[history] = Service(history, Path(tmp) / str(i))
            print(f"{len(services)} service(s) started in {time.perf_counter() - t:.1f} s; {args.repeat} interleaved "
                  "rounds after one untimed round (the service's first request pays its imports), median [min-max]")
            print("| what | fresh fleetctl process | through fleetctl serve (GET) | fleetctl --service | "
                  "--service / fresh | same output |")
            print("| --- | ---: | ---: | ---: | ---: | --- |")
            for what, history, argv, path in cases:
                svc = services[history]
                first, _ = svc.get(path.format(tol=next(tolerances)))
                fresh: list[float] = []
                served: list[float] = []
                client: list[float] = []
                same = True
                for _ in range(args.repeat):
                    tol = [next(tolerances), next(tolerances)]  # one each: neither recalls an analysis
                    wf, out = _fresh(history, *(a.format(tol=tol[0]) for a in argv))
                    ws, body = svc.get(path.format(tol=tol[0]))
                    wc, said = _client(svc, *(a.format(tol=tol[1]) for a in argv))
                    fresh.append(wf)
                    served.append(ws)
                    client.append(wc)
                    if "report" in argv:
                        same &= out == body == said
                    else:
                        same &= json.loads(out) == json.loads(body) == json.loads(said)
                ok &= same
                print(f"| {what} | {_spread(fresh)} | {_spread(served)} (first {first:.2f} s) | {_spread(client)} | "
                      f"{statistics.median(client) / statistics.median(fresh):.2f}x | {'yes' if same else 'NO'} |",
                      flush=True)
        finally:
            for svc in services.values():
                svc.stop()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
