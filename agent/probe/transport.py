"""The probe's only I/O seam: HTTP/1.1 on asyncio streams (standard library).

Chosen by measurement (``bench/probe.py``, docs/concepts/probe.md): against a loopback server that
answers at once it adds less time to first token than bare aiohttp and httpx loops, uses
less CPU per request, imports in a tenth of the time and keeps the agent free of another
dependency (Python 3.10, aarch64). It speaks what the probe needs: keep-alive connections
(a pool), ``Content-Length``, chunked and close-delimited bodies, TLS for ``https://``, a
deadline per request. Every read of the body is stamped with ``time.monotonic_ns()`` as
it arrives; the clock starts when the request is handed to the transport (before a
connection is taken or opened).
Decision record: docs/adr/0006-the-probes-own-http-client.md (h11, httpx, aiohttp measured beside it).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import sys
import time
from urllib.parse import urlsplit

from agent.probe.measure import Exchange

USER_AGENT = "m1000-fleet-probe"
_READ = 65536


class ConnectionFailed(OSError):
    """No HTTP answer at all (refused, reset or closed before a status line)."""


class _Conn:
    __slots__ = ("reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    def close(self) -> None:
        with contextlib.suppress(OSError, RuntimeError):  # already gone, or the loop is closing
            self.writer.close()


class Transport:
    """Keep-alive HTTP/1.1 connections to one server (``base_url``: ``http[s]://host[:port][/prefix]``)."""

    def __init__(self, base_url: str, *, max_idle: int = 64, connect_timeout: float = 10.0) -> None:
        parts = urlsplit(base_url.rstrip("/"))
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{base_url!r}: expected http://host[:port] or https://host[:port]")
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl = ssl.create_default_context() if parts.scheme == "https" else None
        prefix = parts.path.rstrip("/")
        self.prefix = prefix[:-3] if prefix.endswith("/v1") else prefix  # ".../v1" given: the API adds it
        default = (parts.scheme == "https" and self.port == 443) or (parts.scheme == "http" and self.port == 80)
        self.host_header = self.host if default else f"{self.host}:{self.port}"
        if ":" in self.host and not default:
            self.host_header = f"[{self.host}]:{self.port}"
        self.max_idle = max_idle
        self.connect_timeout = connect_timeout
        self._idle: list[_Conn] = []

    @property
    def base_url(self) -> str:
        return f"{'https' if self.ssl else 'http'}://{self.host_header}{self.prefix}"

    async def _open(self) -> _Conn:
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(self.host, self.port, ssl=self.ssl, limit=1 << 20), self.connect_timeout)
        except asyncio.TimeoutError:
            raise ConnectionFailed(f"connecting to {self.host}:{self.port} took more than "
                                   f"{self.connect_timeout:g} s") from None
        except OSError as exc:
            raise ConnectionFailed(f"cannot connect to {self.host}:{self.port}: {exc.strerror or exc}") from None
        return _Conn(reader, writer)

    def _head(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> bytes:
        lines = [f"{method} {self.prefix}{path} HTTP/1.1", f"Host: {self.host_header}", f"User-Agent: {USER_AGENT}",
                 "Accept-Encoding: identity", f"Content-Length: {len(body)}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    async def request(self, method: str, path: str, body: bytes = b"", *, headers: dict[str, str] | None = None,
                      timeout: float = 600.0) -> Exchange:
        """One exchange; never raises for what the server or the network does (see ``Exchange.error``)."""
        t0 = time.monotonic_ns()
        raw = self._head(method, path, body, dict(headers or {})) + body
        ex = Exchange()
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        fired = False

        def fire() -> None:
            nonlocal fired
            fired = True
            if task is not None:
                task.cancel()

        deadline = loop.call_later(timeout, fire)
        conn: _Conn | None = None
        try:
            conn = await self._exchange(raw, ex, t0)
        except asyncio.CancelledError:
            if not fired:
                raise
            if sys.version_info >= (3, 11) and task is not None:
                task.uncancel()
            ex.error, ex.detail = "timeout", f"no complete answer within {timeout:g} s"
        finally:
            deadline.cancel()
            ex.end_ns = ex.end_ns or time.monotonic_ns() - t0
        if conn is not None:
            if len(self._idle) < self.max_idle:
                self._idle.append(conn)
            else:
                conn.close()
        return ex

    async def _exchange(self, raw: bytes, ex: Exchange, t0: int) -> _Conn | None:
        """Send ``raw`` and read the answer into ``ex``; the connection back when it can be reused."""
        conn: _Conn | None = None
        for attempt in (0, 1):
            reused = bool(self._idle)
            try:
                conn = self._idle.pop() if reused else await self._open()
            except ConnectionFailed as exc:
                ex.error, ex.detail = "connection", str(exc)
                return None
            try:
                conn.writer.write(raw)
                status_line = await conn.reader.readuntil(b"\r\n")
                ex.head_ns = time.monotonic_ns() - t0
                break
            except asyncio.CancelledError:
                conn.close()
                raise
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as exc:
                conn.close()
                conn = None
                if reused and attempt == 0:
                    # a keep-alive connection the server had closed: once more on a fresh one
                    continue
                ex.error, ex.detail = "connection", f"no HTTP answer: {type(exc).__name__}: {exc}"
                return None
        assert conn is not None
        try:
            keep = await self._answer(conn, status_line, ex, t0)
        except asyncio.CancelledError:
            conn.close()
            raise
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as exc:
            conn.close()
            ex.end_ns = time.monotonic_ns() - t0
            ex.error = "broken_stream" if ex.status is not None else "connection"
            ex.detail = f"the answer broke off: {type(exc).__name__}: {exc}"
            return None
        ex.end_ns = time.monotonic_ns() - t0
        if not keep:
            conn.close()
            return None
        return conn

    async def _answer(self, conn: _Conn, status_line: bytes, ex: Exchange, t0: int) -> bool:
        """Read status, headers and body; True when the connection can carry another request."""
        reader = conn.reader
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise ValueError(f"not an HTTP/1.x status line: {status_line[:60]!r}")
        ex.status = int(parts[1])
        keep = parts[0] != b"HTTP/1.0"
        length: int | None = None
        chunked = False
        while True:
            line = await reader.readuntil(b"\r\n")
            if line == b"\r\n":
                break
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            value = value.strip()
            if name == b"content-length":
                length = int(value)
            elif name == b"transfer-encoding":
                chunked = b"chunked" in value.lower()
            elif name == b"connection":
                keep = value.lower() != b"close" and (keep or value.lower() == b"keep-alive")
        reads = ex.reads
        if chunked:
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";", 1)[0].strip(), 16)
                if size == 0:
                    while await reader.readuntil(b"\r\n") != b"\r\n":  # trailers
                        pass
                    return keep
                data = await reader.readexactly(size + 2)
                reads.append((time.monotonic_ns() - t0, data[:-2]))
        if length is not None:
            left = length
            while left > 0:
                data = await reader.read(min(left, _READ))
                if not data:
                    raise asyncio.IncompleteReadError(b"", left)
                reads.append((time.monotonic_ns() - t0, data))
                left -= len(data)
            return keep
        while True:  # delimited by the end of the connection
            data = await reader.read(_READ)
            if not data:
                return False
            reads.append((time.monotonic_ns() - t0, data))

    async def get(self, path: str, timeout: float = 10.0) -> tuple[int | None, bytes]:
        ex = await self.request("GET", path, timeout=timeout)
        return ex.status, b"".join(d for _, d in ex.reads)

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for c in idle:
            c.close()
        for c in idle:
            with contextlib.suppress(OSError, RuntimeError, asyncio.TimeoutError):
                await asyncio.wait_for(c.writer.wait_closed(), 1.0)
