"""The installed m1000-fleet version, as the agent reports it (heartbeats, metrics, its log)."""

from __future__ import annotations


def agent_version() -> str:
    """The m1000-fleet distribution's version; ``0+unknown`` when it is not installed (a bare checkout)
    or its metadata cannot be read: never raises."""
    try:
        from importlib.metadata import version

        return version("m1000-fleet")
    except Exception:  # not installed as a package, or unreadable metadata
        return "0+unknown"
