"""A module's PDU outlet through pdudaemon's HTTP listener: on, off, or a cycle (pdudaemon's ``reboot``).

The one I/O seam to the lab's power (ADR 0048): the controller speaks the client side of pdudaemon's own interface,
``GET /power/control/{on,off,reboot}?hostname=PDU&port=PORT`` (as LAVA's and labgrid's pdudaemon clients do), and
pdudaemon drives the PDU with its driver, retries and one-job-at-a-time queue per PDU. pdudaemon answers 200 once
the job is done and 500 when its PDU is not configured or its driver failed after its retries; the request waits
for that answer (a cycle: off, pdudaemon's delay of 5 s, on), bounded by ``timeout``.
"""

from __future__ import annotations

import urllib.error
import urllib.parse
import urllib.request

from controller.errors import FleetctlError
from controller.inventory import PowerEntry

COMMANDS = ("on", "off", "cycle")
# pdudaemon retries a failing driver 5 times 5 s apart before it answers 500
TIMEOUT = 90.0


class PowerError(FleetctlError, OSError):
    """The PDU's pdudaemon did not answer, or answered that the request failed (one line: where and why)."""

    http_status = 502  # the gateway to the PDU failed


def request_url(entry: PowerEntry, command: str) -> str:
    """The pdudaemon URL that does ``command`` (on, off, cycle) on ``entry``'s outlet (pure)."""
    if command not in COMMANDS:
        raise ValueError(f"power command {command!r}: expected one of {', '.join(COMMANDS)}")
    verb = "reboot" if command == "cycle" else command
    query = urllib.parse.urlencode({"hostname": entry.pdu, "port": entry.port})
    return f"{entry.pdudaemon}/power/control/{verb}?{query}"


def power(entry: PowerEntry, command: str, *, timeout: float = TIMEOUT) -> None:
    """Do ``command`` on the outlet and wait for pdudaemon's answer; :class:`PowerError` when it fails."""
    url = request_url(entry, command)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            resp.read(4096)
    except urllib.error.HTTPError as exc:
        body = exc.read(200).decode("utf-8", "replace").strip()
        raise PowerError(f"{entry.where()}: {command} failed: pdudaemon answered HTTP {exc.code} ({body or exc.reason}"
                         "): the PDU is not in its configuration, or its driver failed after its retries (see "
                         "pdudaemon's log)") from None
    except (urllib.error.URLError, OSError) as exc:
        why = exc.reason if isinstance(exc, urllib.error.URLError) else exc
        raise PowerError(f"{entry.where()}: {command} failed: pdudaemon did not answer ({why})") from None
