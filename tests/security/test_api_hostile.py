"""The HTTP API of a real ``fleetctl serve --api-port`` (uvicorn, its own process, a real redis-server as the
broker) under hostile clients: fields of megabytes, 200 MB bodies without a token, release URLs aimed at the
broker and at the cloud metadata address, slowloris connections. Each is refused in one line without the
server reading (or keeping, or logging) what it was sent, while a legitimate client is served."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from simulator.ports import free_port
from tests.support.cli import INV, TARBALL, closed_port, write_release_stub
from tests.support.http_servers import TOKEN, ReleaseServer, write_tokens
from tests.support.procs import stop_group
from tests.support.redis_server import RedisServer
from tests.support.secure import need_redis

pytestmark = [pytest.mark.slow, pytest.mark.redis]

HEADER_TIMEOUT = 2.0  # the served API's api_timeout: its header and body read deadlines (short for the test)


@dataclass
class Served:
    port: int
    proc: subprocess.Popen[bytes]
    log: Path
    redis: RedisServer
    releases: ReleaseServer

    def request(self, method: str, path: str, body: bytes | None = None, token: str | None = TOKEN,
                headers: dict[str, str] | None = None, timeout: float = 30) -> tuple[int, dict]:
        import http.client

        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        hdr = {"Content-Type": "application/json", **(headers or {})}
        if token:
            hdr["Authorization"] = f"Bearer {token}"
        try:
            c.request(method, path, body, hdr)
            r = c.getresponse()
            raw = r.read()
            try:
                return r.status, json.loads(raw or b"{}")
            except ValueError:
                return r.status, {"raw": raw[:300].decode(errors="replace")}
        finally:
            c.close()

    def post_run(self, **body: object) -> tuple[int, dict]:
        return self.request("POST", "/api/v1/runs", json.dumps(body).encode())

    def status(self, field: str) -> int:
        """``VmRSS``/``VmHWM`` of the serve process, bytes."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
        raise AssertionError(field)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    need_redis()
    base = tmp_path_factory.mktemp("hostile")
    redis = RedisServer(base / "redis")
    redis.start()
    (base / "inv.toml").write_text(INV)
    write_release_stub(base / TARBALL)
    releases = ReleaseServer(base)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env.update({"FLEET_BROKER_URL": redis.url, "FLEET_DATA_DIR": str(base / "fleet"),
                "FLEET_INVENTORY": str(base / "inv.toml"), "FLEET_HISTORY": str(base / "history.sqlite"),
                "FLEET_CONTROLLER_METRICS_PORT": "0", "FLEET_API_TIMEOUT": str(HEADER_TIMEOUT),
                "FLEET_RELEASE_URL_HOSTS": '["127.0.0.1"]'})  # the lab's release server is on loopback
    log = base / "serve.log"
    exe = Path(sys.executable).parent / "fleetctl"
    with log.open("wb") as out:
        proc = subprocess.Popen([str(exe), "serve", "--interval", "0.5", "--api-port", str(port), "--tokens",
                                 str(write_tokens(base / "tokens", TOKEN))], env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    s = Served(port, proc, log, redis, releases)
    try:
        end = time.monotonic() + 60
        while True:
            assert proc.poll() is None, log.read_text()
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            assert time.monotonic() < end, "the API did not listen in time"
            time.sleep(0.1)
        yield s
    finally:
        stop_group(proc)
        releases.close()
        redis.stop()
        assert TOKEN not in log.read_text(errors="replace")  # a token is never logged


def test_a_10mb_field_is_refused_in_one_line_and_the_log_stays_small(served) -> None:
    before = served.log.stat().st_size
    got: list[tuple[int | None, int, dict]] = []
    _post(served, json.dumps({"release": "A" * (10 * 1024 * 1024), "models": ["qwen3"]}).encode(), TOKEN, got)
    code, _, body = got[0]
    assert code == 413, got[0][:2]
    assert body["detail"].startswith("request body larger than the limit of 65536 bytes"), body
    # under the body limit, over the field's: 422 naming the field, the value not said back
    code, body = served.post_run(release="/" + "B" * 60_000, models=["qwen3"])
    assert code == 422 and body["detail"].startswith("release: "), body
    assert "BBBBBBBBBB" not in body["detail"] and len(body["detail"]) < 300, body
    # a long path component within the limit (ENAMETOOLONG for the file system): 400, not 500
    code, body = served.post_run(release="/tmp/" + "C" * 3000 + ".tar.gz", models=["qwen3"])
    assert code == 400 and "no such release tarball" in body["detail"] and len(body["detail"]) < 300, body
    code, body = served.post_run(release=TARBALL, models=["q" * 5000])
    assert code == 422 and body["detail"].startswith("models"), body
    time.sleep(0.5)
    assert served.log.stat().st_size - before < 4096, served.log.read_text()[-2000:]


def _post(served: Served, body: bytes | int, token: str | None, out: list[tuple[int | None, int, dict]]) -> None:
    """POST ``body`` (or that many bytes) with its Content-Length as a client that sends it whole whatever the
    server answers: appends (the status answered or None, bytes the server took, the answer's JSON)."""
    size = body if isinstance(body, int) else len(body)
    sock = socket.create_connection(("127.0.0.1", served.port), timeout=30)
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    sock.sendall(f"POST /api/v1/runs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{auth}"
                 f"Content-Length: {size}\r\n\r\n".encode())
    chunk = memoryview(b"x" * (1024 * 1024) if isinstance(body, int) else body)
    sent = 0
    with contextlib.suppress(OSError):
        while sent < size:
            sent += sock.send(chunk[: size - sent] if isinstance(body, int) else chunk[sent:sent + 1024 * 1024])
    status, answer, data = None, {}, b""
    with contextlib.suppress(OSError):
        while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < 2:
            more = sock.recv(65536)
            if not more:
                break
            data += more
    if data.startswith(b"HTTP/1.1 "):
        status = int(data.split()[1])
        with contextlib.suppress(ValueError):
            answer = json.loads(data.split(b"\r\n\r\n", 1)[1])
    sock.close()
    out.append((status, sent, answer))


def test_200mb_bodies_without_a_token_are_refused_unread(served) -> None:
    hwm, rss = served.status("VmHWM"), served.status("VmRSS")
    got: list[tuple[int | None, int, dict]] = []
    threads = [threading.Thread(target=_post, args=(served, 200 * 1024 * 1024, None, got)) for _ in range(4)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    took = time.monotonic() - t0
    assert len(got) == 4
    assert all(status in (401, None) for status, _, _ in got), got
    assert any(status == 401 for status, _, _ in got), got  # the answer reached the client before the reset
    assert all(sent < 64 * 1024 * 1024 for _, sent, _ in got), got  # the server stopped reading: the sender blocked
    grew = served.status("VmHWM") - hwm
    assert grew < 32 * 1024 * 1024, f"peak RSS grew by {grew / 2**20:.0f} MiB (was {rss / 2**20:.0f} MiB)"
    assert took < 30
    # with the token, a body over the limit is refused before it is read too (413), chunked or not
    got.clear()
    _post(served, 200 * 1024 * 1024, TOKEN, got)
    assert got[0][0] in (413, None) and got[0][1] < 64 * 1024 * 1024, got
    sock = socket.create_connection(("127.0.0.1", served.port), timeout=30)
    sock.sendall(f"POST /api/v1/runs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                 "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
    with contextlib.suppress(OSError):
        for _ in range(100):
            sock.sendall(b"10000\r\n" + b"x" * 0x10000 + b"\r\n")
    head = sock.recv(4096)
    sock.close()
    assert head.startswith(b"HTTP/1.1 413 "), head[:200]
    assert served.status("VmHWM") - hwm < 32 * 1024 * 1024
    assert served.request("GET", "/api/v1/runs")[0] == 200  # still serving


def test_release_urls_to_the_broker_or_metadata_are_refused_like_a_closed_port(served) -> None:
    said: dict[str, str] = {}
    targets = {"broker": f"http://127.0.0.1:{served.redis.port}", "metadata": "http://169.254.169.254",
               "closed": f"http://127.0.0.1:{closed_port()}", "api itself": f"http://127.0.0.1:{served.port}",
               "link-local v6": "http://[fe80::1]:8080", "loopback v6": "http://[::1]:9"}
    for what, base in targets.items():
        t0 = time.monotonic()
        code, body = served.post_run(release=f"{base}/{TARBALL}", models=["qwen3"])
        assert code == 422, (what, body)
        assert time.monotonic() - t0 < 10, what  # refused, not left to time out
        said[what] = body["detail"].replace(base, "<URL>")
    assert len(set(said.values())) == 1, said  # no oracle: an open port reads as a closed one
    assert "not allowed" in said["closed"] or "refused" in said["closed"], said
    # the lab's own release server (loopback, allow-listed by release_url_hosts) still serves
    code, body = served.post_run(release=f"{served.releases.url}/{TARBALL}", models=["qwen3"])
    assert code == 201, body


def test_slowloris_connections_are_closed_after_the_timeout_while_a_client_is_served(served) -> None:
    socks: list[socket.socket] = []
    for i in range(120):
        s = socket.create_connection(("127.0.0.1", served.port), timeout=10)
        if i % 3 == 1:  # headers, then a body that never completes
            s.sendall(f"POST /api/v1/runs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n"
                      "Content-Length: 1000\r\n\r\n{".encode())
        elif i % 3 == 2:
            s.sendall(b"GET /api/v1/runs HTTP/1.1\r\nHost: x\r\n")
        socks.append(s)  # i % 3 == 0: connected, silent
    stop = threading.Event()

    def drip() -> None:  # a byte every 0.3 s on each: never idle, never done
        while not stop.wait(0.3):
            for s in socks:
                with contextlib.suppress(OSError):
                    s.send(b"X")

    dripper = threading.Thread(target=drip, daemon=True)
    dripper.start()
    lat: list[float] = []
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < HEADER_TIMEOUT + 3:
            t = time.perf_counter()
            assert served.request("GET", "/api/v1/runs", timeout=10)[0] == 200
            lat.append(time.perf_counter() - t)
            time.sleep(0.1)
    finally:
        stop.set()
        dripper.join()
    open_ = 0
    for s in socks:
        s.settimeout(0.5)
        try:
            while s.recv(65536):  # a 408/400 may come first; then the end
                pass
        except TimeoutError:
            open_ += 1
        except OSError:
            pass
        s.close()
    assert open_ == 0, f"{open_} of {len(socks)} slow connections still open {HEADER_TIMEOUT + 3:.0f} s on"
    lat.sort()
    assert lat[len(lat) // 2] < 1.0, lat  # the legitimate client was served meanwhile
