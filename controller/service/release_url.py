"""A release given by URL (``POST /api/v1/runs`` with ``"release": "https://..."``): fetched once into
the controller's releases folder, then validated as a path would be.

Pure part: :func:`check_release_url` (http/https only, a host, no credentials in the URL, a
release tarball name). I/O seam: :func:`fetch_release` streams the body into a hidden temp file
beside its destination while hashing it (size limit, per-read timeout and a deadline for the
whole transfer), checks the optional sha256, and renames it to
``<data_dir>/releases/<sha256>/<name>`` (the folder modules of the local transport read from:
staging it there again is a no-op). Whatever fails, nothing half-downloaded is left. What is
logged and said about a URL is :func:`safe_url` (scheme, host, port, path: no query string,
which may carry a signed token; at most ~200 characters).

Where a URL may lead is a :class:`UrlPolicy` (pure data, :func:`refusal` decides): never to a
link-local or cloud metadata address, nor to the broker's or the controller's own ports; not to
loopback or the controller's own addresses unless ``release_url_hosts`` lists them; only to the
listed hosts when the list is set. Every address a host name resolves to is checked, the
connection is made to a checked address, and the address it reached is checked again (a name
that resolves elsewhere the second time, DNS rebinding, gains nothing). Refused, closed,
unreachable and not-an-HTTP-server all read the same (:data:`NOT_SERVED`): the answer is no
port scanner; the reason is logged for the operator.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import ipaddress
import logging
import os
import re
import socket
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

from contract.records import release_version_of
from controller.errors import FleetctlError

if TYPE_CHECKING:
    from controller.settings import ControllerSettings

log = logging.getLogger("fleet.release_url")

SHA256 = re.compile(r"[0-9a-f]{64}")
CHUNK = 1024 * 1024
MAX_REDIRECTS = 5
MAX_SHOWN = 200  # characters of a URL said back or logged, at most
NOT_SERVED = "no release server there (refused, unreachable, or not allowed by release_url_hosts)"

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
# cloud instance metadata services outside the link-local ranges (AWS IPv6, Alibaba, Oracle's v4 is link-local)
METADATA = frozenset(ipaddress.ip_address(a) for a in ("fd00:ec2::254", "100.100.100.200"))


class ReleaseUrlError(FleetctlError, ValueError):
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


def clip(text: str, limit: int = MAX_SHOWN) -> str:
    """``text``, or its start and end around an ellipsis and its length when longer than ``limit``."""
    if len(text) <= limit:
        return text
    keep = max(limit - 30, 20) // 2
    return f"{text[:keep]}…{text[-keep:]} ({len(text)} characters)"


def safe_url(url: str) -> str:
    """The URL without credentials, query or fragment, clipped: what may be logged or said back."""
    p = urlsplit(url)
    host = p.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = f":{p.port}" if _port(p) else ""
    return clip(f"{p.scheme}://{host}{port}{p.path}")


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
        raise ReleaseUrlError(f"release URL: scheme {clip(p.scheme, 40)!r} is not supported (http or https)")
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


# --------------------------------------------------------------------------- where a URL may lead
@dataclass(frozen=True)
class UrlPolicy:
    """Where release downloads may connect (pure data).

    ``allow``: host names (lower case) and ``networks`` of ``release_url_hosts`` (empty: any host but
    loopback and ``own``); ``local_ports``: ports of services on this machine (the API, /metrics, a
    broker on loopback or on this host), refused on loopback and ``own``; ``endpoints``: a broker
    elsewhere, ``(address, port)``; ``own``: this machine's addresses."""

    allow: frozenset[str] = frozenset()
    networks: tuple[IPNetwork, ...] = ()
    local_ports: frozenset[int] = frozenset()
    endpoints: frozenset[tuple[IPAddress, int]] = frozenset()
    own: frozenset[IPAddress] = field(default_factory=frozenset)

    @property
    def restricted(self) -> bool:
        return bool(self.allow or self.networks)


def parse_allow_list(entries: Iterable[str]) -> tuple[frozenset[str], tuple[IPNetwork, ...]]:
    """``release_url_hosts`` as (host names, networks): an address or a network (``10.0.0.0/8``) is a network."""
    names: set[str] = set()
    nets: list[IPNetwork] = []
    for e in entries:
        e = e.strip().strip("[]")
        try:
            nets.append(ipaddress.ip_network(e, strict=False))
        except ValueError:
            names.add(e.lower().rstrip("."))
    return frozenset(names), tuple(nets)


def _plain(addr: IPAddress) -> IPAddress:
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def refusal(host: str, addr: IPAddress, port: int, policy: UrlPolicy) -> str | None:
    """Why a download from ``host`` (as the URL names it) may not connect to ``addr``:``port``; None: it may."""
    a = _plain(addr)
    if a.is_link_local or a in METADATA:
        return f"{a} is a link-local or cloud metadata address"
    if a.is_unspecified or a.is_multicast or a == ipaddress.IPv4Address("255.255.255.255"):
        return f"{a} is not a unicast address"
    local = a.is_loopback or a in policy.own
    if (local and port in policy.local_ports) or (a, port) in policy.endpoints:
        return f"{a}:{port} is the broker's or this controller's own port"
    if policy.restricted:
        if host.lower().rstrip(".") in policy.allow or any(a in n for n in policy.networks if n.version == a.version):
            return None
        return f"{host} ({a}) is not in release_url_hosts"
    if local:
        return f"{a} is {'loopback' if a.is_loopback else 'an address of this controller'} (list it in " \
               "release_url_hosts to allow it)"
    return None


def _resolve(host: str, port: int) -> list[tuple[int, IPAddress]]:
    """Every (family, address) ``host`` resolves to, for TCP."""
    out: list[tuple[int, IPAddress]] = []
    for family, _, _, _, sa in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        addr = ipaddress.ip_address(str(sa[0]).split("%", 1)[0])
        if (family, addr) not in out:
            out.append((family, addr))
    return out


def _service_endpoints(url: str, default_port: int) -> list[tuple[str, int]]:
    out = []
    for chunk in url.split(";"):
        p = urlsplit(chunk)
        if p.hostname:
            out.append((p.hostname, _port(p) or default_port))
    return out


def url_policy(settings: ControllerSettings) -> UrlPolicy:
    """The policy of these settings: the broker's endpoints resolved, this machine's addresses read (I/O)."""
    import psutil

    own: set[IPAddress] = set()
    with contextlib.suppress(OSError):
        for addrs in psutil.net_if_addrs().values():
            for a in addrs:
                if a.family in (socket.AF_INET, socket.AF_INET6):
                    with contextlib.suppress(ValueError):
                        own.add(_plain(ipaddress.ip_address(a.address.split("%", 1)[0])))
    local_ports = {p for p in (settings.api_port, settings.metrics_port) if p}
    endpoints: set[tuple[IPAddress, int]] = set()
    scheme = urlsplit(settings.broker_url).scheme
    if scheme in ("redis", "rediss", "sentinel"):
        for host, port in _service_endpoints(settings.broker_url, 26379 if scheme == "sentinel" else 6379):
            try:
                addrs = [a for _, a in _resolve(host, port)]
            # the broker's name does not resolve now: nothing to refuse by it
            except OSError:
                continue
            for a in map(_plain, addrs):
                if a.is_loopback or a in own or a.is_unspecified:
                    local_ports.add(port)
                endpoints.add((a, port))
    allow, nets = parse_allow_list(settings.release_url_hosts)
    return UrlPolicy(allow=allow, networks=nets, local_ports=frozenset(local_ports), endpoints=frozenset(endpoints),
                     own=frozenset(own))


class Refused(OSError):
    """A connection the policy does not allow (its reason is for the log, never for the client)."""


def guarded_connect(policy: UrlPolicy) -> Any:
    """``socket.create_connection`` for http.client that connects only where ``policy`` allows: every
    address the name resolves to checked first, the connection made to a checked address, the
    address reached checked again."""
    def create_connection(address: tuple[str, int], timeout: Any = socket._GLOBAL_DEFAULT_TIMEOUT,  # type: ignore[attr-defined]
                          source_address: Any = None, **_kw: Any) -> socket.socket:
        host, port = address
        addrs = _resolve(host, port)
        if not addrs:
            raise Refused(f"{host} resolves to no address")
        for _family, a in addrs:
            why = refusal(host, a, port, policy)
            if why:
                raise Refused(why)
        last: OSError | None = None
        for family, a in addrs:
            sock = socket.socket(family, socket.SOCK_STREAM)
            try:
                if timeout is not socket._GLOBAL_DEFAULT_TIMEOUT:  # type: ignore[attr-defined]
                    sock.settimeout(timeout)
                if source_address:
                    sock.bind(source_address)
                sock.connect((str(a), port))
                peer = ipaddress.ip_address(str(sock.getpeername()[0]).split("%", 1)[0])
                why = refusal(host, peer, int(sock.getpeername()[1]), policy)
                if why:
                    raise Refused(why)
                return sock
            except Refused:
                sock.close()
                raise
            except OSError as exc:
                sock.close()
                last = exc
        assert last is not None
        raise last

    return create_connection


def _guarded(cls: type[http.client.HTTPConnection], policy: UrlPolicy) -> Any:
    def make(*args: Any, **kw: Any) -> http.client.HTTPConnection:
        conn = cls(*args, **kw)
        conn._create_connection = guarded_connect(policy)  # type: ignore[attr-defined]
        return conn

    return make


class _GuardedHTTP(urllib.request.HTTPHandler):
    def __init__(self, policy: UrlPolicy) -> None:
        super().__init__()
        self.policy = policy

    def http_open(self, req: Any) -> Any:
        return self.do_open(_guarded(http.client.HTTPConnection, self.policy), req)


class _GuardedHTTPS(urllib.request.HTTPSHandler):
    def __init__(self, policy: UrlPolicy) -> None:
        super().__init__()
        self.policy = policy

    def https_open(self, req: Any) -> Any:
        extra = {"check_hostname": self._check_hostname} if hasattr(self, "_check_hostname") else {}
        return self.do_open(_guarded(http.client.HTTPSConnection, self.policy), req,
                            context=self._context, **extra)  # type: ignore[attr-defined]


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
                  timeout: float, policy: UrlPolicy) -> tuple[Path, str]:
    """Download ``ref`` into ``releases_dir/<sha256>/<name>``; its path and sha256 (hashed while it
    streamed), connecting only where ``policy`` allows (directly: no proxy from the environment).
    ReleaseUrlError on any failure (nothing of it left behind)."""
    releases_dir.mkdir(parents=True, exist_ok=True)
    tmp = releases_dir / f".download-{uuid.uuid4().hex}.part"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), _GuardedHTTP(policy),
                                         _GuardedHTTPS(policy), _NoUnsafeRedirects())
    deadline = time.monotonic() + timeout
    where = f"release URL {ref.safe}"
    t0 = time.monotonic()
    try:
        req = urllib.request.Request(ref.url, headers={"User-Agent": "m1000-fleet-controller"})
        try:
            resp = opener.open(req, timeout=min(timeout, 30.0))
        # its reason may name a redirect's target: not said
        except urllib.error.HTTPError as exc:
            exc.close()
            if 300 <= exc.code < 400:
                raise ReleaseUrlError(f"{where}: redirected to an unusable URL (HTTP {exc.code}; http/https only)") \
                    from None
            raise ReleaseUrlError(f"{where}: HTTP {exc.code} {http.client.responses.get(exc.code, '')}".rstrip()) \
                from None
        # refused, closed, unreachable, not HTTP: all one
        except (OSError, http.client.HTTPException) as exc:
            reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
            log.warning("%s: not downloaded: %s", where, clip(_describe(reason) if isinstance(reason, BaseException)
                                                                 else str(reason)))
            raise ReleaseUrlError(f"{where}: {NOT_SERVED}") from None
        try:
            with resp:
                length = resp.headers.get("Content-Length")
                if length is not None and length.isdigit() and int(length) > max_bytes:
                    raise ReleaseUrlError(f"{where}: {int(length)} bytes, more than the limit of {max_bytes}")
                digest, size = _stream(resp, tmp, max_bytes=max_bytes, deadline=deadline, where=where)
        except http.client.HTTPException as exc:  # a body cut short (IncompleteRead)
            raise ReleaseUrlError(f"{where}: download failed ({type(exc).__name__})") from None
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
    if isinstance(exc, Refused):
        return f"refused: {exc}"
    return getattr(exc, "strerror", None) or type(exc).__name__
