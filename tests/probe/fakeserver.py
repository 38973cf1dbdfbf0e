"""A small OpenAI-compatible streaming server on loopback, in the test's own event loop.

Behaviours are switches: a radix-style prefix cache (``prefix_cache``: the longest prefix a
prompt shares with an earlier one is cached, its first token comes ``prefill_s`` per uncached
token later, and usage says ``cached_tokens``) answering with the events of a recorded real
stream (``replay``), refuse engine-specific fields with 422 (as ``transformers
serve`` does), answer with a content length or close-delimited instead of chunked, cut
the stream, hang, fail one request with 500, close keep-alive connections after each
answer. Every request is recorded (path, headers, JSON body).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class FakeServer:
    tokens: int = 3  # per answer, one content chunk each (unless max_tokens is smaller)
    gap_s: float = 0.002
    reject_engine_fields: bool = False
    framing: str = "chunked"  # chunked | length | close
    cut_after: int | None = None  # events sent before the connection is cut
    hang: bool = False
    fail_request: int | None = None  # 1-based generation request answered HTTP 500
    close_after_answer: bool = False
    sim_scale: float | None = None
    usage: bool = True
    prefix_cache: bool = False
    prefill_s: float = 0.0002  # per uncached prompt token (prefix_cache)
    detokenize: bool = False  # answer /detokenize (ids as words ``d<id>``); else 404
    replay: list[bytes] | None = None  # data payloads of a recorded stream, sent in place of the made-up one
    prompts: list[list[Any]] = field(default_factory=list)  # every generation's prompt (prefix_cache)
    seen: list[Seen] = field(default_factory=list)
    connections: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    port: int = 0
    _server: asyncio.base_events.Server | None = None

    async def __aenter__(self) -> FakeServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def generations(self) -> list[Seen]:
        return [s for s in self.seen if s.path.startswith("/v1/") and s.path != "/v1/models"]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:] if x)}
                raw = await reader.readexactly(int(headers.get("content-length", 0)))
                body = json.loads(raw) if raw else None
                self.seen.append(Seen(path, headers, body))
                keep = await self._answer(method, path, body, writer)
                await writer.drain()
                if not keep or self.close_after_answer:
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def _json(self, writer: asyncio.StreamWriter, status: int, obj: Any) -> bool:
        data = json.dumps(obj).encode()
        writer.write(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                     % (status, len(data), data))
        return True

    async def _answer(self, method: str, path: str, body: Any, writer: asyncio.StreamWriter) -> bool:
        if path == "/get_server_info":
            if self.sim_scale is None:
                return self._json(writer, 404, {"detail": "Not Found"})
            return self._json(writer, 200, {"m1000_sim": {"time_scale": self.sim_scale}})
        if path == "/detokenize":
            if not self.detokenize:
                return self._json(writer, 404, {"detail": "Not Found"})
            return self._json(writer, 200, {"text": " ".join(f"d{i}" for i in body["tokens"])})
        if path == "/v1/models":
            return self._json(writer, 200, {"data": [{"id": "fake-model"}]})
        if self.reject_engine_fields and ("ignore_eos" in body or "stream_options" in body):
            return self._json(writer, 422, {"detail": "Unexpected fields in the request"})
        n = len(self.generations)
        if self.fail_request == n:
            return self._json(writer, 500, {"error": {"message": "boom", "code": 500}})
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            return await self._stream(path, body, writer)
        finally:
            self.in_flight -= 1

    async def _stream(self, path: str, body: dict[str, Any], writer: asyncio.StreamWriter) -> bool:
        chat = path == "/v1/chat/completions"
        n = min(self.tokens, int(body.get("max_tokens", self.tokens)))
        prompt = body.get("prompt") if not chat else body["messages"][0]["content"][0]["text"]
        plen = len(prompt) if isinstance(prompt, list) else len(str(prompt).split())
        events: list[bytes] = []
        cached, delay = 0, 0.0
        if self.prefix_cache:
            tokens = prompt if isinstance(prompt, list) else str(prompt).split()
            cached = max((_common(tokens, p) for p in self.prompts), default=0)
            cached = min(cached, len(tokens) - 1)  # at least one token is computed
            self.prompts.append(tokens)
            delay = self.prefill_s * (len(tokens) - cached)
        if self.replay is not None:
            events = list(self.replay)
            n = sum(1 for e in events for c in json.loads(e).get("choices") or () if c.get("text"))
        elif chat:
            events.append(json.dumps({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}).encode())
        for i in range(n):
            choice = {"index": 0, "delta": {"content": f" t{i}"}} if chat else {"index": 0, "text": f" t{i}"}
            if i == n - 1:
                choice["finish_reason"] = "length"
            events.append(json.dumps({"choices": [choice]}).encode())
        if self.usage:
            usage: dict[str, Any] = {"prompt_tokens": plen, "completion_tokens": n}
            if self.prefix_cache:
                usage["prompt_tokens_details"] = {"cached_tokens": cached}
            events.append(json.dumps({"choices": [], "usage": usage}).encode())
        if not self.reject_engine_fields:
            events.append(b"[DONE]")
        frames = [b"data: " + e + b"\n\n" for e in events]
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
        if self.framing == "length":
            data = b"".join(frames)
            writer.write(head + b"Content-Length: %d\r\n\r\n" % len(data))
        elif self.framing == "close":
            writer.write(head + b"Connection: close\r\n\r\n")
        else:
            writer.write(head + b"Transfer-Encoding: chunked\r\n\r\n")
        if delay:
            await asyncio.sleep(delay)  # prefill of the uncached tokens
        for i, f in enumerate(frames):
            if self.hang and i == 1:
                await asyncio.sleep(3600)
            if self.cut_after is not None and i == self.cut_after:
                writer.write(b"%x\r\n" % len(f) + f[: len(f) // 2])
                await writer.drain()
                writer.transport.abort()
                return False
            writer.write(f if self.framing != "chunked" else b"%x\r\n%s\r\n" % (len(f), f))
            await writer.drain()
            if i < len(frames) - 1:
                await asyncio.sleep(self.gap_s)
        if self.framing == "chunked":
            writer.write(b"0\r\n\r\n")
        return self.framing != "close"


def _common(a: list[Any], b: list[Any]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@contextlib.contextmanager
def in_thread(server: FakeServer) -> Iterator[FakeServer]:
    """Serve from an event loop of its own in a daemon thread (for synchronous callers: the CLI)."""
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    stop = asyncio.Event()

    async def main() -> None:
        async with server:
            ready.set()
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    ready.wait(10)
    try:
        yield server
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        loop.close()
