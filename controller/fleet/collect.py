"""Follow a run: pull its modules' progress, rows and telemetry from the broker into the history.

``sync`` is idempotent and can be called by any controller process at any time (the attached
CLI, ``fleetctl status``, or ``fleetctl serve`` when nobody is attached): results reach the
history whether or not a CLI stays attached. Every time an agent wrote (a run's ``started_at``,
``updated_at``) is read through its measured clock skew. A module whose final state arrived
without all it names is *collecting* until the rest arrives or ``collect_timeout`` passes;
one silent past its bounds is given up (:func:`liveness`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, TypeGuard

from contract.digest import is_sealed, record_digest, rows_digest
from contract.records import ResultRow, RunProgress, RunState, StepError, TelemetrySummary
from contract.settings import BrokerSettings
from controller.fleet.errors import BrokerUnavailable, FleetError, broker_errors, error_line
from controller.fleet.runs import RunView, failed_progress

if TYPE_CHECKING:
    from contract.kv import KV, Beat
    from controller.history import History

log = logging.getLogger("fleet.controller")


def liveness(p: RunProgress | None, beat: Beat | None, now: float, *, dispatched_at: float,
             settings: BrokerSettings) -> str | None:
    """Why a (run, module) that is not terminal must be given up now, or None (pure).

    The bounds: no heartbeat for ``lost_after``; started more than ``module_deadline`` ago; queued for
    ``queue_deadline`` (when set), behind other runs or not; queued
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
    if queued and settings.queue_deadline and now - dispatched_at > settings.queue_deadline:
        return (f"waited {now - dispatched_at:.0f} s on the module's queue without starting "
                f"(queue_deadline {settings.queue_deadline:g} s)")
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


class Sync:
    """The fleet's following side: sync a run from the broker, its view from the history, a wait on it."""

    settings: BrokerSettings
    history: History
    kv: KV

    if TYPE_CHECKING:
        def beats(self, names: Iterable[str]) -> dict[str, Beat | None]: ...

    def sync(self, run_id: str, now: float | None = None) -> RunView:
        """Pull progress and rows of ``run_id`` from the broker into the history.

        A broker that cannot be reached raises :class:`BrokerUnavailable` (nothing is
        marked lost while the controller itself cannot see the broker).
        """
        try:
            return self._sync(run_id, now)
        except broker_errors() as exc:
            raise BrokerUnavailable(
                f"broker {self.settings.redacted_broker_url()} unreachable: {error_line(exc)}") from exc

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
                known[m] = self._record_foreign(run_id, m, info.release, p, len(info.models_of(m)), now)
                continue
            if p is not None and cur is not None and was_lost:
                # the late state's time is the agent's clock, when the module was given up the controller's
                if not p.state.terminal and p.updated_at - skew <= (cur.finished_at or 0.0):
                    p = None  # nothing newer than when the module was given up
                else:
                    self.history.add_event(run_id, m, f"late {p.state.value} state accepted after the module was "
                                                      f"marked lost ({cur.error.message if cur.error else ''})")
            if p is not None:
                have = self.history.release_row_count(run_id, m)
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
            why = liveness(cur, beat, now, dispatched_at=info.dispatched_at or info.created_at, settings=self.settings)
            if why:
                self.kv.cancel(run_id, m, reason=why, lost=True)  # a later delivery must not run it
                known[m] = self._record_lost(run_id, m, info.release, cur, why, len(info.models_of(m)), now)
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
