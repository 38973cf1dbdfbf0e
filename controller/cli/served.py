"""``fleetctl report --service URL`` and ``fleetctl trend --service URL``: the report and the trend asked of a
running ``fleetctl serve`` (its HTTP API) instead of read from the history here (ADR 0034).

The service has pandas imported and the frames of ended runs decoded; this side is python's own ``urllib`` and
``json``, so a report of a million rows is the service's analysis and one HTTP round trip, not a process that
imports pandas and reads the rows first. The token comes from ``FLEET_TOKEN`` or the file ``FLEET_TOKEN_FILE``
names, never from the command line (it would show in the process list). Every failure is one line, exit 2:
no token, a refused token, no service at the URL, a run or baseline the service does not know.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from email.message import Message
from pathlib import Path
from typing import Any

import typer

from controller.cli.output import fail
from controller.serve import wire

TOKEN_ENV = "FLEET_TOKEN"
TOKEN_FILE_ENV = "FLEET_TOKEN_FILE"
# s: the first report of a run of millions of rows, read from the history's rows, takes a minute
TIMEOUT = 300.0
SERVICE_HELP = ("ask a running `fleetctl serve` instead of reading the history here (http://HOST:PORT; its token "
                "from FLEET_TOKEN or FLEET_TOKEN_FILE)")

__all__ = ["SERVICE_HELP", "Answer", "api_root", "get", "token", "use_service"]


@dataclass(frozen=True)
class Answer:
    """A service's answer: the body, and what it said in its headers."""

    body: bytes
    headers: Message

    def text_header(self, name: str, default: str = "") -> str:
        raw = self.headers.get(name)
        return default if raw is None else str(json.loads(raw))

    def list_header(self, name: str) -> list[str]:
        raw = self.headers.get(name)
        return [] if raw is None else [str(x) for x in json.loads(raw)]

    @property
    def run_id(self) -> str:
        return self.text_header(wire.RUN_HEADER)

    @property
    def verdict(self) -> str:
        return str(self.headers.get(wire.VERDICT_HEADER, ""))

    @property
    def verdict_line(self) -> str:
        return self.text_header(wire.VERDICT_LINE_HEADER)

    @property
    def warnings(self) -> list[str]:
        return self.list_header(wire.WARNINGS_HEADER)

    @property
    def releases(self) -> int:
        return int(self.headers.get(wire.RELEASES_HEADER) or 0)

    @property
    def reach(self) -> str | None:
        return self.text_header(wire.REACH_HEADER) or None


def use_service(ctx: typer.Context, service: str | None, history_given: bool) -> str | None:
    """The service a command asks: ``--service`` (an error with ``--history`` on the command line too), or
    ``FLEET_SERVICE`` unless ``--history`` names a history here."""
    if service is None:
        return None
    source = ctx.get_parameter_source("service")  # click's ParameterSource (typer's own copy of click)
    if history_given:
        if source is not None and source.name == "ENVIRONMENT":
            return None
        raise fail("--service and --history: give one (a service reads its own history)")
    return service


def api_root(url: str) -> str:
    """The API's root of ``url`` (``http://host:8080`` or ``.../api/v1``), or one line naming what is wrong."""
    try:
        parsed = urllib.parse.urlsplit(url.strip())
        ok = parsed.scheme in ("http", "https") and parsed.hostname and not (parsed.query or parsed.fragment)
        parsed.port  # noqa: B018 - a port out of range or not a number raises ValueError
    except ValueError:
        ok = False
    if ok and (parsed.username or parsed.password):  # never echoed: a secret in a URL shows in the process list
        raise fail(f"--service: a URL with credentials is refused; give the token in {TOKEN_ENV} or {TOKEN_FILE_ENV}")
    if not ok:
        raise fail(f"--service {url!r}: not the http(s) URL of a fleetctl serve (e.g. http://controller:8080)")
    path = parsed.path.rstrip("/")
    if not path.endswith(wire.PREFIX):
        path += wire.PREFIX
    return urllib.parse.urlunsplit((parsed.scheme, parsed.netloc, path, "", ""))


def token(env: Mapping[str, str] = os.environ) -> str:
    """The API token: ``FLEET_TOKEN``, else the token alone in the file ``FLEET_TOKEN_FILE`` names."""
    if env.get(TOKEN_ENV, "").strip():
        return env[TOKEN_ENV].strip()
    where = env.get(TOKEN_FILE_ENV, "").strip()
    if not where:
        raise fail(f"--service needs a token of role read: set {TOKEN_ENV}, or {TOKEN_FILE_ENV} to a file holding "
                   "it (`fleetctl serve --new-token` makes one)")
    try:
        words = Path(where).expanduser().read_text(encoding="utf-8").split()
    except (OSError, UnicodeDecodeError) as exc:
        raise fail(f"{TOKEN_FILE_ENV}={where}: cannot be read ({getattr(exc, 'strerror', None) or exc})") from None
    # e.g. serve's tokens file (USER ROLE TOKEN a line): its words are never sent
    if len(words) != 1:
        raise fail(f"{TOKEN_FILE_ENV}={where}: must hold one token alone, holds {len(words)} words")
    return words[0]


def _detail(body: bytes) -> str:
    try:
        got = json.loads(body)
    except ValueError:
        got = None
    detail = got.get("detail") if isinstance(got, dict) else None
    text = str(detail) if detail else body.decode("utf-8", "replace")[:200]
    return " ".join(text.split()) or "no detail"  # one line, whatever a proxy in between answered


def get(service: str, path: str, params: Mapping[str, Any]) -> Answer:
    """GET ``path`` (under the API's root) with ``params`` (None: left out) from the service at ``service``; an
    error status, a refused connection or a timeout is one line and exit 2."""
    root = api_root(service)
    query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
    req = urllib.request.Request(f"{root}{path}{'?' + query if query else ''}",
                                 headers={"Authorization": f"Bearer {token()}"})
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT) as resp:  # http(s) only: checked by api_root
            return Answer(resp.read(), resp.headers)
    except urllib.error.HTTPError as exc:
        detail = _detail(exc.read())
        if exc.code == 401:
            raise fail(f"service {root}: the token was refused ({detail}); check {TOKEN_ENV} / {TOKEN_FILE_ENV}") \
                from None
        raise fail(f"service {root}: {detail}") from None
    except urllib.error.URLError as exc:  # refused, no such host
        raise fail(f"service {root}: {getattr(exc.reason, 'strerror', None) or exc.reason}") from None
    except TimeoutError:
        raise fail(f"service {root}: no answer within {TIMEOUT:.0f} s") from None
    except OSError as exc:  # a connection reset mid-answer
        raise fail(f"service {root}: {exc.strerror or exc}") from None
