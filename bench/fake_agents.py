"""Fake idle agents for ``bench/scale.py``: many modules in one process, each on broker connections of its own.

A real idle ``fleet-agent`` (Celery's solo worker on Redis) holds 3 connections, measured by ``bench/scale.py``
on a real one before each run (CLIENT LIST, MONITOR), and sends on them:

- the consumer: ``BRPOP module.M module.M\\x06\\x163 module.M\\x06\\x166 module.M\\x06\\x169 5``, again as each
  times out (kombu's Redis transport, ``polling_interval`` 5 s; the fakes take the timeout the real agent sent);
- the result backend / ``contract.kv`` client: every heartbeat interval ``SET m1000-fleet:hb:M {...} EX 604800``
  and ``SET m1000-fleet:lease:M {...} EX <result_expires>`` (one pipeline);
- kombu's second channel: at start the restore of unacknowledged messages (``SET unacked_mutex:... NX PX``,
  ``ZRANGE unacked_index:...``, ``DEL``, ``MULTI`` ``LLEN`` x4 ``EXEC``), then idle.

Each fake module does the same on ``conns`` connections of its own (the first three roles; a fourth and further
connection, where asked, connects and stays idle, as kombu's pidbox/event connections of a prefork worker did).
With ``conns`` 1 (an agent on one connection, for what-if runs) its writes wait for the BRPOP to time out (<= 5 s)
and go between two of them; with 2, the restore is skipped.
When its consumer takes a run message it writes progress BENCHMARKING and a heartbeat naming the run, waits
``hold`` s, then its 11 rows and progress DONE (what ``contract.kv.put_final`` writes, unsealed: as the earlier
in-process fake did), all on its own kv connection, with ``contract.kv``'s keys and JSON.

What it does not do: run anything (no release, no processes, no telemetry, no log upload); it does not parse the
Celery message beyond counting it, nor ack it through kombu's unacked index (a solo worker's ``MULTI ZADD HSET
EXEC`` and later ``HDEL ZREM``: 4-6 commands per run, not per second); it does not re-send its final state until
the controller's ack (the controller acks at once here); no health-check PINGs (redis-py sends none on an idle
connection unless asked). Wire protocol: RESP2 over asyncio streams (the agent's redis-py speaks RESP3 after
``HELLO 3``: the same commands).

Run as a child of ``bench/scale.py`` (``python bench/fake_agents.py SPEC.json``); it prints one JSON line when
every connection is open (or refused), then serves until a ``stop`` line (or end of file) on stdin; then it writes what
it saw (when each module took its message) to the path the spec names.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import resource
import sys
import time
from pathlib import Path
from typing import Any


def cmd(*parts: str | bytes | int | float) -> bytes:
    """One command in RESP."""
    out = [b"*%d\r\n" % len(parts)]
    for p in parts:
        b = p if isinstance(p, bytes) else str(p).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(out)


async def reply(r: asyncio.StreamReader) -> Any:
    """One RESP2 reply (errors come back as an Exception value, not raised)."""
    line = await r.readuntil(b"\r\n")
    t, body = line[:1], line[1:-2]
    if t in (b"+", b":"):
        return body
    if t == b"-":
        return Exception(body.decode())
    if t == b"$":
        n = int(body)
        return None if n < 0 else (await r.readexactly(n + 2))[:-2]
    if t == b"*":
        n = int(body)
        return None if n < 0 else [await reply(r) for _ in range(n)]
    raise ValueError(f"bad RESP reply {line[:40]!r}")


class Module:
    def __init__(self, name: str, spec: dict[str, Any], stats: dict[str, Any]) -> None:
        from contract.celery_app import queue_name

        self.name, self.spec, self.stats = name, spec, stats
        q = queue_name(name)
        self.queues = [q, f"{q}\x06\x163", f"{q}\x06\x166", f"{q}\x06\x169"]
        self.kv: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self.lock = asyncio.Lock()
        self.run_id: str | None = None
        self.conns: list[Any] = []

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        try:
            r, w = await asyncio.open_connection(self.spec["host"], self.spec["port"])
            w.write(cmd("PING"))  # redis-py's first command on a new connection
            await w.drain()
            got = await reply(r)
        except (OSError, asyncio.IncompleteReadError) as exc:
            self.stats["refused"] += 1
            self.stats["why"] = str(exc) or type(exc).__name__
            return None
        if isinstance(got, Exception):  # "max number of clients reached": refused after accept
            self.stats["refused"] += 1
            self.stats["why"] = str(got)
            w.close()
            return None
        self.stats["open"] += 1
        return r, w

    async def call(self, *commands: bytes) -> list[Any]:
        assert self.kv is not None
        async with self.lock:
            r, w = self.kv
            w.write(b"".join(commands))
            await w.drain()
            return [await reply(r) for _ in commands]

    def beat(self) -> list[bytes]:
        now = time.time()
        hb = dict(self.spec["hb"], module=self.name, ts=now, run_id=self.run_id)
        lease = dict(self.spec["lease"], ts=now)
        return [cmd("SET", f"m1000-fleet:hb:{self.name}", json.dumps(hb), "EX", 604800),
                cmd("SET", f"m1000-fleet:lease:{self.name}", json.dumps(lease), "EX", self.spec["expires"])]

    async def start(self, n_conns: int) -> list[asyncio.Task[None]]:
        opened = [await self.connect() for _ in range(n_conns)]
        conns = [c for c in opened if c is not None]
        if len(conns) < n_conns:
            return []
        self.conns = conns  # held: a StreamWriter nobody refers to is closed when collected
        self.kv = conns[1] if n_conns > 1 else conns[0]
        if n_conns > 2:  # kombu's restore of unacknowledged messages, on its second channel
            r, w = conns[2]
            token = f"{random.getrandbits(64):x}"
            mutex, index = f"unacked_mutex:{self.queues[0]}", f"unacked_index:{self.queues[0]}"
            batch = [cmd("SET", mutex, token, "NX", "PX", 300000),
                     cmd("ZRANGE", index, f"{time.time() - 18600:.7f}", 0, "BYSCORE", "REV", "WITHSCORES"),
                     cmd("DEL", mutex), cmd("MULTI"), *(cmd("LLEN", q) for q in self.queues), cmd("EXEC")]
            w.write(b"".join(batch))
            await w.drain()
            for _ in batch:
                await reply(r)
        await self.call(*self.beat())
        return [asyncio.create_task(self.consume(*conns[0])), asyncio.create_task(self.beats())]

    async def beats(self) -> None:
        period = self.spec["heartbeat"]
        await asyncio.sleep(random.uniform(0, period))
        while True:
            await self.call(*self.beat())
            await asyncio.sleep(period)

    async def consume(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        shared = self.kv is not None and self.kv[0] is r  # one connection in all: writes go between the BRPOPs
        await asyncio.sleep(random.uniform(0, self.spec["polling"]))  # agents start at different times: no lockstep
        while True:
            async with self.lock if shared else contextlib.nullcontext():
                w.write(cmd("BRPOP", *self.queues, self.spec["polling"]))
                await w.drain()
                got = await reply(r)
            if shared:
                await asyncio.sleep(0)  # let a waiting write take the connection
            if got:
                self.stats["received"][self.name] = time.time()
                asyncio.create_task(self.run())

    async def run(self) -> None:
        spec = self.spec
        self.run_id = run_id = spec["run_id"]
        now = time.time()
        p = dict(spec["progress_benchmarking"], module=self.name, started_at=now, updated_at=now)
        await self.call(cmd("SET", f"m1000-fleet:progress:{run_id}:{self.name}", json.dumps(p), "EX",
                            spec["expires"]), *self.beat())
        await asyncio.sleep(spec["hold"])
        rows = [dict(r, module=self.name) for r in spec["rows"]]
        now = time.time()
        done = dict(spec["progress_done"], module=self.name, started_at=now - spec["hold"], updated_at=now,
                    finished_at=now)
        await self.call(cmd("SET", f"m1000-fleet:rows:{run_id}:{self.name}", json.dumps(rows), "EX", spec["expires"]),
                        cmd("SET", f"m1000-fleet:progress:{run_id}:{self.name}", json.dumps(done), "EX",
                            spec["expires"]))
        self.run_id = None
        self.stats["finished"] += 1


async def main(spec: dict[str, Any]) -> None:
    stats: dict[str, Any] = {"open": 0, "refused": 0, "finished": 0, "received": {}, "why": ""}
    mods = [Module(n, spec, stats) for n in spec["names"]]
    tasks: list[asyncio.Task[None]] = []
    t0 = time.monotonic()
    for i in range(0, len(mods), 200):  # 200 modules connecting at once: no SYN storm on the listen backlog
        for got in await asyncio.gather(*(m.start(spec["conns"]) for m in mods[i:i + 200])):
            tasks += got
    print(json.dumps({"open": stats["open"], "refused": stats["refused"], "why": stats["why"],
                      "connect_s": round(time.monotonic() - t0, 2)}), flush=True)
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    while (await reader.readline()).strip() not in (b"stop", b""):
        pass
    Path(spec["out"]).write_text(json.dumps({"received": stats["received"], "finished": stats["finished"]}))
    for t in tasks:
        t.cancel()


if __name__ == "__main__":
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # this process holds up to ~15,000 connections
    asyncio.run(main(json.loads(Path(sys.argv[1]).read_text())))
