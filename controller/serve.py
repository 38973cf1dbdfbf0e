"""``fleetctl serve``: keeps the run history in step with the broker while no CLI is attached,
judges finished runs, and serves the controller's /metrics."""

from __future__ import annotations

import importlib.util
import logging
import signal
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rich.console import Console

if TYPE_CHECKING:
    from controller.cli import State

log = logging.getLogger("fleet.serve")


def sync_all(st: State, warn: Callable[[str], None] = log.warning) -> list[str]:
    """One pass: sync every running run; judge the ones that just finished. Returns finished ids.

    A run that cannot be synced or judged is reported through ``warn``; the others go on."""
    from controller.cli import judge

    fleet = st.fleet()
    done: list[str] = []
    for run_id in fleet.active_runs():
        try:
            view = fleet.sync(run_id)
        except Exception as exc:  # one bad run must not stop the service
            warn(f"sync of {run_id} failed: {exc}")
            continue
        if view.finished:
            done.append(run_id)
            try:
                judge(st, run_id, None)
            except Exception as exc:  # a report that cannot be built must not stop the service either
                warn(f"run {run_id} finished, but its verdict could not be reached: {exc}")
    return done


def _start_metrics(st: State) -> Any:
    s = st.settings()
    if not s.metrics_port or importlib.util.find_spec("controller.metrics") is None:
        return None
    from prometheus_client import CollectorRegistry, start_http_server

    from controller.fleet import Fleet
    from controller.history import History
    from controller.metrics import ControllerCollector

    # its own connections: the collector runs in the HTTP server's thread
    history = History(s.history_path)
    fleet = Fleet(s, history, failures_for_bad=s.failures_for_bad)
    inv = st.inventory()

    def states() -> dict[str, str]:
        return {name: status.state for name, status in fleet.statuses(list(inv.modules)).items()}

    def queues() -> dict[str, int]:
        return fleet.queue_lengths(list(inv.modules))

    registry = CollectorRegistry()
    registry.register(ControllerCollector(history, states, queues))
    return start_http_server(s.metrics_port, addr=s.metrics_host, registry=registry)


def serve_forever(st: State, *, interval: float, once: bool, console: Console) -> None:
    if once:
        for run_id in sync_all(st, lambda m: console.print(m, highlight=False)):
            console.print(f"run {run_id} finished")
        return
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server = _start_metrics(st)
    s = st.settings()
    console.print(f"fleetctl serve: history {s.history_path}, broker {s.redacted_broker_url()}"
                  + (f", /metrics on {s.metrics_host}:{s.metrics_port}" if server else ""))
    while not stop.is_set():
        for run_id in sync_all(st, lambda m: console.print(m, highlight=False)):
            console.print(f"run {run_id} finished")
        stop.wait(interval)
    if server:
        server[0].shutdown()
