"""Client overhead of the probe's streaming HTTP client, next to bare client loops, in one run.

A loopback server (its own process, standard-library asyncio) answers every streamed
``/v1/chat/completions`` at once with a real-looking SSE body: a role-only chunk, four
content chunks, a usage-only chunk and ``[DONE]``, chunked transfer encoding, keep-alive.
Each client runs in a process of its own (pinned to its own core when there are two),
so import time and memory are its own:

- **added TTFT** at concurrency 1: send -> first chunk with content, p50 / p99 over
  ``--requests`` sequential requests on one keep-alive connection (warm-up excluded). The
  server answers instantly, so all of it is client, loopback and the server's write;
- **req/s** at concurrency 64 (each request read to its end), and the client's CPU per
  request (what the server's speed does not change);
- **import** time of the client library (best of 5 fresh interpreters) and the client
  process's peak **RSS** after both loads, both on top of what every agent process loads
  anyway (``contract.records``, hence pydantic).

The clients run in ``--rounds`` interleaved rounds (each round in another order), and each
figure is the best of the rounds: on a shared machine, load from elsewhere only ever makes
a figure worse, and it hits every client alike.

Candidates: bare aiohttp, bare httpx, bare h11 (the sans-I/O HTTP/1.1 parser httpx builds on)
on asyncio streams and a bare HTTP/1.1 client on asyncio streams (standard library); the
chosen one, the probe (``agent.probe``: its transport on asyncio streams, the SSE parser and
the metric definitions, reporting its own TTFT), runs next to them, and so does its HTTP
client alone (``transport``: ``agent.probe.transport``, no SSE parsing, timed as the bare
loops are). Goal: the probe's added TTFT p50 at most 0.3 ms; exit 1 otherwise. aiohttp,
httpx and h11 are test extras, not agent dependencies: a client that is not installed is
named and skipped.

    .venv/bin/python bench/probe.py [--requests 1500] [--seconds 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # before bench/ (this script's folder): bench/agent.py is not the agent package
from bench import record  # noqa: E402 - bench/record.py, this script's folder

GOAL_TTFT_P50_MS = 0.3
CONCURRENCY = 64
CHOSEN = "probe"
CLIENTS = ("probe", "transport", "asyncio-streams", "aiohttp", "httpx", "h11")
IMPORTS = {"probe": "agent.probe", "aiohttp": "aiohttp", "httpx": "httpx", "asyncio-streams": "asyncio", "h11": "h11",
           "transport": "agent.probe.transport"}
PATH = "/v1/chat/completions"
BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
                   "max_tokens": 4}).encode()


# ---------------------------------------------------------------------------- the server
def _sse_body() -> bytes:
    base = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    events = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant"}}]}]
    events += [{**base, "choices": [{"index": 0, "delta": {"content": f" t{i}"}}]} for i in range(4)]
    events.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
    events.append({**base, "choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": 4, "total_tokens": 5}})
    out = b""
    for payload in [json.dumps(e, separators=(",", ":")).encode() for e in events] + [b"[DONE]"]:
        event = b"data: " + payload + b"\n\n"
        out += b"%x\r\n%s\r\n" % (len(event), event)
    return out + b"0\r\n\r\n"


RESPONSE = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" + _sse_body())


async def _handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
            if length:
                await reader.readexactly(length)
            writer.write(RESPONSE)
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def _serve(port_file: str) -> None:
    server = await asyncio.start_server(_handle, "127.0.0.1", 0, backlog=512)
    port = server.sockets[0].getsockname()[1]
    Path(port_file).write_text(str(port))
    async with server:
        await server.serve_forever()


# ---------------------------------------------------------------------------- the clients
# One request each: returns (seconds from send to the first content chunk, seconds to the end).
Client = tuple[Callable[[], Awaitable[tuple[float, float]]], Callable[[], Awaitable[None]]]  # (one request, close)


def _aiohttp_factory(url: str) -> Client:
    import aiohttp

    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=CONCURRENCY, force_close=False))
    headers = {"Content-Type": "application/json"}

    async def one() -> tuple[float, float]:
        t0 = time.perf_counter()
        first = 0.0
        async with session.post(url, data=BODY, headers=headers) as r:
            async for data in r.content.iter_any():
                if not first and b'"content"' in data:
                    first = time.perf_counter()
        return first - t0, time.perf_counter() - t0

    return one, session.close


def _httpx_factory(url: str) -> Client:
    import httpx

    client = httpx.AsyncClient(limits=httpx.Limits(max_connections=CONCURRENCY,
                                                   max_keepalive_connections=CONCURRENCY), timeout=30)
    headers = {"Content-Type": "application/json"}

    async def one() -> tuple[float, float]:
        t0 = time.perf_counter()
        first = 0.0
        async with client.stream("POST", url, content=BODY, headers=headers) as r:
            async for data in r.aiter_raw():
                if not first and b'"content"' in data:
                    first = time.perf_counter()
        return first - t0, time.perf_counter() - t0

    return one, client.aclose


def _streams_factory(url: str) -> Client:
    host, port = url.split("//", 1)[1].split("/", 1)[0].split(":")
    pool: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
    request = (f"POST {PATH} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(BODY)}\r\n\r\n").encode() + BODY

    async def one() -> tuple[float, float]:
        t0 = time.perf_counter()
        first = 0.0
        conn = pool.pop() if pool else await asyncio.open_connection(host, int(port))
        reader, writer = conn
        writer.write(request)
        await reader.readuntil(b"\r\n\r\n")
        while True:
            size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
            data = await reader.readexactly(size + 2)
            if not size:
                break
            if not first and b'"content"' in data:
                first = time.perf_counter()
        pool.append(conn)
        return first - t0, time.perf_counter() - t0

    async def close() -> None:
        for _, w in pool:
            w.close()

    return one, close


def _h11_factory(url: str) -> Client:
    import h11

    host, port = url.split("//", 1)[1].split("/", 1)[0].split(":")
    pool: list[tuple[asyncio.StreamReader, asyncio.StreamWriter, h11.Connection]] = []
    headers = [("Host", f"{host}:{port}"), ("Content-Type", "application/json"), ("Content-Length", str(len(BODY)))]

    async def one() -> tuple[float, float]:
        t0 = time.perf_counter()
        first = 0.0
        if pool:
            reader, writer, conn = pool.pop()
        else:
            reader, writer = await asyncio.open_connection(host, int(port))
            conn = h11.Connection(h11.CLIENT)
        writer.write(conn.send(h11.Request(method="POST", target=PATH, headers=headers)))
        writer.write(conn.send(h11.Data(data=BODY)))
        writer.write(conn.send(h11.EndOfMessage()))
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await reader.read(65536))
            elif isinstance(event, h11.Data):
                if not first and b'"content"' in event.data:
                    first = time.perf_counter()
            elif isinstance(event, h11.EndOfMessage):
                break
        conn.start_next_cycle()
        pool.append((reader, writer, conn))
        return first - t0, time.perf_counter() - t0

    async def close() -> None:
        for _, w, _ in pool:
            w.close()

    return one, close


def _transport_factory(url: str) -> Client:
    from agent.probe.transport import Transport

    t = Transport(url.rsplit(PATH, 1)[0], max_idle=CONCURRENCY)
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}

    async def one() -> tuple[float, float]:  # the probe's HTTP client alone, timed as the bare loops are
        t0 = time.perf_counter()
        ex = await t.request("POST", PATH, BODY, headers=headers)
        if ex.error:
            raise RuntimeError(f"{ex.error}: {ex.detail}")
        first = next((ns for ns, data in ex.reads if b'"content"' in data), 0)
        return first / 1e9, time.perf_counter() - t0

    return one, t.aclose


def _probe_factory(url: str) -> Client:
    from agent.probe.measure import interpret
    from agent.probe.transport import Transport

    t = Transport(url.rsplit(PATH, 1)[0], max_idle=CONCURRENCY)
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}

    async def one() -> tuple[float, float]:  # the figures the probe itself reports
        r = interpret(await t.request("POST", PATH, BODY, headers=headers))
        if not r.ok:
            raise RuntimeError(f"{r.error}: {r.detail}")
        return (r.ttft_ms or 0.0) / 1000, (r.e2e_ms or 0.0) / 1000

    return one, t.aclose


FACTORIES = {"aiohttp": _aiohttp_factory, "httpx": _httpx_factory, "asyncio-streams": _streams_factory,
             "probe": _probe_factory, "h11": _h11_factory,
             "transport": _transport_factory}


async def _measure(name: str, url: str, n: int, seconds: float) -> dict[str, float]:
    one, close = FACTORIES[name](url)
    try:
        for _ in range(200):  # warm-up: connection, caches, lazy imports
            await one()
        ttft: list[float] = []
        for _ in range(n):
            first, _end = await one()
            ttft.append(first * 1000)
        ttft.sort()
        stop = time.perf_counter() + seconds
        done = 0

        async def worker() -> None:
            nonlocal done
            while time.perf_counter() < stop:
                await one()
                done += 1

        cpu0 = time.process_time()
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
        wall = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
    finally:
        await close()
    return {"ttft_p50_ms": statistics.median(ttft), "ttft_p99_ms": ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))],
            "rps": done / wall, "cpu_us_per_request": cpu / max(done, 1) * 1e6,
            "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


# ---------------------------------------------------------------------------- the run
def _pin(cpu: int) -> None:
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(0, {cpu})


def _child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def import_ms(module: str, runs: int = 5) -> float:
    """What importing ``module`` adds to an agent process (``contract.records``, hence pydantic, already
    loaded): the best of ``runs`` fresh interpreters."""
    code = f"import contract.records, time; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    vals = [float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                 env=_child_env()).stdout) * 1000 for _ in range(runs)]
    return min(vals)


BEST = {"ttft_p50_ms": min, "ttft_p99_ms": min, "rps": max, "cpu_us_per_request": min, "rss_mib": min}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1500, help="sequential requests for TTFT (after 200 warm-up)")
    ap.add_argument("--seconds", type=float, default=2.0, help="length of the concurrency-64 load")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, clients interleaved; the best of each is kept")
    ap.add_argument("--clients", default=",".join(CLIENTS))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--url", help=argparse.SUPPRESS)
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.serve:
        _pin(0)
        asyncio.run(_serve(a.serve))
        return 0
    if a.child:
        _pin(1)
        import contract.records  # noqa: F401 - every client runs inside the agent: its records are loaded anyway
        print(json.dumps(asyncio.run(_measure(a.child, a.url, a.requests, a.seconds))))
        return 0
    clients = [c.strip() for c in a.clients.split(",") if c.strip()]
    for name in list(clients):
        if importlib.util.find_spec(IMPORTS[name]) is None:
            print(f"{name}: not installed (a test extra: pip install {name}); skipped")
            clients.remove(name)
    port_file = Path(f"/tmp/bench-probe-{os.getpid()}.port")
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port_file)], env=_child_env())
    runs: dict[str, list[dict[str, float]]] = {c: [] for c in clients}
    load0 = os.getloadavg()[0]
    try:
        while not port_file.exists() or not port_file.read_text():
            time.sleep(0.02)
        url = f"http://127.0.0.1:{int(port_file.read_text())}{PATH}"
        base_rss = _bare_rss()
        for r in range(a.rounds):  # interleaved, each round in another order: load from elsewhere hits all alike
            order = clients[r % len(clients):] + clients[:r % len(clients)]
            for name in order:
                out = subprocess.run([sys.executable, __file__, "--child", name, "--url", url, "--requests",
                                      str(a.requests), "--seconds", str(a.seconds)], capture_output=True, text=True,
                                     env=_child_env())
                if out.returncode:
                    print(f"{name}: failed: {out.stderr.strip().splitlines()[-1:]}")
                    continue
                runs[name].append(json.loads(out.stdout))
    finally:
        server.terminate()
        server.wait()
        port_file.unlink(missing_ok=True)
    print(f"loopback SSE server answering at once; per round {a.requests} sequential requests, then "
          f"{a.seconds:g} s at concurrency {CONCURRENCY}; best of {a.rounds} interleaved rounds; {os.cpu_count()} "
          f"cores (server and client pinned to one each); load average {load0:.1f} -> {os.getloadavg()[0]:.1f}; "
          f"Python {sys.version.split()[0]}; RSS of an interpreter with contract.records {base_rss:.1f} MiB\n")
    print(f"{'client':<26}{'TTFT p50 ms':>12}{'TTFT p99 ms':>12}{'req/s @64':>11}{'CPU us/req':>11}"
          f"{'import ms':>10}{'RSS MiB':>9}")
    results: dict[str, dict[str, float]] = {}
    for name in clients:
        if not runs[name]:
            continue
        best = {k: pick(x[k] for x in runs[name]) for k, pick in BEST.items()}
        best["import_ms"] = import_ms(IMPORTS[name])
        results[name] = best
        label = f"{name} (chosen)" if name == CHOSEN else f"{name} (bare)"
        print(f"{label:<26}{best['ttft_p50_ms']:>12.3f}{best['ttft_p99_ms']:>12.3f}{best['rps']:>11.0f}"
              f"{best['cpu_us_per_request']:>11.0f}{best['import_ms']:>10.0f}{best['rss_mib']:>9.1f}")
    chosen = results.get(CHOSEN)
    if chosen is None:
        print(f"\n{CHOSEN}: not measured")
        return 1 if CHOSEN in clients else 0
    ok = chosen["ttft_p50_ms"] <= GOAL_TTFT_P50_MS
    print(f"\n{CHOSEN}: added TTFT p50 {chosen['ttft_p50_ms']:.3f} ms (goal <= {GOAL_TTFT_P50_MS} ms): "
          f"{'ok' if ok else 'ABOVE GOAL'}")
    return 0 if ok else 1


def _bare_rss() -> float:
    code = "import contract.records, resource; print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)"
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                env=_child_env()).stdout)


if __name__ == "__main__":
    raise SystemExit(record.main(main, __file__))
