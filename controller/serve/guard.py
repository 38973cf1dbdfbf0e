"""The HTTP API's defences against hostile clients, below the routes: what a client may make the
server read, keep and wait for.

- :class:`Guard` (ASGI middleware, in front of every route): the bearer token is checked from the
  headers before a byte of the body is read (401); a body larger than :data:`MAX_BODY_BYTES` is
  refused from its ``Content-Length`` before it is read, or as soon as a chunked one goes past the
  limit (413); a refused body is never read (``Connection: close``: the server stops reading and
  the sender blocks). The routes get the body from memory, whole and bounded.
- :func:`protocol_class`: uvicorn's h11 protocol with read deadlines: the request line and headers
  must arrive within ``api_timeout`` of the connection (or of the previous response on a
  keep-alive connection), the body within as long again of the headers; past a deadline
  the connection is closed. uvicorn's own ``timeout_keep_alive`` closes idle keep-alive
  connections, but is disarmed by any byte: a slowloris client sending one header byte every few
  seconds was held forever.
- :func:`log_config`: uvicorn's logging with every line clipped (:class:`ClippedFormatter`): a
  traceback quoting a user's value (``File name too long: '<10 MB>'``) logs its first and last
  characters only.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import h11
from uvicorn.config import LOGGING_CONFIG
from uvicorn.logging import DefaultFormatter
from uvicorn.protocols.http.h11_impl import H11Protocol

from controller.service.release_url import clip

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

UNAUTHORIZED = "missing or wrong bearer token"
MAX_LOG_LINE = 400  # characters of one line of the server's log, at most
# the largest request body read (413 beyond it); a run request is a few hundred bytes
MAX_BODY_BYTES = 64 * 1024
KEEPALIVE_TIMEOUT = 5  # an idle keep-alive connection is closed after this long, s


def too_large(limit: int) -> str:
    return f"request body larger than the limit of {limit} bytes"


async def reply(send: Send, status: int, detail: str, headers: dict[str, str] | None = None,
                close: bool = False) -> None:
    """A ``{"detail": ...}`` answer; ``close``: the connection ends after it (a body left unread)."""
    body = json.dumps({"detail": detail}).encode()
    hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    hdrs += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    if close:
        hdrs.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": body})


class Guard:
    """ASGI middleware: token before body, body size bounded before it is read (see the module)."""

    def __init__(self, app: ASGIApp, *, check_token: Callable[[str], bool], protected: Callable[[str], bool],
                 max_body: int = MAX_BODY_BYTES) -> None:
        self.app = app
        self.check_token = check_token
        self.protected = protected
        self.max_body = max_body

    def authorized(self, value: bytes | None) -> bool:
        if value is None:
            return False
        scheme, _, credentials = value.decode("latin-1").partition(" ")
        return scheme.lower() == "bearer" and self.check_token(credentials)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: dict[bytes, bytes] = {}
        for k, v in scope["headers"]:
            headers.setdefault(k.lower(), v)
        length_header = headers.get(b"content-length")
        try:
            length = int(length_header) if length_header is not None else None
        except ValueError:
            length = None
        has_body = b"transfer-encoding" in headers or bool(length)
        if self.protected(scope["path"]) and not self.authorized(headers.get(b"authorization")):
            await reply(send, 401, UNAUTHORIZED, {"www-authenticate": "Bearer"}, close=has_body)
            return
        if length is not None and length > self.max_body:
            await reply(send, 413, too_large(self.max_body), close=True)
            return
        if not has_body:
            await self.app(scope, receive, send)
            return
        body = bytearray()
        while True:  # bounded: the limit, and the protocol's body deadline
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            body += msg.get("body", b"")
            if len(body) > self.max_body:
                await reply(send, 413, too_large(self.max_body), close=True)
                return
            if not msg.get("more_body", False):
                break
        whole: list[Message] = [{"type": "http.request", "body": bytes(body), "more_body": False}]

        async def replay() -> Message:
            return whole.pop() if whole else await receive()

        await self.app(scope, replay, send)


class DeadlineH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with deadlines on what the client owes: the headers of its next
    request, or the body of the one it started (none while the application answers)."""

    header_timeout: float = 10.0
    body_timeout: float = 30.0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._deadline: asyncio.TimerHandle | None = None
        self._owed: str | None = None
        super().connection_made(transport)
        self._watch()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        super().connection_lost(exc)

    def _cancel(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _watch(self) -> None:
        """(Re)arm the deadline when what the client owes changes: headers, body, nothing."""
        state = self.conn.their_state
        owed = "headers" if state is h11.IDLE else "body" if state is h11.SEND_BODY else None
        if owed == self._owed:
            return
        self._cancel()
        self._owed = owed
        if owed is not None and not self.transport.is_closing():
            timeout = self.header_timeout if owed == "headers" else self.body_timeout
            self._deadline = self.loop.call_later(timeout, self._expired)

    def _expired(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.logger.debug("closing a connection: its %s did not arrive in time", self._owed)
            self.transport.close()


def protocol_class(header_timeout: float, body_timeout: float) -> type[DeadlineH11Protocol]:
    """A :class:`DeadlineH11Protocol` with these deadlines (uvicorn takes a class, and makes one per connection)."""
    return type("GuardedH11Protocol", (DeadlineH11Protocol,),
                {"header_timeout": header_timeout, "body_timeout": body_timeout})


class ClippedFormatter(DefaultFormatter):
    """uvicorn's formatter, each line of a record (its traceback's too) clipped to :data:`MAX_LOG_LINE`."""

    def format(self, record: logging.LogRecord) -> str:
        return "\n".join(clip(line, MAX_LOG_LINE) for line in super().format(record).splitlines())


def log_config() -> dict[str, Any]:
    """uvicorn's logging configuration, its lines clipped."""
    cfg = copy.deepcopy(LOGGING_CONFIG)
    cfg["formatters"]["default"]["()"] = f"{__name__}.ClippedFormatter"
    return cfg
