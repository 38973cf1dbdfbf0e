"""HTTP beside the API under test: its tokens, a webhook receiver and a release file server (stdlib, loopback)."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

TOKEN = "ci-token-0123456789abcdef"


def write_tokens(path: Path, *tokens: str) -> Path:
    path.write_text("# CI systems\n" + "\n".join(tokens) + "\n")
    path.chmod(0o600)
    return path


AUTH = {"Authorization": f"Bearer {TOKEN}"}


def write_user_tokens(path: Path, entries: Iterable[tuple[str, str, str]]) -> Path:
    """A tokens file of the current format: one ``USER ROLE TOKEN`` line per entry, mode 0600."""
    from controller.serve.tokens import V2_HEADER

    path.write_text(V2_HEADER + "\n" + "".join(f"{user} {role} {token}\n" for user, role, token in entries))
    path.chmod(0o600)
    return path


class ThreadedServer:
    """A stdlib HTTP server on loopback in its own thread; ``serve(handler)`` gives its base URL."""

    server: ThreadingHTTPServer

    def serve(self, handler: type[BaseHTTPRequestHandler]) -> str:
        handler.log_message = lambda *a: None  # type: ignore[method-assign]  # a quiet handler
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Receiver(ThreadedServer):
    """A test HTTP server that records webhook deliveries (answers ``fail_first`` of them with 503)."""

    def __init__(self, fail_first: int = 0) -> None:
        self.got: list[tuple[dict[str, str], bytes]] = []
        self.fail_first = fail_first
        self.arrived = threading.Event()
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server's name
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if outer.fail_first > 0:
                    outer.fail_first -= 1
                    self.send_response(503)
                    self.end_headers()
                    return
                outer.got.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(204)
                self.end_headers()
                outer.arrived.set()

        self.url = self.serve(H) + "/hook"

    def json(self, i: int = 0) -> dict:
        return json.loads(self.got[i][1])


class ReleaseServer(ThreadedServer):
    """A test HTTP server (stdlib, its own thread) serving files of ``root``: ``/<name>`` with a
    Content-Length, ``/stream/<name>`` without one (the body ends when the connection closes),
    ``/redirect-file/<name>`` redirects to ``file://``, ``/redirect-metadata/<name>`` to the cloud metadata
    address; anything else is 404. ``paths``: what was asked."""

    def __init__(self, root: Path) -> None:
        self.paths: list[str] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # http.server's name
                outer.paths.append(self.path)
                path = self.path.split("?", 1)[0]
                if path.startswith(("/redirect-file/", "/redirect-metadata/")):
                    self.send_response(302)
                    self.send_header("Location", "file:///etc/passwd" if path.startswith("/redirect-file/")
                                     else f"http://169.254.169.254/latest/{path.rsplit('/', 1)[-1]}")
                    self.end_headers()
                    return
                stream = path.startswith("/stream/")
                f = root / path.rsplit("/", 1)[-1]
                if not f.is_file():
                    self.send_error(404)
                    return
                data = f.read_bytes()
                self.send_response(200)
                if not stream:
                    self.send_header("Content-Length", str(len(data)))
                else:
                    self.close_connection = True
                self.end_headers()
                self.wfile.write(data)

        self.url = self.serve(H)


def wait_port(port: int, proc: subprocess.Popen[Any], timeout: float = 60) -> None:
    """Until ``proc`` (a ``fleetctl serve``) listens on ``port`` on loopback; AssertionError if it exits first."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise AssertionError(f"fleetctl serve exited: {proc.stderr.read() if proc.stderr else ''}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("the API did not listen in time")
