"""Whether the Redis broker may evict keys: read once when the controller or an agent starts using it.

An evicting Redis (``maxmemory`` set and a ``maxmemory-policy`` other than ``noeviction``) drops keys
when it is full: a queued run, a module's unacked message, a final state or rows waiting for the
controller (issue 25: with ``allkeys-lru``, finished modules marked lost and rows never in the history).
The fleet refuses to run on one: :func:`eviction_problem` decides (pure), :func:`broker_eviction_problem`
reads ``INFO memory`` (the one command it needs; a module's ACL user has ``+info`` for it).

- ``maxmemory 0``: no limit (a 32-bit Redis reports its implicit 3 GB limit and ``noeviction``), so
  nothing is evicted whatever the policy: accepted. A limit set later (``CONFIG SET``) is seen at the
  next start of the controller or the agent, not before.
- ``volatile-*`` policies count: heartbeats, progress, rows and results all carry an expiry.
- Sentinel: the master the Sentinels name now is checked; its replicas must be configured the same (a
  failover is not checked again until the next start).
- A user that may not run INFO (an ACL file older than this check): a warning, not a refusal (nothing
  says the broker evicts); ``fleetctl broker acl`` writes users that may.
- The embedded broker and ``memory://`` have nothing to check.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping
from typing import Any

from celery import Celery

log = logging.getLogger(__name__)

NOEVICTION = "noeviction"


def eviction_problem(memory: Mapping[str, Any], where: str) -> str | None:
    """Why a Redis whose ``INFO memory`` is ``memory`` must not be the fleet's broker, or None (pure).

    ``where``: how the line names the server (``host:port``)."""
    policy = str(memory.get("maxmemory_policy", "") or "").strip()
    try:
        limit = int(memory.get("maxmemory", 0) or 0)
    except (TypeError, ValueError):
        limit = -1  # unreadable: judged by the policy alone
    if not policy or policy == NOEVICTION or limit == 0:
        return None
    return (f"redis at {where}: maxmemory-policy {policy} evicts keys; results would be lost — "
            f"set maxmemory-policy {NOEVICTION} (redis.conf or CONFIG SET)")


def _where(client: Any) -> str:
    """``host:port`` of the server ``client`` talks to (Sentinel: the master named now)."""
    pool = client.connection_pool
    if hasattr(pool, "get_master_address"):  # redis.sentinel.SentinelConnectionPool
        host, port = pool.get_master_address()
        return f"{host}:{port} (master {pool.service_name})"
    kw = pool.connection_kwargs
    return str(kw["path"]) if "path" in kw else f"{kw.get('host', 'localhost')}:{kw.get('port', 6379)}"


def broker_eviction_problem(app: Celery) -> str | None:
    """:func:`eviction_problem` of ``app``'s Redis (its result backend's: the broker's server, see
    :func:`contract.celery_app.make_app`), or None where the backend is not Redis. A broker that cannot
    be reached raises redis' error, as the caller's next command would."""
    # made on first use: a Redis URL imports celery.backends.redis (and redis)
    backend = app.backend
    redis_backends = sys.modules.get("celery.backends.redis")
    # files, memory://: redis is not imported for them (14.4 MiB of RSS: bench/import_costs.py)
    if redis_backends is None or not isinstance(backend, redis_backends.RedisBackend):
        return None
    from redis.exceptions import NoPermissionError

    client = backend.client
    try:
        memory = client.info("memory")
    except NoPermissionError as exc:
        log.warning("cannot read the maxmemory-policy of redis at %s (%s): not checked; let this user run INFO "
                    "(+info: fleetctl broker acl writes it)", _where(client), str(exc).splitlines()[0][:200])
        return None
    return eviction_problem(memory, _where(client))
