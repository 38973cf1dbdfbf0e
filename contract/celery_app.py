"""The one Celery app of the fleet, built the same way by agents and the controller.

Everything that must agree between them is derived here from ``BrokerSettings``: JSON
only, late acks, reject on worker lost, prefetch 1, time limits, and a visibility timeout
longer than the hard limit. The embedded default (``filesystem://``) is kombu's
filesystem transport plus Celery's file result backend under ``data_dir``: it needs no
server and no root and works across processes on one machine.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from celery import Celery

from contract.safe_transport import SHARED_POOL_OPTION, share_pool
from contract.settings import RESULT_EXPIRES, BrokerSettings

RUN_TASK = "fleet.run_release"
NOOP_TASK = "fleet.noop"
CONTROLLER_QUEUE = "fleet.controller"


def queue_name(module: str) -> str:
    """Celery queue of a module: ``module.<name>`` with anything unusual replaced."""
    return "module." + re.sub(r"[^A-Za-z0-9_.-]", "_", module)


def task_id(module: str, run_id: str) -> str:
    """The Celery task id of a module's run: ``<module>:<run>``. The module comes first and neither
    holds a ``:``, so a module's Redis ACL pattern for its results (``celery-task-meta-M:*``) matches
    its own results only (``*.M`` also matched a module named ``x.M``)."""
    return f"{module}:{run_id}"


def is_embedded(settings: BrokerSettings) -> bool:
    return urlsplit(settings.broker_url).scheme == "filesystem"


def embedded_folders(data_dir: Path) -> dict[str, Path]:
    base = Path(data_dir).expanduser().resolve()
    return {
        "queue": base / "broker" / "queue",
        "control": base / "broker" / "control",
        "processed": base / "broker" / "processed",
        "results": base / "broker" / "results",
    }


def share_backend_pool(app: Celery) -> bool:
    """An agent's broker channels use its result backend's connection pool for everything but BRPOP (one Redis
    connection fewer per agent, :mod:`contract.safe_transport`); call it once, before the worker connects, from the
    thread that uses ``app.backend`` (Celery's backend is per thread). False: nothing to share (not an agent's app,
    the embedded broker, Sentinel)."""
    key = (app.conf.broker_transport_options or {}).get(SHARED_POOL_OPTION)
    if not key:
        return False

    share_pool(str(key), app.backend.client.connection_pool)
    return True


def make_app(settings: BrokerSettings, name: str = "m1000-fleet", *, module: str | None = None) -> Celery:
    """The fleet's Celery app; ``module``: an agent's own name (its unacked messages under keys of its own)."""
    conf = _common_conf()
    if is_embedded(settings):
        conf.update(_embedded_conf(settings))
    elif urlsplit(settings.broker_url).scheme == "memory":
        conf.update({"broker_url": "memory://", "result_backend": "cache+memory://"})
    else:
        conf.update(_redis_conf(settings, module))
    app = Celery(name, set_as_current=False)
    app.conf.update(conf)
    return app


def _common_conf() -> dict[str, Any]:
    """What every app of the fleet sets, whatever its broker (a fresh dict a call: no two apps share its lists)."""
    return {
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "event_serializer": "json",
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "task_acks_on_failure_or_timeout": True,
        "worker_prefetch_multiplier": 1,
        "worker_concurrency": 1,
        # no task_*_time_limit: the agent's run stops itself at its soft limit and the kernel ends it at the
        # hard one (agent.limits.hard_limit); Celery's own limits need a prefork pool, the agent runs solo
        "result_expires": RESULT_EXPIRES,
        # no STARTED state: nobody reads it (a run's state travels in the KV records), and storing it before the
        # task body (MULTI, SET, PUBLISH, EXEC) was most of what dispatch cost over bare Celery
        # (bench/dispatch.py, like for like: enqueue->start p50 3.07 ms vs bare 1.76 ms with it, 1.24 vs 1.68 without)
        "task_track_started": False,
        "worker_enable_remote_control": False,  # cancel is durable, through the backend
        "worker_send_task_events": False,
        "task_send_sent_event": False,
        "worker_hijack_root_logger": False,
        "broker_connection_retry_on_startup": True,
        "broker_channel_error_retry": True,
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        "task_default_queue": CONTROLLER_QUEUE,
        "task_create_missing_queues": True,
        "enable_utc": True,
    }


def _embedded_conf(settings: BrokerSettings) -> dict[str, Any]:
    """The embedded broker's: kombu's filesystem transport and the file result backend under ``data_dir`` (its
    folders made)."""
    f = embedded_folders(settings.data_dir)
    for p in f.values():
        p.mkdir(parents=True, exist_ok=True)
    return {
        "broker_url": "filesystem://",
        "broker_transport": "contract.safe_transport:FilesystemTransport",  # messages written atomically
        "broker_transport_options": {
            "data_folder_in": str(f["queue"]),
            "data_folder_out": str(f["queue"]),
            "control_folder": str(f["control"]),
            "processed_folder": str(f["processed"]),
            "store_processed": False,
            "polling_interval": 0.05,
        },
        "result_backend": f"file://{f['results']}",
    }


def _redis_conf(settings: BrokerSettings, module: str | None) -> dict[str, Any]:
    """Redis' (or its Sentinels'): broker and result backend on one URL, timeouts, TLS; an agent's (``module``)
    unacked messages under keys of its own."""
    url = settings.broker_url_with_secret()
    conf: dict[str, Any] = {"broker_url": url, "result_backend": url}
    # drops what is not a kombu message (Sentinel: the same checks on kombu's Sentinel transport)
    conf["broker_transport"] = "contract.safe_transport:" + ("SentinelTransport" if settings.is_sentinel
                                                          else "Transport")
    opts: dict[str, Any] = {"visibility_timeout": settings.visibility_timeout, "socket_timeout": 10,
                            "socket_connect_timeout": 5, "retry_on_timeout": True, "health_check_interval": 10,
                            # BRPOP's server-side timeout (kombu: 1 s): a message still arrives at once; an idle
                            # worker wakes (and sends a BRPOP) every 5 s instead of every second
                            "polling_interval": 5}
    # the Sentinels name the master; a failover is followed on the next connection
    if settings.is_sentinel:
        opts.update({"master_name": settings.broker_sentinel_master,
                     "sentinel_kwargs": {"socket_timeout": 5, "socket_connect_timeout": 5}})
    conf["result_backend_transport_options"] = dict(opts)
    # an agent: its unacked messages under keys of its own (one Redis ACL user per module)
    if module:
        q = queue_name(module)
        opts = {**opts, "unacked_key": f"unacked:{q}", "unacked_index_key": f"unacked_index:{q}",
                "unacked_mutex_key": f"unacked_mutex:{q}"}
        # its broker channels take the result backend's pool (share_backend_pool)
        if not settings.is_sentinel:
            opts[SHARED_POOL_OPTION] = q
    conf["broker_transport_options"] = opts
    conf["redis_socket_timeout"] = 10
    conf["redis_socket_connect_timeout"] = 5
    conf["redis_retry_on_timeout"] = True
    conf["redis_backend_health_check_interval"] = 10
    ssl_opts = settings.broker_ssl_options()
    # rediss://: the broker's certificate is always verified (CA, client cert: settings)
    if ssl_opts is not None:
        conf["broker_use_ssl"] = dict(ssl_opts)
        conf["redis_backend_use_ssl"] = dict(ssl_opts)
    return conf
