"""Whether the Redis broker can hold every agent's connections: read when the controller checks its broker.

Redis refuses a client past its ``maxclients`` ("max number of clients reached"; 10,000 by default), and lowers
``maxclients`` itself at start when its file-descriptor limit cannot hold it (it needs ``maxclients`` + 32), so
the ``maxclients`` that ``INFO clients`` reports (Redis 7+; CONFIG GET before, where the user may run it) is what
the server takes now, both limits counted. :func:`capacity_problem` decides (pure), :func:`broker_capacity_problem`
reads it; the controller warns in one line (:meth:`controller.fleet.seam.FleetSeam.check_broker`), it refuses
nothing: the modules that do not get a connection are the ones to show it.

Connections per agent: measured with ``bench/broker_idle.py`` (a real agent on a real redis-server): 2 while idle
(its BRPOP, and one pool for everything else: its broker channel and its result backend share it,
:mod:`contract.safe_transport`); the pool opens one more while a run's thread and the heartbeat thread use it at
once, so 3 are counted.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from typing import Any

from celery import Celery

from contract.eviction import _where

log = logging.getLogger(__name__)

CONNECTIONS_PER_AGENT = 3
# for controllers (fleetctl serve, commands, the exporter) and an operator's redis-cli
RESERVED = 32
# what redis-server keeps of its file-descriptor limit for itself (maxclients + 32)
FD_MARGIN = 32


def capacity_problem(clients: Mapping[str, Any], agents: int, where: str, *,
                     per_agent: int = CONNECTIONS_PER_AGENT, reserved: int = RESERVED) -> str | None:
    """Why a Redis whose ``INFO clients`` is ``clients`` cannot hold ``agents`` agents' connections, or None (also
    when ``maxclients`` is not there to read). ``where``: how the line names the server."""
    try:
        maxclients = int(clients["maxclients"])
    except (KeyError, TypeError, ValueError):
        return None
    need = agents * per_agent + reserved
    if maxclients >= need:
        return None
    holds = max(0, (maxclients - reserved) // per_agent)
    return (f"redis at {where}: maxclients {maxclients} holds ~{holds} agents at {per_agent} connections each, "
            f"the inventory has {agents}: set maxclients {need} or more (redis.conf) and a file-descriptor limit "
            f"of {need + FD_MARGIN} or more (systemd LimitNOFILE, compose ulimits nofile)")


def broker_capacity_problem(app: Celery, agents: int) -> str | None:
    """:func:`capacity_problem` of ``app``'s Redis (its result backend's: the broker's server), or None where the
    backend is not Redis or ``maxclients`` cannot be read. A broker that cannot be reached raises redis' error."""
    backend = app.backend
    redis_backends = sys.modules.get("celery.backends.redis")
    if redis_backends is None or not isinstance(backend, redis_backends.RedisBackend):  # files, memory://
        return None
    from redis.exceptions import ResponseError

    client = backend.client
    clients: Mapping[str, Any] = client.info("clients")
    # Redis before 7: CONFIG GET, where this user may run it
    if "maxclients" not in clients:
        try:
            clients = client.config_get("maxclients")
        except ResponseError as exc:  # NoPermissionError is one
            log.debug("cannot read maxclients of redis at %s: %s", _where(client), exc)
            return None
    return capacity_problem(clients, agents, _where(client))
