"""The agent's one HTTP seam: is the release's server up, and is its port free?"""

from __future__ import annotations

import contextlib
import socket
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
