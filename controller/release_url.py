"""A release given by URL (``POST /api/v1/runs`` with ``"release": "https://..."``): fetched once into
the controller's releases folder, then validated as a path would be.

Pure part: :func:`check_release_url` (http/https only, a host, no credentials in the URL, a
release tarball name). I/O seam: :func:`fetch_release` streams the body into a hidden temp file
beside its destination while hashing it (size limit, per-read timeout and a deadline for the
whole transfer), checks the optional sha256, and renames it to
``<data_dir>/releases/<sha256>/<name>`` (the folder modules of the local transport read from:
staging it there again is a no-op). Whatever fails, nothing half-downloaded is left. What is
logged and said about a URL is :func:`safe_url` (scheme, host, port, path: no query string,
which may carry a signed token).
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import logging
import os
import re
import socket
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any
from urllib.parse import unquote, urlsplit

from contract.records import release_version_of

log = logging.getLogger("fleet.release_url")

SHA256 = re.compile(r"[0-9a-f]{64}")
CHUNK = 1024 * 1024
MAX_REDIRECTS = 5


class ReleaseUrlError(ValueError):
    """A release URL that cannot be used: bad, unreachable, too big, wrong checksum (one line; HTTP 422)."""


@dataclass(frozen=True)
class ReleaseUrl:
    url: str
    name: str  # the tarball's file name (last path segment)

    @property
    def safe(self) -> str:
        return safe_url(self.url)


def is_url(release: str) -> bool:
    """Whether ``release`` is meant as a URL (``scheme://``) rather than a path."""
    return re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", release) is not None


def safe_url(url: str) -> str:
    """The URL without credentials, query or fragment: what may be logged or said back."""
    p = urlsplit(url)
    host = p.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = f":{p.port}" if _port(p) else ""
    return f"{p.scheme}://{host}{port}{p.path}"


def _port(p: Any) -> int | None:
    try:
        return int(p.port) if p.port else None
    except ValueError:
        return None


def check_release_url(url: str) -> ReleaseUrl:
    """The URL, checked before any byte is fetched (pure)."""
    if any(c.isspace() or ord(c) < 32 for c in url):
        raise ReleaseUrlError("release URL: contains spaces or control characters")
    p = urlsplit(url)
    if p.scheme not in ("http", "https"):
        raise ReleaseUrlError(f"release URL: scheme {p.scheme!r} is not supported (http or https)")
    if p.username is not None or p.password is not None or "@" in p.netloc:
        raise ReleaseUrlError("release URL: credentials in the URL are refused (user:password@); serve the release "
                              "without them or put a token in the query string")
    if not p.hostname:
        raise ReleaseUrlError("release URL: no host")
    try:
        p.port  # noqa: B018 - raises on a bad port
    except ValueError:
        raise ReleaseUrlError(f"release URL {safe_url(url)}: bad port") from None
    name = PurePosixPath(unquote(p.path)).name
    if not name or release_version_of(name) is None:
        raise ReleaseUrlError(f"release URL {safe_url(url)}: the path must end in a release tarball name "
                              "(SGLang-MUSA-M1000-M1000_<version>_sglang.tar.gz)")
    return ReleaseUrl(url, name)


def check_sha256(value: str | None) -> str | None:
    if value is None:
        return None
    v = value.strip().lower()
    if not SHA256.fullmatch(v):
        raise ReleaseUrlError("sha256: 64 hexadecimal digits expected")
    return v


class _NoUnsafeRedirects(urllib.request.HTTPRedirectHandler):
    """Redirects to http/https only (no credentials), at most MAX_REDIRECTS."""

    max_redirections = MAX_REDIRECTS

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
        try:
            check_release_url(newurl)
        except ReleaseUrlError as exc:
            raise ReleaseUrlError(f"release URL {safe_url(req.full_url)}: redirected to an unusable URL "
                                  f"({str(exc).split(': ', 1)[-1]})") from None
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def fetch_release(ref: ReleaseUrl, releases_dir: Path, *, sha256: str | None = None, max_bytes: int,
                  timeout: float) -> tuple[Path, str]:
    """Download ``ref`` into ``releases_dir/<sha256>/<name>``; its path and sha256 (hashed while it
    streamed). ReleaseUrlError on any failure (nothing of it left behind)."""
    releases_dir.mkdir(parents=True, exist_ok=True)
    tmp = releases_dir / f".download-{uuid.uuid4().hex}.part"
    opener = urllib.request.build_opener(_NoUnsafeRedirects())
    deadline = time.monotonic() + timeout
    where = f"release URL {ref.safe}"
    t0 = time.monotonic()
    try:
        try:
            req = urllib.request.Request(ref.url, headers={"User-Agent": "m1000-fleet-controller"})
            with opener.open(req, timeout=min(timeout, 30.0)) as resp:
                length = resp.headers.get("Content-Length")
                if length is not None and length.isdigit() and int(length) > max_bytes:
                    raise ReleaseUrlError(f"{where}: {int(length)} bytes, more than the limit of {max_bytes}")
                digest, size = _stream(resp, tmp, max_bytes=max_bytes, deadline=deadline, where=where)
        except http.client.HTTPException as exc:  # a body cut short (IncompleteRead), a bad status line
            raise ReleaseUrlError(f"{where}: download failed ({type(exc).__name__})") from None
        except urllib.error.HTTPError as exc:  # its reason may name a redirect's target: not said
            if 300 <= exc.code < 400:
                raise ReleaseUrlError(f"{where}: redirected to an unusable URL (HTTP {exc.code}; http/https only)") \
                    from None
            raise ReleaseUrlError(f"{where}: HTTP {exc.code} {http.client.responses.get(exc.code, '')}".rstrip()) \
                from None
        except urllib.error.URLError as exc:
            reason = exc.reason if not isinstance(exc.reason, BaseException) else _describe(exc.reason)
            raise ReleaseUrlError(f"{where}: unreachable ({reason})") from None
        except TimeoutError:
            raise ReleaseUrlError(f"{where}: timed out") from None
        except OSError as exc:
            raise ReleaseUrlError(f"{where}: download failed ({_describe(exc)})") from None
        if sha256 is not None and digest != sha256:
            raise ReleaseUrlError(f"{where}: sha256 {digest[:12]}… does not match the expected {sha256[:12]}…")
        dest = releases_dir / digest / ref.name
        dest.parent.mkdir(exist_ok=True)
        os.replace(tmp, dest)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    log.info("release downloaded from %s: %d bytes in %.1f s, sha256 %s", ref.safe, size, time.monotonic() - t0,
             digest[:12])
    return dest, digest


def _stream(resp: IO[bytes], tmp: Path, *, max_bytes: int, deadline: float, where: str) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    with os.fdopen(fd, "wb") as out:
        while block := resp.read(CHUNK):
            size += len(block)
            if size > max_bytes:
                raise ReleaseUrlError(f"{where}: more than the limit of {max_bytes} bytes")
            if time.monotonic() > deadline:
                raise ReleaseUrlError(f"{where}: timed out (the whole download took too long)")
            h.update(block)
            out.write(block)
    return h.hexdigest(), size


def _describe(exc: BaseException) -> str:
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return "timed out"
    return getattr(exc, "strerror", None) or type(exc).__name__
