"""``fleet-agent worker``: start the module's Celery worker and run it until it is stopped.

One worker per module consumes its own queue (``module.<name>``) with concurrency 1 and prefetch 1: a module never
benchmarks two things at once. At its start the worker claims the module's name (:mod:`agent.heartbeat`), stops
what an earlier agent left and recovers its runs (:mod:`agent.recovery`), registers the run task
(:mod:`agent.task`), and serves /metrics once it is ready.

The worker is one process (Celery's solo pool): the run executes in its main thread, next to the heartbeat and
/metrics threads. A run's hard time limit is the kernel's (:func:`agent.limits.hard_limit`): at the limit
``SIGALRM``, at its default action, ends the worker wherever the run hangs, and the agent that starts again
(systemd restarts it) stops what the run left and ends the run as failed (:func:`agent.recovery.recover`). A run
whose process dies (the limit, the OOM killer, a signal) takes the worker with it; the restart recovers it the same
way (re-queued to resume from its passed keys, or ended when its limit or its deliveries are spent).

Lazy imports: :mod:`agent.metrics` is imported when /metrics or a Pushgateway is configured and the worker
is ready: it adds 1.6 MiB of RSS (``bench/agent.py --imports``, raw
bench/results/agent_20261207_0349_lazy-imports.txt) and loads prometheus_client (59 ms CPU, 7.0 MiB:
bench/results/import_costs_20261207_0346_lazy-libraries.txt).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import socket
import sys
import threading
from typing import Any

from agent import malloc, procs
from agent.broker_start import start_failure
from agent.errors import EvictingBroker
from agent.heartbeat import HeartbeatThread, NameInUse, agent_version, claim_name, same_agent
from agent.outbox import flush_outbox
from agent.recovery import reap_orphans, recover
from agent.settings import AgentSettings
from agent.task import register_tasks, stop_file
from contract.celery_app import make_app, queue_name, share_backend_pool
from contract.eviction import broker_eviction_problem
from contract.kv import KV
from contract.oneline import error_line
from contract.safe_transport import unblock_polls
from contract.settings import SettingsError, load_settings

log = logging.getLogger("fleet.agent")


class MetricsServing:
    """The worker's /metrics exporter and Pushgateway pusher (``agent.metrics`` imported when they start)."""

    def __init__(self, settings: AgentSettings) -> None:
        self.settings = settings
        self.exporter: Any = None
        self.pusher: Any = None

    def start(self) -> None:
        s = self.settings
        if self.exporter is not None or self.pusher is not None or not (s.metrics_port or s.pushgateway_url):
            return
        from agent import metrics

        workdir = s.workdir.expanduser()
        registry = metrics.build_registry(workdir, s.module)
        if s.metrics_port:
            try:
                self.exporter = metrics.start_exporter(workdir, s.module, host=s.metrics_host, port=s.metrics_port,
                                                       registry=registry)
            except OSError as exc:
                log.error("cannot serve /metrics on %s:%s: %s", s.metrics_host, s.metrics_port, exc)
        if s.pushgateway_url:
            self.pusher = metrics.Pusher(registry, s.pushgateway_url, s.module).start()

    def stop(self) -> None:
        if self.pusher is not None:
            self.pusher.stop()
        if self.exporter is not None:
            with contextlib.suppress(Exception):
                self.exporter[0].shutdown()


def settle() -> None:
    """Once the worker serves: the heap pages its imports and start-up freed go back to the system
    (glibc keeps them resident otherwise: ~3 MiB here, ``bench/agent.py``)."""
    gc.collect()
    malloc.trim()


def run_worker(settings: AgentSettings, *, loglevel: str = "INFO") -> None:
    """Run the module's worker until it is stopped (SIGTERM: warm shutdown). Call it from the main thread."""
    logging.basicConfig(level=loglevel, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    workdir = settings.workdir.expanduser()
    workdir.mkdir(parents=True, exist_ok=True)
    app = make_app(settings, module=settings.module)
    # the broker's channels and the result backend: one pool (Redis connections per agent)
    share_backend_pool(app)
    problem = broker_eviction_problem(app)  # an unreachable broker raises here as claim_name would
    if problem:
        raise EvictingBroker(problem)
    lease = claim_name(KV(app), settings)  # NameInUse: another live agent has this module's name
    # what a run starts stays the worker's descendant, daemonized or not
    why = procs.hold_orphans()
    if why:
        log.warning("the worker is not the subreaper of its runs: %s", why)
    left = reap_orphans(workdir)
    if left:
        log.warning("stopped %d processes left by an earlier agent: %s", len(left), left)
    stop_file(workdir).unlink(missing_ok=True)
    os.environ[procs.MARK] = str(workdir)
    # the hard time limit ends the process (agent.limits.hard_limit)
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    register_tasks(app, settings)
    log.info("agent %s for module %s, broker %s, queue %s", agent_version(), settings.module,
             settings.redacted_broker_url(), queue_name(settings.module))
    recover(app, settings)

    from celery.signals import worker_shutting_down

    @worker_shutting_down.connect(weak=False)  # type: ignore[untyped-decorator, unused-ignore]  # celery: no type hints (strict only)
    # SIGTERM: the run in progress stops cleanly and is re-queued
    def _shutting_down(**_: Any) -> None:
        with contextlib.suppress(OSError):
            stop_file(workdir).touch()
        # an idle worker waits in its event loop for the BRPOP's reply (up to polling_interval, 5 s) or the loop's
        # next timer: its BRPOP is ended now, from a thread (a signal handler must not take a redis pool's lock)
        threading.Thread(target=unblock_polls, name="fleet-unblock", daemon=True).start()

    hb = HeartbeatThread(app, settings, lease)
    hb.start()
    served = MetricsServing(settings)
    from celery.signals import worker_ready

    @worker_ready.connect(weak=False)  # type: ignore[untyped-decorator, unused-ignore]  # celery: no type hints (strict only)
    def _serve_metrics(**_: Any) -> None:
        served.start()
        settle()

    try:
        worker = app.Worker(
            queues=[queue_name(settings.module)],
            concurrency=1,
            # one process: the run in the main thread (hard_limit, recover)
            pool="solo",
            prefetch_multiplier=1,
            hostname=f"{settings.module}@{socket.gethostname()}",
            loglevel=loglevel,
            without_gossip=True,
            without_mingle=True,
            without_heartbeat=True,
            optimization="fair",
            redirect_stdouts=False,
        )
        worker.start()
    finally:
        hb.stop()
        hb.join(timeout=5)
        with contextlib.suppress(Exception):
            flush_outbox(hb.kv, workdir, settings.replicas_to_wait())
            if same_agent(hb.kv.lease(settings.module), lease):
                hb.kv.drop_lease(settings.module)
        served.stop()


def main(config: str | None = None, *, loglevel: str = "INFO") -> None:
    """``python -m agent.worker`` and ``fleet-agent worker``: settings from ``FLEET_*`` variables and the
    config file (``config``, else ``FLEET_CONFIG``)."""
    try:
        settings = load_settings(AgentSettings, config)
    except (SettingsError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        print(f"error: settings: {error_line(exc)}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        run_worker(settings, loglevel=loglevel)
    except (NameInUse, EvictingBroker) as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    except Exception as exc:
        # a broker it cannot start on: one line, a status of its own (agent.broker_start)
        failure = start_failure(exc, settings.redacted_broker_url())
        if failure is None:
            raise
        print(f"error: {failure.line}", file=sys.stderr)
        raise SystemExit(failure.code) from None


if __name__ == "__main__":
    main()
