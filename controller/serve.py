"""``fleetctl serve``: keeps the run history in step with the broker while no CLI is attached,
judges finished runs, serves the controller's /metrics and, when configured, the HTTP API
(``api_port``) and the webhooks (``webhook_urls``)."""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rich.console import Console

from contract.settings import SettingsError
from controller import service
from controller.service import Judgement, Session

if TYPE_CHECKING:
    from controller.service_webhooks import Webhooks

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


@dataclass
class Notifier:
    """Sends each verdict reached while the service runs to the webhooks, once: the verdicts this
    service reached and those an attached ``fleetctl validate/watch`` recorded."""

    s: Session
    hooks: Webhooks
    since: float = field(default_factory=time.time)
    sent: set[str] = field(default_factory=set)

    def verdict(self, j: Judgement) -> None:
        if j.run_id in self.sent:
            return
        self.sent.add(j.run_id)
        from controller.api import summary_of

        self.hooks.notify("run.verdict", summary_of(self.s, j))

    def judged_elsewhere(self) -> None:
        for info in service.runs(self.s, 50):
            if (info.verdict and info.state != "running" and info.run_id not in self.sent
                    and (info.finished_at or 0) >= self.since):
                line = f"{info.verdict.upper()} {info.run_id} (verdict recorded by an attached fleetctl)"
                self.verdict(Judgement(info.run_id, info.verdict, line, info.state))


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


@dataclass
class ApiServer:
    server: Any
    thread: threading.Thread

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


def start_api(s: Session, timeout: float = 15.0) -> ApiServer | None:
    """The HTTP API (uvicorn, in a thread of this process) when ``api_port`` is set."""
    settings = s.settings
    if not settings.api_port:
        return None
    if settings.api_tokens_file is None:
        raise SettingsError("api_port is set but api_tokens_file is not: no token, no access (give --tokens FILE)")
    import uvicorn

    from controller.api import Tokens, create_app

    app = create_app(settings, Tokens.load(settings.api_tokens_file))
    config = uvicorn.Config(app, host=settings.api_host, port=settings.api_port, log_level="warning",
                            access_log=False, lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="api", daemon=True)
    thread.start()
    end = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > end:
            raise SettingsError(f"the HTTP API could not listen on {settings.api_host}:{settings.api_port}")
        time.sleep(0.05)
    return ApiServer(server, thread)


def webhooks_of(s: Session) -> Webhooks | None:
    settings = s.settings
    if not settings.webhook_urls:
        return None
    if settings.webhook_secret_file is None:
        raise SettingsError("webhook_urls are set but webhook_secret_file is not: webhooks are always signed")
    from controller.service_webhooks import Webhooks, load_secret

    return Webhooks(settings.webhook_urls, load_secret(settings.webhook_secret_file))


def serve_forever(s: Session, *, interval: float, once: bool, console: Console) -> None:
    def warn(m: str) -> None:
        console.print(m, highlight=False)

    hooks = webhooks_of(s)
    notifier = Notifier(s, hooks) if hooks else None
    on_verdict = notifier.verdict if notifier else None
    if once:
        for run_id in sync_all(s, warn, on_verdict):
            console.print(f"run {run_id} finished")
        if hooks:
            hooks.close(wait=True)
        return
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    api = start_api(s)
    server = _start_metrics(s)
    settings = s.settings
    console.print(f"fleetctl serve: history {settings.history_path}, broker {settings.redacted_broker_url()}"
                  + (f", /metrics on {settings.metrics_host}:{settings.metrics_port}" if server else "")
                  + (f", API on http://{settings.api_host}:{settings.api_port}/api/v1" if api else "")
                  + (f", webhooks to {len(hooks.urls)} URL(s)" if hooks else ""), highlight=False)
    try:
        while not stop.is_set():
            for run_id in sync_all(s, warn, on_verdict):
                console.print(f"run {run_id} finished")
            if notifier:
                try:
                    notifier.judged_elsewhere()
                except Exception as exc:  # the history briefly locked: next pass
                    warn(f"webhooks: {exc}")
            stop.wait(interval)
    finally:
        if api:
            api.stop()
        if server:
            server[0].shutdown()
        if hooks:
            hooks.close(wait=False)
