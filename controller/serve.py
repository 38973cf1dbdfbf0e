"""``fleetctl serve``: keeps the run history in step with the broker while no CLI is attached,
judges finished runs, and serves the controller's /metrics (and, when configured, the HTTP API
and the webhooks)."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from typing import Any

from rich.console import Console

from controller import service
from controller.service import Judgement, Session

log = logging.getLogger("fleet.serve")


def sync_all(s: Session, warn: Callable[[str], None] = log.warning,
             on_verdict: Callable[[Judgement], None] | None = None) -> list[str]:
    """One pass: sync every running run; judge the ones that just finished. Returns finished ids.

    A run that cannot be synced or judged is reported through ``warn``; the others go on."""
    fleet = s.fleet()
    done: list[str] = []
    for run_id in fleet.active_runs():
        try:
            view = service.sync(s, run_id)
        except Exception as exc:  # one bad run must not stop the service
            warn(f"sync of {run_id} failed: {exc}")
            continue
        if not view.finished:
            continue
        done.append(run_id)
        try:
            j = service.judge(s, run_id)
        except Exception as exc:  # a report that cannot be built must not stop the service either
            warn(f"run {run_id} finished, but its verdict could not be reached: {exc}")
            continue
        if on_verdict is not None:
            on_verdict(j)
    return done


def _start_metrics(s: Session) -> Any:
    settings = s.settings
    if not settings.metrics_port:
        return None
    from prometheus_client import CollectorRegistry, start_http_server

    from controller.metrics import ControllerCollector

    # its own session: the collector runs in the HTTP server's thread
    own = Session(settings)
    history, fleet, inv = own.history(), own.fleet(), s.inventory()

    def states() -> dict[str, str]:
        return {name: status.state for name, status in fleet.statuses(list(inv.modules)).items()}

    def queues() -> dict[str, int]:
        return fleet.queue_lengths(list(inv.modules))

    registry = CollectorRegistry()
    registry.register(ControllerCollector(history, states, queues))
    return start_http_server(settings.metrics_port, addr=settings.metrics_host, registry=registry)


def serve_forever(s: Session, *, interval: float, once: bool, console: Console) -> None:
    def warn(m: str) -> None:
        console.print(m, highlight=False)

    if once:
        for run_id in sync_all(s, warn):
            console.print(f"run {run_id} finished")
        return
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server = _start_metrics(s)
    settings = s.settings
    console.print(f"fleetctl serve: history {settings.history_path}, broker {settings.redacted_broker_url()}"
                  + (f", /metrics on {settings.metrics_host}:{settings.metrics_port}" if server else ""))
    while not stop.is_set():
        for run_id in sync_all(s, warn):
            console.print(f"run {run_id} finished")
        stop.wait(interval)
    if server:
        server[0].shutdown()
