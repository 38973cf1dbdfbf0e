"""``fleetctl serve``: keeps the run history in step with the broker while no CLI is attached,
judges finished runs, serves the controller's /metrics and, when configured, the HTTP API
(``api_port``), the webhooks (``webhook_urls``) and scheduled golden checks (``golden_*``).

Lazy imports: a part that a setting turns on loads its libraries when it starts: the HTTP API
(:mod:`controller.serve.api`, :mod:`~controller.serve.guard`: FastAPI and uvicorn, 271 and 85 ms of CPU, 25 and 9
MiB) with ``api_port``, the webhooks' bodies (:func:`controller.serve.api.summary_of`) with ``webhook_urls``, the
collector (:mod:`controller.serve.metrics`: prometheus_client, 59 ms) with ``metrics_port``; figures of
``bench/import_costs.py`` (bench/results/import_costs_20261207_0346_lazy-libraries.txt).
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import queue
import signal
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console

from controller import service
from controller.history import CHANGE_CHECK_EVENT, VERDICT_EVENT, FrameCache, History, OutboxEvent, url_digest
from controller.serve.health import OUTAGE, PART_DOWN, Health, until_reached
from controller.serve.tokens import WatchedTokens
from controller.service import Judgement, Session
from controller.service.golden import judge_golden
from controller.service.golden_schedule import is_golden, run_due
from controller.service.lifecycle import queue_change_points
from controller.service.webhooks import Webhooks, load_secret
from controller.settings import ConfigError, ControllerSettings

log = logging.getLogger("fleet.serve")
# how often a serve pass looks for runs waiting past raise_after (one read of the queues)
RAISE_EVERY_S = 5.0
# how often a serve pass looks for modules due a scheduled golden check (a history read)
GOLDEN_EVERY_S = 30.0
# run frames and report analyses kept for reports and trends (ADR 0034)
FRAME_CACHE_BYTES = 1024 * 1024 * 1024


def sync_all(s: Session, warn: Callable[[str], None] = log.warning,
             on_verdict: Callable[[Judgement], None] | None = None) -> list[str]:
    """One pass: sync every running run; judge the ones that just finished. Returns finished ids.

    A run that cannot be synced or judged is reported through ``warn``; the others go on."""
    fleet = s.fleet()
    done: list[str] = []
    for run_id in fleet.active_runs():
        try:
            view = service.sync(s, run_id)
        except PART_DOWN:
            # the history or the broker away: the whole pass is tried again (serve_forever)
            raise
        except Exception as exc:  # one bad run must not stop the service
            warn(f"sync of {run_id} failed: {exc}")
            continue
        if not view.finished:
            continue
        done.append(run_id)
        try:
            j = service.judge(s, run_id)
        except PART_DOWN:
            # not judged: the history still holds it running, the pass that catches up judges it
            raise
        except Exception as exc:
            # a report that cannot be built must not stop the service either
            warn(f"run {run_id} finished, but its verdict could not be reached: {exc}")
            continue
        if on_verdict is not None:
            on_verdict(j)
        golden(s, run_id, warn)
    return done


class ReportPreparer:
    """Prepares the reports of runs that just ended, so the first ``fleetctl report --service`` after a run's end
    is answered from kept frames and a kept analysis (ADR 0034): one run at a time in one thread of its own (a
    session of its own, the frames shared; a daemon thread: a service told to stop does not wait for it). Each
    report is made twice: the first read of an ended run comes from the history's rows (~15 s per million rows)
    and writes its column file; the second reads that file, and what it makes is kept (only what came from a
    current file is)."""

    def __init__(self, s: Session) -> None:
        self.session = s
        self.runs: queue.Queue[str] = queue.Queue()
        self.thread: threading.Thread | None = None

    def add(self, run_ids: list[str]) -> None:
        if self.session.frames is None or not run_ids:
            return
        for run_id in run_ids:
            self.runs.put(run_id)
        if self.thread is None:
            self.thread = threading.Thread(target=self._work, name="prepare-reports", daemon=True)
            self.thread.start()

    def wait(self, timeout: float) -> bool:
        """Whether every run added was prepared (or failed to be) within ``timeout`` seconds."""
        end = time.monotonic() + timeout
        while self.runs.unfinished_tasks and time.monotonic() < end:
            time.sleep(0.05)
        return not self.runs.unfinished_tasks

    def _work(self) -> None:
        with Session(self.session.settings, frames=self.session.frames) as own:
            while True:
                run_id = self.runs.get()
                try:
                    for _ in range(2):
                        service.report(own, run_id)
                except Exception as exc:  # a report that cannot be made is said when it is asked for
                    log.info("report of run %s not prepared: %s", run_id, exc)
                finally:
                    self.runs.task_done()


def golden(s: Session, run_id: str, warn: Callable[[str], None]) -> None:
    """A golden check that just ended (scheduled, or one a ``fleetctl golden`` no longer
    follows) judged against each module's golden history; a drift is recorded once whoever judges it."""
    try:
        if not is_golden(s.history().find_run(run_id)):
            return
        res = judge_golden(s, run_id, s.settings.golden_tolerance)
    except Exception as exc:
        # the check's run is in the history; judging it again is a ``fleetctl golden`` away
        warn(f"golden check {run_id} ended, but it could not be judged: {exc}")
        return
    for c in res.checks:
        if c.status in ("drifted", "failed"):
            warn(f"golden check {run_id}: {c.line}")


def schedule_golden(s: Session, warn: Callable[[str], None]) -> None:
    """Dispatch the golden checks due (settings ``golden_*``; :mod:`controller.service.golden_schedule`)."""
    try:
        for d, what in run_due(s, time.time()):
            warn(f"golden check on {d.module} ({d.why}): {what}")
    except Exception as exc:  # the broker or the history away: the next pass tries again
        warn(f"golden checks not scheduled: {exc}")


def raise_starving(s: Session, warn: Callable[[str], None]) -> None:
    """Raise the runs that waited ``raise_after`` on a module's queue a level (the starvation bound; 0: none), and
    put the runs a module held back for a reservation that has ended back up to the priority they asked for."""
    try:
        fleet, mods = s.fleet(), list(s.inventory().modules)
        held = fleet.held([m.name for m in mods])  # one read
        holders = {m.queue: held[m.name].user for m in mods if m.name in held}
        for r in fleet.raise_waiting(mods, s.settings.raise_after, holders=holders):
            waited = time.time() - (r.message.sent_at or time.time())
            warn(f"a run waiting {waited / 60:.0f} min on {r.message.queue} raised from {r.message.level} to {r.to}")
    except Exception as exc:  # the broker away: the next pass tries again
        warn(f"waiting runs not raised: {exc}")


@dataclass
class Notifier:
    """Sends the webhook outbox of the run history: every verdict recorded (by this service, by an
    attached ``fleetctl validate/watch``, or while the service was down) to each webhook URL, once.

    A verdict queues its event in the history when it is recorded (:meth:`History.set_run_state`);
    :meth:`drain` sends what a URL has not had yet (events queued after the URL was first configured
    here, at most ``max_age`` old), and records each delivery's outcome when it is known. Events in
    flight when the service stops are sent again at the next start (``X-Fleet-Delivery`` stays the
    same: a receiver may de-duplicate on it).

    Several services on one history (a shared PostgreSQL one) each claim an event's URL before sending to it
    (:meth:`History.claim_webhooks`): one sends it. A claim is the service's host and data folder (``holder``): the
    same service started again takes its claims up at once; another one waits until the claim of a service that
    died mid-delivery runs out, ``lease`` s (by default twice the longest a delivery may retry)."""

    s: Session
    hooks: Webhooks
    max_age: float = 7 * 86400.0
    inflight: dict[tuple[str, str, str], Future[bool]] = field(default_factory=dict)
    holder: str = ""
    lease: float | None = None
    checker: ThreadPoolExecutor | None = None

    def __post_init__(self) -> None:
        self.by_digest = {url_digest(u): u for u in self.hooks.urls}
        self.targets = self.s.history().webhook_targets(self.hooks.urls)
        if not self.holder:
            self.holder = f"{socket.gethostname()}:{self.s.settings.data_dir.expanduser().resolve()}"
        if self.lease is None:
            self.lease = 2 * self.hooks.attempts * (self.hooks.timeout + self.hooks.max_backoff)

    def verdict(self, j: Judgement) -> None:  # a verdict this service reached: already in the outbox
        self.drain()

    def _check(self, ev: OutboxEvent, digests: list[str]) -> None:
        """The change-point search an ended run queued (``trend.check``), in the checker's one thread with a session
        of its own; its future stands for every target's "delivery" of the check (recorded when it ends), and the
        ``trend.change_point`` event it may queue is sent by a later :meth:`drain`."""
        if self.checker is None:
            self.checker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="change-check")
        fut = self.checker.submit(_change_check, self.s.settings, ev.run_id, ev.verdict, ev.state)
        for d in digests:
            self.inflight[(ev.run_id, ev.event, d)] = fut

    def drain(self) -> int:
        """Record finished deliveries, send what is pending; how many deliveries were started."""
        from controller.serve.api import summary_of

        h = self._record_finished()
        started = 0
        for ev in h.pending_webhooks(self.targets, max_age=self.max_age):
            digests = [d for d in ev.urls if (ev.run_id, ev.event, d) not in self.inflight]
            # another service sending it (a shared history) holds its claim: not sent here
            if digests:
                digests = h.claim_webhooks(ev.run_id, ev.event, digests, self.holder, self.lease or 0.0)
            if not digests:
                continue
            if ev.event == CHANGE_CHECK_EVENT:
                self._check(ev, digests)
                continue
            payload = summary_of(self.s, Judgement(ev.run_id, ev.verdict, ev.line, ev.state))
            if ev.payload and ev.event == VERDICT_EVENT:  # the verdict's regressions and outliers, with intervals
                payload.update(json.loads(ev.payload))
            elif ev.payload:
                # an event beyond the verdict (trend.change_point): its own fields and line
                info = h.run(ev.run_id)
                payload = {**payload, **json.loads(ev.payload), "event": ev.event, "line": ev.line,
                           "verdict_line": info.verdict_line if info else None}
            futures = self.hooks.notify(ev.event, payload, urls=[self.by_digest[d] for d in digests],
                                        delivery=ev.delivery_id)
            for d, fut in zip(digests, futures, strict=True):
                self.inflight[(ev.run_id, ev.event, d)] = fut
            started += len(futures)
        return started

    def settle(self, timeout: float) -> None:
        """Send and wait until nothing is left to send (a change-point check queues its event when it ends)."""
        end = time.monotonic() + timeout
        while self.drain() or self.inflight:
            self.wait(max(0.0, end - time.monotonic()))
            if time.monotonic() >= end:
                break

    def close(self) -> None:
        if self.checker is not None:
            self.checker.shutdown(wait=False, cancel_futures=True)

    def wait(self, timeout: float) -> None:
        """Until the deliveries in flight are done (or ``timeout``), their outcomes recorded."""
        end = time.monotonic() + timeout
        for fut in list(self.inflight.values()):
            with contextlib.suppress(Exception):
                fut.result(timeout=max(0.0, end - time.monotonic()))
        self._record_finished()

    def _record_finished(self) -> History:
        """Record the outcome of each finished delivery (delivered / given up); the history."""
        h = self.s.history()
        for key, fut in list(self.inflight.items()):
            if fut.done():
                ok = not fut.cancelled() and fut.exception() is None and fut.result()
                h.mark_webhook(*key, "delivered" if ok else "given_up")
                del self.inflight[key]
        return h


def _change_check(settings: ControllerSettings, run_id: str, verdict: str, state: str) -> bool:
    """Run an ended run's change-point search (:func:`controller.service.lifecycle.queue_change_points`) on a
    session of this thread's own; True once it ran (a run no longer in the history: nothing to search)."""
    with Session(settings) as own:
        h = own.history()
        info = h.run(run_id)
        if info is not None:
            queue_change_points(h, info, verdict, state)
    return True


def _start_metrics(s: Session, health: Health | None = None) -> Any:
    settings = s.settings
    if not settings.metrics_port:
        return None
    from prometheus_client import CollectorRegistry, start_http_server

    from controller.serve.metrics import ControllerCollector, ModuleReading

    # its own session: the collector runs in the HTTP server's thread
    own = Session(settings, frames=s.frames)
    history, fleet, inv = own.history(), own.fleet(), s.inventory()

    def states() -> dict[str, ModuleReading]:
        return {name: ModuleReading(status.state, status.skew)
                for name, status in fleet.statuses(list(inv.modules)).items()}

    def queues() -> dict[str, dict[str, int]]:
        return fleet.queue_depths(list(inv.modules))

    def reserved() -> dict[str, str]:
        return {m: r.user for m, r in fleet.held([m.name for m in inv.modules]).items()}

    registry = CollectorRegistry()
    registry.register(ControllerCollector(history, states, queues, reserved=reserved,
                                          open_history=lambda: History(settings.history_location, frames=s.frames),
                                          parts=(lambda: {p: st.up for p, st in health.states().items()})
                                          if health is not None else None))
    try:
        return start_http_server(settings.metrics_port, addr=settings.metrics_host, registry=registry)
    except OSError as exc:  # a busy port: named with its setting, no traceback
        raise ConfigError(f"/metrics could not listen on {settings.metrics_host}:{settings.metrics_port} "
                          f"({exc.strerror or exc}): set metrics_port in [controller] (FLEET_CONTROLLER_METRICS_PORT; "
                          "0 turns /metrics off)") from None


@dataclass
class ApiServer:
    server: Any
    thread: threading.Thread

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


def start_api(s: Session, timeout: float = 15.0, health: Health | None = None) -> ApiServer | None:
    """The HTTP API (uvicorn, in a thread of this process) when ``api_port`` is set: bodies bounded and
    checked for a token before they are read, read deadlines on every connection (:mod:`controller.serve.guard`)."""
    settings = s.settings
    if not settings.api_port:
        return None
    if settings.api_tokens_file is None:
        raise ConfigError("api_port is set but api_tokens_file is not: no token, no access (give --tokens FILE)")
    import uvicorn

    from controller.serve.api import create_app
    from controller.serve.guard import KEEPALIVE_TIMEOUT, log_config, protocol_class

    app = create_app(settings, WatchedTokens(settings.api_tokens_file), s.frames, health=health)
    # h11 (headers of 16 KiB at most), with read deadlines: a slow or idle client is closed, never held
    config = uvicorn.Config(app, host=settings.api_host, port=settings.api_port, log_level="warning",
                            access_log=False, lifespan="on", log_config=log_config(),
                            http=protocol_class(settings.api_timeout, settings.api_timeout),
                            timeout_keep_alive=KEEPALIVE_TIMEOUT)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="api", daemon=True)
    thread.start()
    end = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > end:
            raise ConfigError(f"the HTTP API could not listen on {settings.api_host}:{settings.api_port}")
        time.sleep(0.05)
    return ApiServer(server, thread)


def webhooks_of(s: Session) -> Webhooks | None:
    settings = s.settings
    if not settings.webhook_urls:
        return None
    if settings.webhook_secret_file is None:
        raise ConfigError("webhook_urls are set but webhook_secret_file is not: webhooks are always signed")
    return Webhooks(settings.webhook_urls, load_secret(settings.webhook_secret_file))


def capacity_warning(s: Session) -> str | None:
    """The broker's ``maxclients`` against the inventory's agents (:meth:`Fleet.capacity_problem`); None: enough,
    or nothing to check (no inventory readable)."""
    try:
        agents = len(s.inventory().modules)
    except Exception:  # the sync loop reports an unreadable inventory
        return None
    return s.fleet().capacity_problem(agents)


def serve_forever(s: Session, *, interval: float, once: bool, console: Console) -> None:
    def warn(m: str) -> None:
        console.print(m, highlight=False)

    if s.frames is None:
        # shared by the sync loop (the verdict at a run's end reads its rows first), the API and /metrics: a
        # report asked for after the run's end finds its frames decoded (ADR 0034)
        s.keep_frames(FrameCache(FRAME_CACHE_BYTES))
    hooks = webhooks_of(s)
    stop = threading.Event()
    health = Health()
    if not once:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        # a history not up yet (a PostgreSQL server starting with the host) is waited for, with backoff
        if not until_reached(lambda: s.history().running_runs(), health, stop, warn):
            return
    # an evicting broker is refused (EvictingBroker); one away now is synced once it is back
    try:
        s.fleet().check_broker()
    except service.BrokerUnavailable as exc:
        warn(f"{exc}; going on, syncing once it is reachable")
    else:
        # a broker that cannot hold every agent's connections: one line (controller.fleet.capacity)
        short = capacity_warning(s)
        if short:
            warn(f"warning: {short}")
    if once:
        notifier = Notifier(s, hooks) if hooks else None
        on_verdict = notifier.verdict if notifier else None
        if notifier:  # what was recorded while the service was down goes first
            notifier.drain()
        for run_id in sync_all(s, warn, on_verdict):
            console.print(f"run {run_id} finished")
        schedule_golden(s, warn)
        raise_starving(s, warn)
        if notifier and hooks:
            notifier.settle(timeout=600)
            notifier.close()
            hooks.close(wait=True)
        return
    notifiers: list[Notifier] = []

    # the webhooks' targets, and what was recorded while the service was down, go first
    def begin() -> None:
        if hooks and not notifiers:
            notifiers.append(Notifier(s, hooks))
            notifiers[0].drain()

    if not until_reached(begin, health, stop, warn):
        return
    notifier = notifiers[0] if notifiers else None
    api = start_api(s, health=health)
    server = _start_metrics(s, health)
    settings = s.settings
    console.print(f"fleetctl serve: history {settings.history_path}, broker {settings.redacted_broker_url()}"
                  + (f", /metrics on {settings.metrics_host}:{settings.metrics_port}" if server else "")
                  + (f", API on http://{settings.api_host}:{settings.api_port}/api/v1" if api else "")
                  + (f", webhooks to {len(hooks.urls)} URL(s)" if hooks else ""), highlight=False)
    loop = ServeLoop(s, warn, console, notifier)
    # what serve holds once started is left out of its garbage collections (controller.cli.live.follow)
    gc.freeze()
    try:
        while not stop.is_set():
            if not until_reached(loop.one_pass, health, stop, warn):
                break
            stop.wait(interval)
    finally:
        if api:
            api.stop()
        if server:
            server[0].shutdown()
        if notifier and hooks:
            with contextlib.suppress(Exception):  # the history away: they are sent again next time
                # outcomes known by now are recorded; the others are sent again next time
                notifier.wait(timeout=0)
            notifier.close()
            hooks.close(wait=False)


@dataclass
class ServeLoop:
    """One pass of ``fleetctl serve``: sync and judge, the scheduled golden checks, the raise of waiting runs, the
    webhooks. A pass that meets the history or the broker away raises (:data:`OUTAGE`) and is tried again whole
    with backoff (:func:`controller.serve.health.until_reached`): the first that succeeds catches up."""

    s: Session
    warn: Callable[[str], None]
    console: Console
    notifier: Notifier | None = None
    golden_at: float = 0.0
    raised_at: float = 0.0
    preparer: ReportPreparer | None = None

    def one_pass(self) -> None:
        s, warn = self.s, self.warn
        if self.preparer is None:
            self.preparer = ReportPreparer(s)
        if time.monotonic() - self.raised_at >= RAISE_EVERY_S:  # the broker checked even with no run to sync
            try:
                s.fleet().check_broker()
            except OUTAGE:
                raise
            except Exception as exc:
                # an evicting broker now (its policy changed): said, the service goes on
                warn(f"broker: {exc}")
        finished = sync_all(s, warn, self.notifier.verdict if self.notifier else None)
        for run_id in finished:
            self.console.print(f"run {run_id} finished")
        self.preparer.add(finished)
        if time.monotonic() - self.golden_at >= GOLDEN_EVERY_S:  # a check is due in hours, not seconds
            self.golden_at = time.monotonic()
            schedule_golden(s, warn)
        if time.monotonic() - self.raised_at >= RAISE_EVERY_S:
            self.raised_at = time.monotonic()
            raise_starving(s, warn)
        if self.notifier:
            try:
                self.notifier.drain()  # verdicts an attached fleetctl recorded meanwhile
            except OUTAGE:
                raise
            except Exception as exc:  # the history briefly locked: next pass
                warn(f"webhooks: {exc}")
