"""Signed, expiring links to one run's HTML report, which a browser opens without a bearer header.

A bearer-authenticated caller mints one (``POST /api/v1/runs/{id}/report/link``); the link is
``/links/runs/<run id>/report.html?expires=<unix seconds>&sig=<hex>``, where ``sig`` is
HMAC-SHA256 under the server's link secret over the link's path and its expiry. The link opens
that one page until it expires, and nothing else: the path is signed, and the bearer guard of
``/api/v1`` knows nothing of signatures. Expiry is bounded (:data:`MAX_TTL`) when a link is made
and when it is opened; signatures are compared in constant time and never logged or said back.

The secret is 32 random bytes in ``<data_dir>/api-link.key`` (mode 0600, made on first use; a
file readable by others is refused, like the tokens file). Deleting it (then restarting
``fleetctl serve``) revokes every link made so far. Decision record: docs/adr/0013.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import stat
import tempfile
from pathlib import Path
from typing import NamedTuple

from controller.errors import FleetctlError
from controller.settings import ConfigError

LINK_PREFIX = "/links/runs"
SECRET_FILE = "api-link.key"
DEFAULT_TTL = 24 * 3600  # seconds a link is valid unless the caller says otherwise
MIN_TTL = 60
MAX_TTL = 7 * 24 * 3600  # at most a week: a link that leaks stops working on its own
SECRET_BYTES = 32


class LinkError(FleetctlError, PermissionError):
    """A link that does not open: expired, too far in the future, or not signed by this server (403)."""

    http_status = 403


class LinkSecretError(ConfigError):
    """The link secret file cannot be used (unreadable, readable by others, too short)."""


class Link(NamedTuple):
    # the link's path and query, to put after the server's base URL
    path: str
    expires: int  # unix seconds


def report_path(run_id: str) -> str:
    """The path of a run's report behind a link (what the signature covers, with the expiry)."""
    return f"{LINK_PREFIX}/{run_id}/report.html"


def signature(secret: bytes, path: str, expires: int) -> str:
    return hmac.new(secret, f"{path}\n{expires}".encode(), hashlib.sha256).hexdigest()


def make_link(secret: bytes, run_id: str, now: float, ttl: int = DEFAULT_TTL) -> Link:
    """A signed link to ``run_id``'s report, valid ``ttl`` seconds from ``now`` (MIN_TTL..MAX_TTL)."""
    if not MIN_TTL <= ttl <= MAX_TTL:
        raise LinkError(f"a link's ttl must be {MIN_TTL}..{MAX_TTL} seconds (got {ttl})")
    path = report_path(run_id)
    expires = int(now) + ttl
    return Link(f"{path}?expires={expires}&sig={signature(secret, path, expires)}", expires)


def check_link(secret: bytes, path: str, expires: int, sig: str, now: float) -> None:
    """Raises :class:`LinkError` unless ``sig`` is this server's signature of ``path`` until ``expires``,
    and ``expires`` is in the future but no further than :data:`MAX_TTL`."""
    if not hmac.compare_digest(signature(secret, path, expires).encode(), sig.encode("utf-8", "replace")):
        raise LinkError("this link is not valid: its signature does not match (altered, or another server's)")
    if expires <= now:
        raise LinkError("this link has expired: ask for a new one")
    if expires > now + MAX_TTL:
        raise LinkError(f"this link expires more than {MAX_TTL} seconds from now: refused")


def load_secret(data_dir: Path) -> bytes:
    """The link secret from ``<data_dir>/api-link.key``, made (0600, atomically: first one wins) when absent."""
    path = data_dir.expanduser() / SECRET_FILE
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{SECRET_FILE}.", dir=path.parent)  # 0600
        try:
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(secrets.token_hex(SECRET_BYTES) + "\n")
                f.flush()
                os.fsync(f.fileno())
            with contextlib.suppress(FileExistsError):  # another process made it meanwhile: theirs is kept
                os.link(tmp, path)
        finally:
            os.unlink(tmp)
    try:
        st = path.stat()
        text = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise LinkSecretError(f"{path}: cannot read the link secret: {exc}") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise LinkSecretError(f"{path}: the link secret is readable by others (chmod 600 {path})")
    if len(text) < 2 * SECRET_BYTES:
        raise LinkSecretError(f"{path}: the link secret is shorter than {2 * SECRET_BYTES} characters "
                              "(delete it: a new one is made)")
    return text.encode()
