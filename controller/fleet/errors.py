"""The fleet seam's errors, and what a broker or backend that cannot be reached raises.

The CLI maps :class:`FleetError` and its leaves to one line and exit code 2; the HTTP API to a status.
"""

from __future__ import annotations

import re

from controller.errors import FleetctlError


class FleetError(FleetctlError, RuntimeError):
    """Root of the controller's fleet errors (the CLI maps them to exit code 2)."""


class BrokerUnavailable(FleetError, ConnectionError):
    """The broker cannot be reached, or a run cannot be queued on it (HTTP 503)."""

    http_status = 503


class BadRelease(FleetError, ValueError):
    """A release tarball that is not there."""


class RunIdInUse(FleetError):
    """A run id another controller used: its records are on the broker, and not in this history."""


class EvictingBroker(FleetError, ValueError):
    """The broker's Redis may evict keys (``maxmemory-policy``): the one line names the fix."""

    http_status = 503


def broker_errors() -> tuple[type[BaseException], ...]:
    """What a broker or backend that cannot be reached raises (imports redis and kombu)."""
    from kombu.exceptions import OperationalError
    from redis.exceptions import RedisError

    return (RedisError, OperationalError, ConnectionError, TimeoutError)


def error_line(exc: BaseException) -> str:
    """The first line of an error, credentials in URLs masked, at most 300 characters."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return re.sub(r"://[^@/\s]*@", "://***@", text)[:300]
