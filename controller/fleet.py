"""Dispatch runs to modules, follow them, keep their results: the controller's fleet seam.

Everything here talks to the broker through one Celery app and the backend KV
(``contract.kv``); the run history is the only other store. Module states follow LAVA's
shape: ``idle``, ``busy``, ``offline`` (no heartbeat for ``offline_after``), ``bad``
(unhealthy heartbeat or ``failures_for_bad`` failed runs in a row). A heartbeat's age is the
broker's (``contract.kv.Beat``), never the agent's clock; every time an agent wrote (a run's
``started_at``, ``updated_at``) is read through its measured clock skew. ``sync`` is
idempotent and can be called by any controller process at any time (the attached CLI,
``fleetctl status``, or ``fleetctl serve`` when nobody is attached): results reach the
history whether or not a CLI stays attached.
"""

from __future__ import annotations

import contextlib
import logging
import re
import secrets
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypeGuard

from agent.errors import BadInput
from agent.store import check_run_id
from contract.digest import is_sealed, record_digest, rows_digest
from contract.records import (
    Heartbeat,
    ResultRow,
    RunProgress,
    RunRequest,
    RunState,
    StepError,
    TelemetrySummary,
    release_version_of,
)
from contract.settings import BrokerSettings
from controller.errors import FleetctlError
from controller.history import RESET_EVENT, History
from controller.inventory import Module

if TYPE_CHECKING:
    from celery import Celery

    from contract.kv import KV, Beat

# Celery, kombu and redis (~0.4 s of imports) load when a Fleet is made or a broker error is
# caught, not when a verb that only reads the history imports this module.

log = logging.getLogger("fleet.controller")


class FleetError(FleetctlError, RuntimeError):
    """Root of the controller's fleet errors (the CLI maps them to exit code 2)."""


class BrokerUnavailable(FleetError, ConnectionError):
    http_status = 503


class BadRelease(FleetError, ValueError):
    pass


class RunIdInUse(FleetError):
    """A run id another controller used: its records are on the broker, and not in this history."""


class EvictingBroker(FleetError, ValueError):
    """The broker's Redis may evict keys (``maxmemory-policy``): the one line names the fix."""

    http_status = 503


def broker_errors() -> tuple[type[BaseException], ...]:
    """What a broker or backend that cannot be reached raises (imports redis and kombu)."""
    from kombu.exceptions import OperationalError
    from redis.exceptions import RedisError

    return (RedisError, OperationalError, ConnectionError, TimeoutError)


# --------------------------------------------------------------------------- pure parts
@dataclass(frozen=True)
class ModuleStatus:
    name: str
    state: str  # idle | busy | unreachable | offline | bad
    reason: str = ""
    heartbeat: Heartbeat | None = None
    age: float | None = None  # seconds since the broker took the last heartbeat
    skew: float | None = None  # the agent's clock minus the controller's, s (None: not measured)


def derive_state(beat: Beat | None, now: float, *, offline_after: float, consecutive_failures: int = 0,
                 failures_for_bad: int = 3, lost_after: float | None = None,
                 streak: FailureStreak | None = None, failures_cooldown: float | None = None) -> tuple[str, str]:
    """``unreachable``: no heartbeat for ``offline_after`` (its run goes on); ``offline``: for ``lost_after``.

    The heartbeat's age is ``now - beat.at`` (when the broker took it), never the agent's own ``ts``.
    ``bad`` by failed runs (``streak``, or ``consecutive_failures``) holds until a run passes, the failures
    are reset (``fleetctl devices reset``), or the last of them ended ``failures_cooldown`` ago: the module
    then takes work again (on trial: one more failed run makes it bad again for as long).
    """
    if beat is None:
        return "offline", "no heartbeat ever"
    hb = beat.hb
    age = now - beat.at
    if age > max(offline_after, lost_after or 0.0):
        return "offline", f"no heartbeat for {age:.0f} s"
    if age > offline_after:
        return "unreachable", f"no heartbeat for {age:.0f} s" + (f", run {hb.run_id} goes on" if hb.run_id else "")
    if not hb.healthy:
        return "bad", hb.detail or "agent reports itself unhealthy"
    streak = streak if streak is not None else FailureStreak(consecutive_failures)
    trial = ""
    if streak.count >= failures_for_bad:
        since = None if streak.last_at is None else now - streak.last_at
        reset = f"`fleetctl devices reset {hb.module}`"
        if failures_cooldown is None or since is None:
            return "bad", f"{streak.count} failed runs in a row: takes work again after {reset}"
        if since < failures_cooldown:
            return "bad", (f"{streak.count} failed runs in a row, the last {_minutes(since)} ago: takes work again "
                           f"in {_minutes(failures_cooldown - since)} (on trial), or now after {reset}")
        trial = (f"on trial: {streak.count} failed runs in a row, the last {_minutes(since)} ago "
                 f"(one more makes it bad again)")
    if hb.run_id:
        return "busy", f"run {hb.run_id}" + (f", {hb.step}" if hb.step else "") + (f"; {trial}" if trial else "")
    return "idle", trial


@dataclass(frozen=True)
class FailureStreak:
    """A module's failed runs in a row, newest first, since its last reset; ``last_at``: when the newest
    ended (the controller's clock)."""

    count: int = 0
    last_at: float | None = None


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def skew_warning(skew: float | None, bound: float) -> str:
    """The warning a module's clock skew earns past ``bound`` (empty within it or when not measured)."""
    if skew is None or abs(skew) <= bound:
        return ""
    way = "ahead of" if skew > 0 else "behind"
    return f"clock {abs(skew):.0f} s {way} the controller's (warning past {bound:.0f} s: is NTP running there?)"


def conflict_note(conflict: tuple[Mapping[str, object], float | None] | None, now: float) -> str:
    """The reason text of a name conflict: a second agent refused the name (it exited at once). Shown for
    ``CONFLICT_TTL`` after the refusal, by the broker's clock (Redis expires the record; embedded: its mtime)."""
    from contract.kv import CONFLICT_TTL

    if conflict is None:
        return ""
    record, at = conflict
    if at is None or not 0 <= now - at < CONFLICT_TTL:
        return ""
    held = record.get("held_by")
    held = held if isinstance(held, Mapping) else {}
    return (f"name conflict: a second agent on {record.get('host')} (pid {record.get('pid')}) was refused and "
            f"exited {now - at:.0f} s ago; the name is held by {held.get('host')} (pid {held.get('pid')})")


def release_version(tarball: Path) -> str:
    version = release_version_of(tarball.name)
    if version is None:
        raise BadRelease(f"{tarball}: not a release tarball name (SGLang-MUSA-M1000-M1000_<version>_sglang.tar.gz)")
    return version


def new_run_id(now: float | None = None) -> str:
    t = time.gmtime(now if now is not None else time.time())
    return time.strftime("%Y%m%d-%H%M%S", t) + "-" + secrets.token_hex(2)


def module_failed(p: RunProgress) -> bool:
    return p.state in (RunState.FAILED, RunState.LOST) or any(o.status == "failed" for o in p.outcomes)


def liveness(p: RunProgress | None, beat: Beat | None, now: float, *, dispatched_at: float,
             settings: BrokerSettings) -> str | None:
    """Why a (run, module) that is not terminal must be given up now, or None (pure).

    The bounds: no heartbeat for ``lost_after``; started more than ``module_deadline`` ago; queued
    while the module was alive and idle for ``start_timeout`` (the message never reached it); started,
    and the module alive and idle while the run has not reported for ``start_timeout`` (its end never
    reached the broker). The heartbeat's age is the broker's (``beat.at``); the run's own times were
    written on the agent's clock and are read through its measured skew.
    """
    silent = now - beat.at if beat is not None else now - dispatched_at
    if silent > settings.lost_after:
        return (f"agent lost: no heartbeat for {silent:.0f} s" if beat is not None
                else f"agent lost: never seen in {silent:.0f} s")
    skew = (beat.skew or 0.0) if beat is not None else 0.0
    started = p.started_at - skew if p is not None and p.started_at is not None else None
    if started is not None and now - started > settings.module_deadline:
        return f"deadline passed: running for {now - started:.0f} s (bound {settings.module_deadline:.0f} s)"
    queued = p is None or (p.state == RunState.PENDING and p.started_at is None)
    idle = beat is not None and beat.hb.run_id is None and silent <= settings.offline_after
    if queued and idle and now - dispatched_at > settings.start_timeout:
        return f"never started: the module stayed idle for {now - dispatched_at:.0f} s after dispatch"
    if not queued and p is not None and idle and now - (p.updated_at - skew) > settings.start_timeout:
        # its end never reached the broker (e.g. a write taken by a Redis master that died before its replica had it)
        return (f"end lost: the module is idle and its run last reported {now - (p.updated_at - skew):.0f} s ago "
                f"({p.state.value}, {p.step or 'start'})")
    return None


# A module whose final state reached the controller without all it names (rows, telemetry summary) is
# "collecting": recorded as still publishing, this step, until its history holds all of it or collect_timeout
# passes (then its part ends failed: "N of M rows reached the controller"), never done with rows missing.
COLLECT_STEP = "collecting"


def is_collecting(p: RunProgress | None) -> TypeGuard[RunProgress]:
    return p is not None and p.state == RunState.PUBLISHING and p.step == COLLECT_STEP


def record_gap(p: RunProgress, rows: Sequence[ResultRow], telemetry: TelemetrySummary | None) -> str | None:
    """What of the module's final state ``p`` the controller's history lacks, in words; None when it holds all
    of it (pure).

    ``rows``: the module's rows of the run in the history (every source); ``telemetry``: its device telemetry
    summary there. A sealed state (:func:`contract.digest.seal`) needs exactly the rows of its seal and the
    summary it refers to; one from an agent before the seal is complete once it carries ``finished_at``
    (such an agent published ``done`` before its final state).
    """
    missing: list[str] = []
    if is_sealed(p):
        if len(rows) != p.stored_rows or rows_digest(rows) != p.rows_digest:
            differ = " (they differ from the module's)" if len(rows) == p.stored_rows else ""
            missing.append(f"{len(rows)} of {p.stored_rows} rows reached the controller{differ}")
        if p.telemetry_digest is not None and (telemetry is None or record_digest(telemetry) != p.telemetry_digest):
            missing.append("its device telemetry summary has not")
    elif p.finished_at is None:
        missing.append("its final state (with finished_at) has not reached the controller")
    return "; ".join(missing) or None


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
    def __init__(self, settings: BrokerSettings, history: History, *, failures_for_bad: int = 3,
                 failures_cooldown: float | None = 900.0, clock_skew_warn: float = 30.0) -> None:
        self.settings = settings
        self.history = history
        from contract.celery_app import make_app
        from contract.kv import KV

        self.app: Celery = make_app(settings)
        self.kv: KV = KV(self.app)
        self.failures_for_bad = failures_for_bad
        self.failures_cooldown = failures_cooldown
        self.clock_skew_warn = clock_skew_warn

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

    def beats(self, names: Iterable[str]) -> dict[str, Beat | None]:
        """Heartbeats with when the broker took them (their age never from the agent's clock)."""
        return self.kv.beats(names)

    def consecutive_failures(self, module: str, limit: int = 10) -> int:
        return self.failure_streak(module, limit=limit).count

    def failure_streak(self, module: str, *, limit: int = 10, skew: float = 0.0) -> FailureStreak:
        """The module's failed runs in a row, newest first (pure reading of the history).

        Not counted, and not ending the streak: a run not terminal yet, and a refusal (``attempt`` 0: the
        controller never sent it, the module was offline, bad or lacked the release). Ended by a run that
        passed and by ``fleetctl devices reset`` (runs created before it are not read). ``skew``: the module's
        clock against the controller's, for the end times the agent wrote (a LOST end is the controller's).
        """
        reset = self.history.last_module_reset(module)
        cur = self.history.conn.execute(
            "SELECT m.progress, r.created_at FROM module_runs m LEFT JOIN runs r ON r.run_id = m.run_id"
            " WHERE m.module=? AND COALESCE(json_extract(m.progress, '$.attempt'), 1) != 0"
            " ORDER BY m.updated_at DESC LIMIT ?", (module, limit))
        n, last = 0, None
        for raw, created in cur.fetchall():
            if reset is not None and created is not None and created <= reset:
                break
            p = RunProgress.model_validate_json(raw)
            if not p.state.terminal:
                continue
            if not module_failed(p):
                break
            if last is None:
                ended = p.finished_at or p.updated_at
                last = ended if p.state == RunState.LOST else ended - skew
            n += 1
        return FailureStreak(n, last)

    def reset_failures(self, module: str) -> int:
        """Clear the module's failed runs in a row (an event in the history); how many there were."""
        n = self.failure_streak(module).count
        self.history.add_module_event(module, f"{RESET_EVENT}: {n} failed run(s) in a row cleared")
        return n

    def statuses(self, modules: Sequence[Module], now: float | None = None) -> dict[str, ModuleStatus]:
        beats = self.beats(m.name for m in modules)
        conflicts = self.kv.conflicts(m.name for m in modules)
        now = time.time() if now is None else now
        out: dict[str, ModuleStatus] = {}
        for m in modules:
            beat = beats.get(m.name)
            skew = beat.skew if beat is not None else None
            streak = self.failure_streak(m.name, skew=skew or 0.0)
            state, reason = derive_state(beat, now, offline_after=self.settings.offline_after,
                                         failures_for_bad=self.failures_for_bad, lost_after=self.settings.lost_after,
                                         streak=streak, failures_cooldown=self.failures_cooldown)
            notes = [reason, skew_warning(skew, self.clock_skew_warn), conflict_note(conflicts.get(m.name), now)]
            out[m.name] = ModuleStatus(m.name, state, "; ".join(n for n in notes if n), beat.hb if beat else None,
                                       (now - beat.at) if beat else None, skew)
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

    def check_new_run_id(self, run_id: str, *, resume: bool = False, modules: Iterable[str] = ()) -> None:
        """A run id must match the agents' pattern; one already in the history only with ``resume``; one this
        history does not hold must have no record on the broker for any of ``modules`` (:class:`RunIdInUse`).

        Run ids name records on the broker, shared by every controller of the fleet: another controller's run of
        that id would be answered (or refused) by the modules as theirs. One MGET for all modules (``KV.progress``).
        """
        try:
            check_run_id(run_id)
        except BadInput as exc:
            raise FleetError(str(exc)) from None
        known = self.history.run(run_id) is not None
        if not resume and known:
            raise FleetError(f"run id {run_id!r} is already in the history; resume it explicitly or choose another")
        names = list(dict.fromkeys(modules))
        if known or not names:  # resumed: the records on the broker are this history's own run
            return
        found = {m: p for m, p in self.kv.progress(run_id, names).items() if p is not None}
        if found:
            raise RunIdInUse(run_id_in_use(run_id, found, self.history.path))

    def dispatch(self, *, run_id: str, modules: Sequence[Module], tarballs: Mapping[str, str], sha256: str,
                 release: str, models: Sequence[str], tarball_label: str = "",
                 statuses: Mapping[str, ModuleStatus] | None = None, resume: bool = False) -> dict[str, str]:
        """Record the run and enqueue it on every module that can take it.

        Returns module -> "queued" or the reason it was not (offline, bad, no release):
        those modules are recorded as failed at once, not after an hour. A run id must match the
        agents' pattern, and may be one already in the history only with ``resume`` (each module
        then keeps the keys that passed).
        """
        self.check_new_run_id(run_id, resume=resume, modules=[m.name for m in modules])
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
        beats = self.beats(pending) if pending else {}
        for m in pending:
            p, cur = live.get(m), known.get(m)
            if p is not None and is_collecting(cur) and not p.state.terminal:
                p = None  # the broker lost the final state (the module sends it again): nothing newer than it
            was_lost = cur is not None and cur.state == RunState.LOST
            beat = beats.get(m)
            skew = (beat.skew or 0.0) if beat is not None else 0.0
            if p is not None and p.release and info.release and p.release != info.release:
                # another release's record under this run id (another controller used it): never this run's result
                known[m] = self._record_foreign(run_id, m, info.release, p, len(info.models), now)
                continue
            if p is not None and cur is not None and was_lost:
                # the late state's time is the agent's clock, when the module was given up the controller's
                if not p.state.terminal and p.updated_at - skew <= (cur.finished_at or 0.0):
                    p = None  # nothing newer than when the module was given up
                else:
                    self.history.add_event(run_id, m, f"late {p.state.value} state accepted after the module was "
                                                      f"marked lost ({cur.error.message if cur.error else ''})")
            if p is not None:
                have = self.history.conn.execute(
                    "SELECT COUNT(*) FROM rows WHERE run_id=? AND module=? AND source='release'",
                    (run_id, m)).fetchone()[0]
                foreign: list[str] = []
                if p.rows != have or p.state.terminal:
                    rows = self.kv.rows(run_id, m)
                    foreign = sorted({r.release or "?" for r in rows or () if r.release != info.release})
                    if rows is not None and not foreign:
                        self.history.replace_rows(run_id, m, rows)
                if foreign and p.state.terminal:  # the rows of another release: none taken, the part failed
                    reason = (f"the broker's rows of run {run_id} on {m} are of release {', '.join(foreign)}, not "
                              f"{info.release}: not taken as this run's result (another controller used this run id)")
                    self.history.add_event(run_id, m, reason)
                    log.warning("run %s on %s: %s", run_id, m, reason)
                    if p.state != RunState.FAILED:
                        p = p.model_copy(update={"state": RunState.FAILED, "updated_at": now,
                                                 "finished_at": p.finished_at or now,
                                                 "error": StepError(step="sync", message=reason)})
                # device telemetry: published with the last progress of a run the module started (a refused request
                # publishes none: what is there is of another request)
                if p.state.terminal and not foreign:
                    summary = self.kv.telemetry(run_id, m) if p.started_at is not None else None
                    if summary is not None:
                        self.history.upsert_telemetry(summary)
                    p = self._complete(run_id, m, p, summary, now)
                if p != cur:  # an unchanged module costs no write (a pass writes what changed, not N rows)
                    self.history.upsert_progress(p, force=was_lost)
                known[m] = cur = p
            if cur is not None and cur.state.terminal:
                continue
            if is_collecting(cur):
                failed = self._collect_bound(run_id, m, cur, now)
                if failed is not None:
                    known[m] = failed
                continue  # the module is done running: only its record is awaited, bounded by collect_timeout
            why = liveness(cur, beat, now, dispatched_at=info.created_at, settings=self.settings)
            if why:
                self.kv.cancel(run_id, m, reason=why, lost=True)  # a later delivery must not run it
                known[m] = self._record_lost(run_id, m, info.release, cur, why, len(info.models), now)
        view = RunView(run_id, info.modules, {m: known.get(m) for m in info.modules})
        if view.finished and info.state != view.state():
            self.history.set_run_state(run_id, view.state())
        return view

    def _complete(self, run_id: str, module: str, p: RunProgress, summary: TelemetrySummary | None,
                  now: float) -> RunProgress:
        """The module's final state ``p`` as the history records it: ``p`` itself once the history holds all it
        names (then acknowledged to the module, which stops sending it), else the module collecting.
        ``summary``: the telemetry summary just read from the broker (and recorded)."""
        if p.telemetry_digest is not None and (summary is None or record_digest(summary) != p.telemetry_digest):
            summary = self.history.telemetry(run_id).get(module)  # an earlier sync may have recorded it
        gap = record_gap(p, self.history.rows(run_id, module, source=None), summary)
        if gap is None:
            if is_sealed(p):
                self.kv.put_ack(p)
            return p
        if self._collecting_since(run_id, module) is None:
            self.history.add_event(run_id, module, f"collecting: the module reported {p.state.value}, but {gap}; "
                                                   "waiting for the module to send the rest")
            log.warning("run %s on %s: collecting, %s", run_id, module, gap)
        have = len(self.history.rows(run_id, module))  # the release's rows, as `rows` counts them
        collecting = p.model_copy(update={"state": RunState.PUBLISHING, "step": COLLECT_STEP, "finished_at": None,
                                          "rows": have, "error": StepError(step="collect", message=gap)})
        return self._collect_bound(run_id, module, collecting, now) or collecting

    def _collecting_since(self, run_id: str, module: str) -> float | None:
        return next((ts for m, ts, msg in self.history.events(run_id)
                     if m == module and msg.startswith("collecting:")), None)

    def _collect_bound(self, run_id: str, module: str, cur: RunProgress, now: float) -> RunProgress | None:
        """A module collecting for longer than ``collect_timeout``: its part ends failed, with what is missing."""
        since = self._collecting_since(run_id, module)
        if since is None or now - since <= self.settings.collect_timeout:
            return None
        gap = cur.error.message if cur.error else "its final record is incomplete"
        p = cur.model_copy(update={"state": RunState.FAILED, "updated_at": max(now, cur.updated_at),
                                   "finished_at": now, "error": StepError(
                                       step="collect", message=f"{gap} (waited {now - since:.0f} s, bound "
                                                               f"{self.settings.collect_timeout:.0f} s)")})
        self.history.upsert_progress(p, force=True)
        self.history.add_event(run_id, module, f"failed: {gap} within {self.settings.collect_timeout:.0f} s")
        log.warning("run %s on %s: failed, %s", run_id, module, gap)
        if is_sealed(cur):
            self.kv.put_ack(cur)  # given up: the module stops sending it (its rows stay on the module)
        return p

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

    def _record_foreign(self, run_id: str, module: str, release: str, found: RunProgress, keys: int,
                        now: float) -> RunProgress:
        """The module's record of ``run_id`` on the broker is of another release: its part failed, nothing taken."""
        why = (f"the broker's record of run {run_id} on {module} is of release {found.release} "
               f"({found.state.value}), not {release}: not taken as this run's result "
               "(another controller used this run id)")
        p = failed_progress(run_id, module, release, "sync", why, keys, now)
        self.history.upsert_progress(p, force=True)
        self.history.add_event(run_id, module, why)
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


def run_id_in_use(run_id: str, found: Mapping[str, RunProgress], history: object, shown: int = 4) -> str:
    """One line: the modules where the broker holds a record of ``run_id``, and the state found (pure)."""
    items = [f"{m} ({p.state.value}{', release ' + p.release if p.release else ''})" for m, p in found.items()]
    more = f" and {len(items) - shown} more" if len(items) > shown else ""
    return (f"run id {run_id!r} is already on the broker, not in {history}: {', '.join(items[:shown])}{more} "
            "(another controller's run); choose another run id")


def failed_progress(run_id: str, module: str, release: str, step: str, message: str, keys: int,
                    now: float) -> RunProgress:
    """A module's part of a run failed by the controller at ``step`` (it never reached the module).

    ``attempt`` 0: never delivered. The run fails there, but it is a refusal, not a failed run of the module
    (:meth:`Fleet.failure_streak` does not count it: a bad module would never recover otherwise)."""
    return RunProgress(run_id=run_id, module=module, release=release, state=RunState.FAILED, step=step,
                       keys_total=keys, updated_at=now, finished_at=now, attempt=0,
                       error=StepError(step=step, message=message))


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


def read_beats(settings: BrokerSettings, modules: Iterable[str]) -> dict[str, Beat | None]:
    """Heartbeats of ``modules`` with when the broker took them (for deploy's waits)."""
    from contract.celery_app import make_app
    from contract.kv import KV

    app = make_app(settings)
    try:
        return KV(app).beats(modules)
    finally:
        app.close()


def read_heartbeats(settings: BrokerSettings, modules: Iterable[str]) -> dict[str, Heartbeat | None]:
    """Heartbeats of ``modules`` as the controller sees them (for deploy's first-heartbeat wait)."""
    from contract.celery_app import make_app
    from contract.kv import KV

    app = make_app(settings)
    try:
        return KV(app).heartbeats(modules)
    finally:
        app.close()

