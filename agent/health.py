"""The agent's one HTTP seam: is the release's server up, how long does its first request take, is its port free?"""

from __future__ import annotations

import contextlib
import json
import socket
import time
import urllib.error
import urllib.request

# Never through a proxy: the server is on this module.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def probe(url: str, timeout: float = 2.0) -> bool:
    """True when ``GET url`` answers 200."""
    try:
        with _OPENER.open(url, timeout=timeout) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    """True when something accepts TCP connections on ``host:port``."""
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=timeout):
        return True
    return False


def first_request(base_url: str, timeout: float = 60.0) -> float | None:
    """Wall seconds of one short completion (``POST /v1/completions``, one token out) answered 200; None when it
    is not (the server's figure is then left out: a warm-up request never fails a key)."""
    body = json.dumps({"model": "default", "prompt": "Hello", "max_tokens": 1, "temperature": 0}).encode()
    req = urllib.request.Request(f"{base_url}/v1/completions", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    try:
        with _OPENER.open(req, timeout=timeout) as resp:
            resp.read()
            ok = int(resp.status) == 200
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return time.monotonic() - t0 if ok else None
