"""Dispatch runs to modules, follow them, keep their results: the controller's fleet seam.

Everything here talks to the broker through one Celery app and the backend KV
(``contract.kv``); the run history is the only other store. Module states follow LAVA's
shape: ``idle``, ``busy``, ``offline`` (no heartbeat for ``offline_after``), ``bad``
(unhealthy heartbeat or ``failures_for_bad`` failed runs in a row). ``sync`` is
idempotent and can be called by any controller process at any time (the attached CLI,
``fleetctl status``, or ``fleetctl serve`` when nobody is attached): results reach the
history whether or not a CLI stays attached.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import secrets
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from agent.errors import BadInput
from agent.store import check_run_id
from contract.records import Heartbeat, RunProgress, RunRequest, RunState, StepError, release_version_of
from contract.settings import BrokerSettings
from controller.history import History
from controller.inventory import Module

if TYPE_CHECKING:
    from celery import Celery

    from contract.kv import KV

# Celery, kombu and redis (~0.4 s of imports) load when a Fleet is made or a broker error is
# caught, not when a verb that only reads the history imports this module.

log = logging.getLogger("fleet.controller")


class FleetError(RuntimeError):
    """Root of the controller's fleet errors (the CLI maps them to exit code 2)."""


class BrokerUnavailable(FleetError, ConnectionError):
    pass


class BadRelease(FleetError, ValueError):
    pass


class EvictingBroker(FleetError, ValueError):
    """The broker's Redis may evict keys (``maxmemory-policy``): the one line names the fix."""


def broker_errors() -> tuple[type[BaseException], ...]:
    """What a broker or backend that cannot be reached raises (imports redis and kombu)."""
    from kombu.exceptions import OperationalError
    from redis.exceptions import RedisError

    return (RedisError, OperationalError, ConnectionError, TimeoutError)


# --------------------------------------------------------------------------- pure parts
@dataclass(frozen=True)
class ModuleStatus:
    name: str
    state: str  # idle | busy | offline | bad
    reason: str = ""
    heartbeat: Heartbeat | None = None
    age: float | None = None  # seconds since the last heartbeat


def derive_state(hb: Heartbeat | None, now: float, *, offline_after: float, consecutive_failures: int = 0,
                 failures_for_bad: int = 3, lost_after: float | None = None) -> tuple[str, str]:
    """``unreachable``: no heartbeat for ``offline_after`` (its run goes on); ``offline``: for ``lost_after``."""
    if hb is None:
        return "offline", "no heartbeat ever"
    age = now - hb.ts
    if age > max(offline_after, lost_after or 0.0):
        return "offline", f"no heartbeat for {age:.0f} s"
    if age > offline_after:
        return "unreachable", f"no heartbeat for {age:.0f} s" + (f", run {hb.run_id} goes on" if hb.run_id else "")
    if not hb.healthy:
        return "bad", hb.detail or "agent reports itself unhealthy"
    if consecutive_failures >= failures_for_bad:
        return "bad", f"{consecutive_failures} failed runs in a row"
    if hb.run_id:
        return "busy", f"run {hb.run_id}" + (f", {hb.step}" if hb.step else "")
    return "idle", ""


def release_version(tarball: Path) -> str:
    version = release_version_of(tarball.name)
    if version is None:
        raise BadRelease(f"{tarball}: not a release tarball name (SGLang-MUSA-M1000-M1000_<version>_sglang.tar.gz)")
    return version


def sha256_file(path: Path, chunk: int = 4 * 1024 * 1024) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def new_run_id(now: float | None = None) -> str:
    t = time.gmtime(now if now is not None else time.time())
    return time.strftime("%Y%m%d-%H%M%S", t) + "-" + secrets.token_hex(2)


def module_failed(p: RunProgress) -> bool:
    return p.state in (RunState.FAILED, RunState.LOST) or any(o.status == "failed" for o in p.outcomes)


def liveness(p: RunProgress | None, hb: Heartbeat | None, now: float, *, dispatched_at: float,
             settings: BrokerSettings) -> str | None:
    """Why a (run, module) that is not terminal must be given up now, or None (pure).

    The bounds: no heartbeat for ``lost_after``; started more than ``module_deadline`` ago; queued
    while the module was alive and idle for ``start_timeout`` (the message never reached it); started,
    and the module alive and idle while the run has not reported for ``start_timeout`` (its end never
    reached the broker).
    """
    silent = now - hb.ts if hb is not None else now - dispatched_at
    if silent > settings.lost_after:
        return (f"agent lost: no heartbeat for {silent:.0f} s" if hb is not None
                else f"agent lost: never seen in {silent:.0f} s")
    started = p.started_at if p is not None else None
    if started is not None and now - started > settings.module_deadline:
        return f"deadline passed: running for {now - started:.0f} s (bound {settings.module_deadline:.0f} s)"
    queued = p is None or (p.state == RunState.PENDING and p.started_at is None)
    idle = hb is not None and hb.run_id is None and silent <= settings.offline_after
    if queued and idle and now - dispatched_at > settings.start_timeout:
        return f"never started: the module stayed idle for {now - dispatched_at:.0f} s after dispatch"
    if not queued and p is not None and idle and now - p.updated_at > settings.start_timeout:
        # its end never reached the broker (e.g. a write taken by a Redis master that died before its replica had it)
        return (f"end lost: the module is idle and its run last reported {now - p.updated_at:.0f} s ago "
                f"({p.state.value}, {p.step or 'start'})")
    return None


@dataclass(frozen=True)
class RunView:
    run_id: str
    modules: tuple[str, ...]
    progress: Mapping[str, RunProgress | None] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return all(p is not None and p.state.terminal for p in self.progress.values())

    def state(self) -> str:
        ps = [p for p in self.progress.values() if p is not None]
        if not self.finished:
            return "running"
        if any(p.state == RunState.CANCELLED for p in ps):
            return "cancelled"
        if any(module_failed(p) for p in ps):
            return "failed"
        return "done"


# --------------------------------------------------------------------------- the seam
class Fleet:
    def __init__(self, settings: BrokerSettings, history: History, *, failures_for_bad: int = 3) -> None:
        self.settings = settings
        self.history = history
        from contract.celery_app import make_app
        from contract.kv import KV

        self.app: Celery = make_app(settings)
        self.kv: KV = KV(self.app)
        self.failures_for_bad = failures_for_bad

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.app.close()

    # -- broker --------------------------------------------------------------------------
    def check_broker(self, timeout: float = 5.0) -> None:
        """The broker is reachable (else :class:`BrokerUnavailable`) and does not evict keys (else
        :class:`EvictingBroker`, :mod:`contract.eviction`)."""
        from contract.celery_app import is_embedded
        from contract.eviction import broker_eviction_problem

        if is_embedded(self.settings):
            return
        try:
            with self.app.connection_for_write() as conn:
                conn.ensure_connection(max_retries=1, interval_start=0, timeout=timeout)
            self.app.backend.get("m1000-fleet:ping")
            problem = broker_eviction_problem(self.app)
        except Exception as exc:
            raise BrokerUnavailable(
                f"broker {self.settings.redacted_broker_url()} unreachable: {_short(exc)}") from exc
        if problem:
            raise EvictingBroker(problem)

    # -- modules -------------------------------------------------------------------------
    def heartbeats(self, names: Iterable[str]) -> dict[str, Heartbeat | None]:
        return self.kv.heartbeats(names)

    def consecutive_failures(self, module: str, limit: int = 10) -> int:
        cur = self.history.conn.execute(
            "SELECT progress FROM module_runs WHERE module=? ORDER BY updated_at DESC LIMIT ?", (module, limit))
        n = 0
        for (raw,) in cur.fetchall():
            p = RunProgress.model_validate_json(raw)
            if not p.state.terminal:
                continue
            if not module_failed(p):
                break
            n += 1
        return n

    def statuses(self, modules: Sequence[Module], now: float | None = None) -> dict[str, ModuleStatus]:
        now = time.time() if now is None else now
        hbs = self.heartbeats(m.name for m in modules)
        conflicts = self.kv.conflicts(m.name for m in modules)
        out: dict[str, ModuleStatus] = {}
        for m in modules:
            hb = hbs.get(m.name)
            state, reason = derive_state(hb, now, offline_after=self.settings.offline_after,
                                         consecutive_failures=self.consecutive_failures(m.name),
                                         failures_for_bad=self.failures_for_bad, lost_after=self.settings.lost_after)
            conflict = conflicts.get(m.name)
            if conflict and now - float(conflict.get("ts", 0) or 0) < max(3600.0, self.settings.lost_after):
                held = conflict.get("held_by") or {}
                reason = (reason + "; " if reason else "") + (
                    f"name conflict: a second agent on {conflict.get('host')} (pid {conflict.get('pid')}) was refused"
                    f" {now - float(conflict.get('ts', 0)):.0f} s ago; the name is held by {held.get('host')}"
                    f" (pid {held.get('pid')})")
            out[m.name] = ModuleStatus(m.name, state, reason, hb, (now - hb.ts) if hb else None)
        return out

    def queue_lengths(self, modules: Sequence[Module]) -> dict[str, int]:
        out: dict[str, int] = {}
        try:
            with self.app.connection_for_read() as conn, conn.channel() as ch:
                for m in modules:
                    try:
                        out[m.queue] = int(ch.queue_declare(queue=m.queue, passive=True).message_count)
                    except Exception:
                        out[m.queue] = 0
        except Exception as exc:
            log.warning("cannot read queue lengths: %s", exc)
        return out

    # -- dispatch ------------------------------------------------------------------------
    def send(self, module: str, task: str, args: list[object], task_id: str | None = None, *,
             ignore_result: bool = False) -> str:
        """Publish one task on a module's queue (the only place the controller enqueues).

        ``ignore_result``: Celery keeps no result of it (a run's state travels in the KV records), so the
        controller does not subscribe to one result channel per dispatched module.
        """
        from contract.celery_app import queue_name

        try:
            res = self.app.send_task(task, args=args, queue=queue_name(module), task_id=task_id,
                                     ignore_result=ignore_result, argsrepr=args_label(args), kwargsrepr="{}",
                                     retry=True, retry_policy={"max_retries": 3, "interval_start": 0.2,
                                                               "interval_step": 0.5, "interval_max": 2})
        except Exception as exc:
            raise BrokerUnavailable(f"cannot enqueue on {queue_name(module)}: {_short(exc)}") from exc
        return str(res.id)

    def check_new_run_id(self, run_id: str, *, resume: bool = False) -> None:
        """A run id must match the agents' pattern; one already in the history only with ``resume``."""
        try:
            check_run_id(run_id)
        except BadInput as exc:
            raise FleetError(str(exc)) from None
        if not resume and self.history.run(run_id) is not None:
            raise FleetError(f"run id {run_id!r} is already in the history; resume it explicitly or choose another")

    def dispatch(self, *, run_id: str, modules: Sequence[Module], tarballs: Mapping[str, str], sha256: str,
                 release: str, models: Sequence[str], tarball_label: str = "",
                 statuses: Mapping[str, ModuleStatus] | None = None, resume: bool = False) -> dict[str, str]:
        """Record the run and enqueue it on every module that can take it.

        Returns module -> "queued" or the reason it was not (offline, bad, no release):
        those modules are recorded as failed at once, not after an hour. A run id must match the
        agents' pattern, and may be one already in the history only with ``resume`` (each module
        then keeps the keys that passed).
        """
        self.check_new_run_id(run_id, resume=resume)
        statuses = statuses if statuses is not None else self.statuses(modules)
        self.history.create_run(run_id, release=release, tarball=tarball_label, sha256=sha256,
                                models=models, modules=[m.name for m in modules])
        out: dict[str, str] = {}
        from contract.celery_app import RUN_TASK, task_id

        # every request built and every module's state recorded (one transaction) before the first message:
        # each message wakes a module, and on a machine the modules share, the rest of the loop then waits
        # for CPU behind them (100 simulated modules: the last message left ~9 s after the first)
        requests: list[RunRequest] = []
        failed: list[RunProgress] = []
        now = time.time()
        for m in modules:
            st = statuses[m.name]
            problem = None
            if st.state in ("offline", "unreachable"):
                problem = f"module {st.state}: {st.reason}"
            elif st.state == "bad":
                problem = f"module bad: {st.reason}"
            elif m.name not in tarballs:
                problem = "release not available on the module"
            if problem:
                failed.append(failed_progress(run_id, m.name, release, "dispatch", problem, len(models), now))
                out[m.name] = problem
                continue
            requests.append(RunRequest(run_id=run_id, module=m.name, tarball=tarballs[m.name], sha256=sha256,
                                       release=release, models=tuple(models), model_root=m.model_root,
                                       model_paths=dict(m.model_paths), max_attempts=self.settings.max_attempts,
                                       key_env={k: dict(m.env) for k in models} if m.env else {}))
        self.history.upsert_progress_many([*failed, *(
            RunProgress(run_id=run_id, module=r.module, release=release, step="queued", keys_total=len(models),
                        updated_at=now) for r in requests)])
        payloads: list[tuple[str, list[object]]] = [(r.module, [r.model_dump(mode="json")]) for r in requests]
        for name, args in payloads:
            try:
                self.send(name, RUN_TASK, args, task_id=task_id(name, run_id), ignore_result=True)
                out[name] = "queued"
            except BrokerUnavailable as exc:
                self._record_failure(run_id, name, release, "dispatch", str(exc), len(models))
                out[name] = str(exc)
        return {m.name: out[m.name] for m in modules if m.name in out}

    def _record_failure(self, run_id: str, module: str, release: str, step: str, message: str,
                        keys: int) -> RunProgress:
        p = failed_progress(run_id, module, release, step, message, keys, time.time())
        self.history.upsert_progress(p)
        return p

    # -- follow --------------------------------------------------------------------------
    def sync(self, run_id: str, now: float | None = None) -> RunView:
        """Pull progress and rows of ``run_id`` from the broker into the history.

        A broker that cannot be reached raises :class:`BrokerUnavailable` (nothing is
        marked lost while the controller itself cannot see the broker).
        """
        try:
            return self._sync(run_id, now)
        except broker_errors() as exc:
            raise BrokerUnavailable(f"broker {self.settings.redacted_broker_url()} unreachable: {_short(exc)}") from exc

    def _sync(self, run_id: str, now: float | None = None) -> RunView:
        info = self.history.run(run_id)
        if info is None:
            raise FleetError(f"no run {run_id!r} in {self.history.path}")
        now = time.time() if now is None else now
        known = self.history.progress(run_id)
        # modules the controller gave up (LOST) are still read: a late state or late rows are accepted
        late_ok = now - info.created_at < self.settings.result_expires
        pending = [m for m in info.modules if not (known.get(m) and known[m].state.terminal)
                   or (late_ok and known[m].state == RunState.LOST)]
        live = self.kv.progress(run_id, pending) if pending else {}
        hbs = self.heartbeats(pending) if pending else {}
        for m in pending:
            p, cur = live.get(m), known.get(m)
            was_lost = cur is not None and cur.state == RunState.LOST
            if p is not None and cur is not None and was_lost:
                if not p.state.terminal and p.updated_at <= (cur.finished_at or 0.0):
                    p = None  # nothing newer than when the module was given up
                else:
                    self.history.add_event(run_id, m, f"late {p.state.value} state accepted after the module was "
                                                      f"marked lost ({cur.error.message if cur.error else ''})")
            if p is not None:
                have = self.history.conn.execute(
                    "SELECT COUNT(*) FROM rows WHERE run_id=? AND module=? AND source='release'",
                    (run_id, m)).fetchone()[0]
                if p.rows != have or p.state.terminal:
                    rows = self.kv.rows(run_id, m)
                    if rows is not None:
                        self.history.replace_rows(run_id, m, rows)
                if p.state.terminal:  # device telemetry: published with the module's last progress
                    summary = self.kv.telemetry(run_id, m)
                    if summary is not None:
                        self.history.upsert_telemetry(summary)
                if p != cur:  # an unchanged module costs no write (a pass writes what changed, not N rows)
                    self.history.upsert_progress(p, force=was_lost)
                known[m] = cur = p
            if cur is not None and cur.state.terminal:
                continue
            why = liveness(cur, hbs.get(m), now, dispatched_at=info.created_at, settings=self.settings)
            if why:
                self.kv.cancel(run_id, m, reason=why, lost=True)  # a later delivery must not run it
                known[m] = self._record_lost(run_id, m, info.release, cur, why, len(info.models), now)
        view = RunView(run_id, info.modules, {m: known.get(m) for m in info.modules})
        if view.finished and info.state != view.state():
            self.history.set_run_state(run_id, view.state())
        return view

    def _record_lost(self, run_id: str, module: str, release: str, cur: RunProgress | None, why: str,
                     keys: int, now: float) -> RunProgress:
        """The controller gives a module's part up: LOST, with the reason (``started_at`` keeps when)."""
        base = cur or RunProgress(run_id=run_id, module=module, release=release, keys_total=keys)
        p = base.model_copy(update={"state": RunState.LOST, "updated_at": now, "finished_at": now,
                                    "error": StepError(step=base.step or "dispatch", message=why)})
        self.history.upsert_progress(p, force=True)
        self.history.add_event(run_id, module, f"marked lost: {why}")
        log.warning("run %s on %s: %s", run_id, module, why)
        return p

    def view(self, run_id: str) -> RunView:
        info = self.history.run(run_id)
        if info is None:
            raise FleetError(f"no run {run_id!r} in {self.history.path}")
        known = self.history.progress(run_id)
        return RunView(run_id, info.modules, {m: known.get(m) for m in info.modules})

    def wait(self, run_id: str, *, interval: float = 0.5, timeout: float | None = None) -> RunView:
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            view = self.sync(run_id)
            if view.finished or (end is not None and time.monotonic() > end):
                return view
            time.sleep(interval)

    def cancel(self, run_id: str, modules: Iterable[str] | None = None, reason: str = "cancelled by user") -> None:
        if modules is None:
            self.kv.cancel(run_id, reason=reason)
        else:
            for m in modules:
                self.kv.cancel(run_id, m, reason=reason)

    def active_runs(self) -> list[str]:
        cur = self.history.conn.execute("SELECT run_id FROM runs WHERE kind='run' AND state='running'")
        return [r[0] for r in cur.fetchall()]


def failed_progress(run_id: str, module: str, release: str, step: str, message: str, keys: int,
                    now: float) -> RunProgress:
    """A module's part of a run failed by the controller at ``step`` (it never reached the module)."""
    return RunProgress(run_id=run_id, module=module, release=release, state=RunState.FAILED, step=step,
                       keys_total=keys, updated_at=now, finished_at=now, error=StepError(step=step, message=message))


def args_label(args: Sequence[object]) -> str:
    """What Celery shows of a task's arguments (its message headers, worker events) in place of their repr: a
    run request's repr cost ~2 ms of the controller's CPU per message, and would copy its values into them."""
    first = args[0] if args else None
    if len(args) == 1 and isinstance(first, dict) and isinstance(first.get("run_id"), str):
        return f"(<run request {first['run_id'][:64]} for {str(first.get('module'))[:64]}>,)"
    return f"(<{len(args)} argument(s)>)"


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return re.sub(r"://[^@/\s]*@", "://***@", text)[:300]


def read_heartbeats(settings: BrokerSettings, modules: Iterable[str]) -> dict[str, Heartbeat | None]:
    """Heartbeats of ``modules`` as the controller sees them (for deploy's first-heartbeat wait)."""
    from contract.celery_app import make_app
    from contract.kv import KV

    app = make_app(settings)
    try:
        return KV(app).heartbeats(modules)
    finally:
        app.close()

