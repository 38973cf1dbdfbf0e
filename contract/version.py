"""The installed m1000-fleet version, as the agent reports it (heartbeats, metrics, its log), and the version of
the records it exchanges. Imports nothing heavy: ``fleetctl version`` reads it without pydantic (issue 47)."""

from __future__ import annotations

import platform
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as dist_version

# The contract version: of contract.records (re-exported there), on every record and heartbeat. 2: readers ignore
# fields they do not know in what they only read, an agent runs requests of its version and the one before
# (contract.compat, ADR 0051); 1: every field checked, one version only.
SCHEMA_VERSION = 2


def agent_version() -> str:
    """The m1000-fleet distribution's version; ``0+unknown`` when it is not installed (a bare checkout)
    or its metadata cannot be read: never raises."""
    try:
        return dist_version("m1000-fleet")
    except Exception:
        return "0+unknown"


def versions() -> dict[str, str]:
    """What ``fleetctl version`` shows: the distribution's version ('unknown (not installed)' in a bare checkout),
    the records' schema version and Python's."""
    try:
        v = dist_version("m1000-fleet")
    except PackageNotFoundError:
        v = "unknown (not installed)"
    return {"fleetctl": v, "record_schema": str(SCHEMA_VERSION),
            "works_with_agents": f"contract {SCHEMA_VERSION - 1} to {SCHEMA_VERSION + 1}",
            "python": platform.python_version()}
