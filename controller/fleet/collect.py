"""Follow a run: pull its modules' progress, rows and telemetry from the broker into the history.

``sync`` is idempotent and can be called by any controller process at any time (the attached
CLI, ``fleetctl status``, or ``fleetctl serve`` when nobody is attached): results reach the
history whether or not a CLI stays attached. Every time an agent wrote (a run's ``started_at``,
``updated_at``) is read through its measured clock skew. A module whose final state arrived
without all it names is *collecting* until the rest arrives or ``COLLECT_TIMEOUT`` passes;
one silent past its bounds is given up (:func:`liveness`).

Lazy imports: :mod:`contract.kv` loads Celery (its app: 123 ms of CPU, ``bench/import_costs.py``,
bench/results/import_costs_20261207_0346_lazy-libraries.txt), imported where a pass reads the broker: a verb that
only reads the history imports this module with :mod:`controller.fleet` and does not pay it
(tests/cli/test_lean_verbs.py).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pydantic import TypeAdapter, ValidationError

from contract.digest import is_sealed, record_digest, rows_digest, seal_version
from contract.records import Heartbeat, ResultRow, RunProgress, RunState, StepError, TelemetrySummary
from contract.settings import RESULT_EXPIRES, BrokerSettings
from controller.fleet.errors import BrokerUnavailable, FleetError, broker_errors, error_line
from controller.fleet.power import after_pass
from controller.fleet.runs import RunView, failed_progress
from controller.fleet.sync_plan import (
    Take,
    beat_read_times,
    beats_due,
    collecting_progress,
    foreign_rows,
    is_collecting,
    kept_rows,
    pending_modules,
    plan_take,
    rows_failed,
)
from controller.history.records import HistoryUnavailable

if TYPE_CHECKING:
    from contract.kv import KV, Beat
    from controller.fleet.power import PassHook
    from controller.history import History

# constants, not settings (ADR 0058)
# s: an idle, live module that has not started (or ended) its run by then is lost
START_TIMEOUT = 300.0
# s: a final state whose rows (or telemetry summary) have not all arrived by then is failed
COLLECT_TIMEOUT = 600.0

log = logging.getLogger("fleet.controller")


def liveness(p: RunProgress | None, beat: Beat | None, now: float, *, dispatched_at: float,
             settings: BrokerSettings) -> str | None:
    """Why a (run, module) that is not terminal must be given up now, or None (pure).

    The bounds: no heartbeat for ``lost_after``; started more than ``module_deadline`` ago; queued for
    ``queue_deadline`` (when set), behind other runs or not; queued
    while the module was alive and idle for ``START_TIMEOUT`` (the message never reached it); started,
    and the module alive and idle while the run has not reported for ``START_TIMEOUT`` (its end never
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
    if queued and idle and now - dispatched_at > START_TIMEOUT:
        return f"never started: the module stayed idle for {now - dispatched_at:.0f} s after dispatch"
    if not queued and p is not None and idle and now - (p.updated_at - skew) > START_TIMEOUT:
        # its end never reached the broker (e.g. a write taken by a Redis master that died before its replica had it)
        return (f"end lost: the module is idle and its run last reported {now - (p.updated_at - skew):.0f} s ago "
                f"({p.state.value}, {p.step or 'start'})")
    return None


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
        v = seal_version(p)
        if len(rows) != p.stored_rows or rows_digest(rows, v) != p.rows_digest:
            differ = " (they differ from the module's)" if len(rows) == p.stored_rows else ""
            missing.append(f"{len(rows)} of {p.stored_rows} rows reached the controller{differ}")
        if p.telemetry_digest is not None and (telemetry is None or record_digest(telemetry, v) != p.telemetry_digest):
            missing.append("its device telemetry summary has not")
    elif p.finished_at is None:
        missing.append("its final state (with finished_at) has not reached the controller")
    return "; ".join(missing) or None


T = TypeVar("T")


@dataclass(frozen=True)
class Parsed(Generic[T]):
    """Records parsed by their raw text: a record read again unchanged is not parsed again."""

    by_key: Mapping[str, tuple[Any, T]] = field(default_factory=dict)

    def update(self, raws: Mapping[str, Any], parse: Any, limit: int | None = None) -> tuple[Parsed[T], list[str]]:
        """The records of ``raws`` (key -> raw text), and the keys whose text changed (parsed now). With ``limit``,
        at most that many are parsed: a changed record past it keeps what was parsed before (left out when there
        was nothing), and counts as changed again the next time."""
        out: dict[str, tuple[Any, T]] = {}
        changed: list[str] = []
        for key, raw in raws.items():
            old = self.by_key.get(key)
            if old is not None and old[0] == raw:
                out[key] = old
            elif limit is not None and len(changed) >= limit:
                if old is not None:
                    out[key] = old
            else:
                out[key] = (raw, parse(raw))
                changed.append(key)
        return Parsed(out), changed

    def get(self, key: str) -> T | None:
        found = self.by_key.get(key)
        return None if found is None else found[1]


@dataclass(frozen=True)
class PassMemo:
    """What a run's last sync pass read, parsed (:class:`Parsed`), and the modules it found settled: their broker
    record and the history's the same objects, equal, with the rows the record names in the history. A module's
    heartbeat is read again once a ``heartbeat_interval`` (it changes no faster), each module at its own time in the
    interval (``beats_read``: when each counts as read, :func:`~controller.fleet.sync_plan.beat_read_times`), and
    before a module is given up."""

    known: Parsed[RunProgress] = field(default_factory=Parsed)
    live: Parsed[RunProgress | None] = field(default_factory=Parsed)
    beats: Parsed[Beat | None] = field(default_factory=Parsed)
    settled: Mapping[str, tuple[RunProgress, RunProgress]] = field(default_factory=dict)
    beats_read: Mapping[str, float] = field(default_factory=dict)


# a pass stays short when ten thousand modules end at once (bench/scale.py: the longest pass at 10,000 modules): it
# takes at most this many final states (each one's rows read, checked against its seal and written) and parses at
# most this many changed records (and as many heartbeats read for the first time); the others are read again by the
# next pass, neither taken nor judged meanwhile
FINALS_PER_PASS = 200
PARSES_PER_PASS = 1000
# the runs whose last pass a Sync remembers (``fleetctl serve`` follows every running run)
MEMO_RUNS = 16


@dataclass
class PassWrites:
    """What one pass writes, gathered and then written at once: one history transaction, one broker pipeline."""

    rows: dict[str, list[ResultRow]] = field(default_factory=dict)
    telemetry: list[TelemetrySummary] = field(default_factory=list)
    progress: dict[str, RunProgress] = field(default_factory=dict)
    forced: dict[str, RunProgress] = field(default_factory=dict)
    events: list[tuple[str, str]] = field(default_factory=list)
    acks: list[RunProgress] = field(default_factory=list)
    cancels: list[tuple[str, str]] = field(default_factory=list)  # (module, why): given up, lost

    def put(self, p: RunProgress, *, force: bool = False) -> None:
        """``p`` becomes the module's progress (``force``: even over a newer one); the last of a pass wins."""
        if force or p.module in self.forced:
            self.progress.pop(p.module, None)
            self.forced[p.module] = p
        else:
            self.progress[p.module] = p


class Sync:
    """The fleet's following side: sync a run from the broker, its view from the history, a wait on it.

    A pass (:meth:`sync`) reads the run's progress from the history and every pending module's progress from the
    broker in one MGET, with the heartbeats once a ``heartbeat_interval`` (:meth:`_read`), parses only what changed
    since the last pass, decides in pure functions (:mod:`controller.fleet.sync_plan`, :func:`liveness`), reads the
    rows and telemetry of the modules it takes in one MGET and writes what it took in one transaction
    (:class:`PassWrites`)."""

    settings: BrokerSettings
    history: History
    kv: KV
    collect_timeout: float
    _sync_memos: dict[str, PassMemo]
    pass_hooks: tuple[PassHook, ...] = ()

    if TYPE_CHECKING:
        def beats(self, names: Iterable[str]) -> dict[str, Beat | None]: ...
        def send_unsent(self, run_id: str, now: float | None = None) -> list[str]: ...

    def sync(self, run_id: str, now: float | None = None) -> RunView:
        """Pull progress and rows of ``run_id`` from the broker into the history, and send the requests a
        dispatch that stopped recorded and never sent (:meth:`~controller.fleet.dispatch.Dispatch.send_unsent`).

        A broker that cannot be reached raises :class:`BrokerUnavailable` (nothing is
        marked lost while the controller itself cannot see the broker).
        """
        try:
            view = self._sync(run_id, now)
            if not view.finished:
                self.send_unsent(run_id, now)
            return view
        except HistoryUnavailable:  # the history's ConnectionError, said as such
            raise
        except broker_errors() as exc:
            raise BrokerUnavailable(
                f"broker {self.settings.redacted_broker_url()} unreachable: {error_line(exc)}") from exc

    def _memos(self) -> dict[str, PassMemo]:
        if "_sync_memos" not in self.__dict__:
            self._sync_memos = {}
        return self._sync_memos

    def _sync(self, run_id: str, now: float | None = None) -> RunView:
        info = self.history.run(run_id)
        if info is None:
            raise FleetError(f"no run {run_id!r} in {self.history.path}")
        now = time.time() if now is None else now
        memo = self._memos().get(run_id, PassMemo())
        known_parsed, _ = memo.known.update(dict(self.history.progress_json(run_id)), RunProgress.model_validate_json)
        known: dict[str, RunProgress | None] = {m: known_parsed.get(m) for m in known_parsed.by_key}
        # modules the controller gave up (LOST) are still read: a late state or late rows are accepted
        pending = pending_modules(info.modules, known, late_ok=now - info.created_at < RESULT_EXPIRES)
        interval = self.settings.heartbeat_interval
        live_parsed, behind = self._read(run_id, pending, memo)
        # a module whose record waits for the next pass is neither taken nor judged: its heartbeat waits with it
        fresh = [m for m in beats_due(pending, memo.beats_read, now, interval, known) if m not in behind]
        beats_parsed = self._read_beats_of(pending, fresh, memo.beats)
        beats_read = {m: t for m, t in memo.beats_read.items() if m in beats_parsed.by_key}
        beats_read.update(beat_read_times(fresh, memo.beats_read, now, interval))
        fresh_set = set(fresh)
        live = {m: v[1] for m, v in live_parsed.by_key.items()}
        beats = {m: v[1] for m, v in beats_parsed.by_key.items()}
        writes = PassWrites()
        settled: dict[str, tuple[RunProgress, RunProgress]] = {}
        takes: dict[str, Take] = {}
        deferred = set(behind)  # read, not parsed yet (PARSES_PER_PASS)
        finals = 0
        for m in pending:
            p, cur = live.get(m), known.get(m)
            before = memo.settled.get(m)
            if m in deferred:
                continue
            if p is not None and cur is not None and before is not None and before[0] is p and before[1] is cur:
                settled[m] = (p, cur)  # unchanged, in the history: nothing to take
                continue
            beat = beats.get(m)
            t = plan_take(info.release, p, cur, skew=(beat.skew or 0.0) if beat is not None else 0.0)
            if t.progress is not None and t.progress.state.terminal:
                if finals >= FINALS_PER_PASS:
                    # its end is here, taken by a next pass (a pass stays short when thousands end)
                    deferred.add(m)
                    continue
                finals += 1
            takes[m] = t
        self._take(run_id, info.release, {m: t for m, t in takes.items() if t.progress is not None or t.foreign},
                   known, live, now, writes, settled, len_models={m: len(info.models_of(m)) for m in takes})
        events: list[tuple[str, float, str]] | None = None
        dispatched = info.dispatched_at or info.created_at
        for m in pending:
            cur = known.get(m)
            if cur is not None and cur.state.terminal or m in deferred:
                continue
            if is_collecting(cur):
                if events is None:
                    events = self.history.events(run_id)
                failed = self._collect_bound(run_id, m, cur, now, writes, _collecting_since(events, m))
                if failed is not None:
                    known[m] = failed
                # the module is done running: only its record is awaited, bounded by COLLECT_TIMEOUT
                continue
            why = liveness(cur, beats.get(m), now, dispatched_at=dispatched, settings=self.settings)
            if why and m not in fresh_set:  # never given up on an old heartbeat
                beats_parsed = self._read_beats_of(pending, [m], beats_parsed)
                beats[m] = beats_parsed.get(m)
                why = liveness(cur, beats[m], now, dispatched_at=dispatched, settings=self.settings)
            if why:
                writes.cancels.append((m, why))  # a later delivery must not run it
                known[m] = self._record_lost(run_id, m, info.release, cur, why, len(info.models_of(m)), now, writes)
        self._write(run_id, writes)
        # hung modules power-cycled, kernel logs kept (controller.fleet.power, .kernel_logs)
        if self.pass_hooks:
            after_pass(self.pass_hooks, self.history, run_id, known, {m: b.at if b else None for m, b in beats.items()},
                       now)
        memos = self._memos()
        memos.pop(run_id, None)
        memos[run_id] = PassMemo(known_parsed, live_parsed, beats_parsed, settled, beats_read)
        while len(memos) > MEMO_RUNS:
            memos.pop(next(iter(memos)))
        view = RunView(run_id, info.modules, {m: known.get(m) for m in info.modules})
        if view.finished and info.state != view.state():
            self.history.set_run_state(run_id, view.state())
        return view

    def _read(self, run_id: str, pending: Sequence[str],
              memo: PassMemo) -> tuple[Parsed[RunProgress | None], set[str]]:
        """The pending modules' progress on the broker, in one MGET, and the modules whose changed progress was left
        for the next pass (``PARSES_PER_PASS``)."""
        from contract.kv import _key, _load, _model

        raws = dict(zip(pending, self.kv.get_raw([_key("progress", run_id, m) for m in pending]), strict=True))
        live, _ = memo.live.update(raws, lambda r: _model(RunProgress, _load(r)), limit=PARSES_PER_PASS)
        got = live.by_key
        return live, {m for m, r in raws.items() if r is not None and (m not in got or got[m][0] != r)}

    def _read_beats_of(self, pending: Sequence[str], fresh: Sequence[str],
                       old: Parsed[Beat | None]) -> Parsed[Beat | None]:
        """The ``fresh`` modules' heartbeats read now (one MGET), the other pending modules' as read before (none for
        one never read)."""
        from contract.kv import _key

        got = self._parse_beats(dict(zip(fresh, self.kv.get_raw([_key("hb", m) for m in fresh]), strict=True)),
                                old).by_key
        before = old.by_key
        return Parsed({m: got[m] if m in got else before[m] for m in pending if m in got or m in before})

    def _parse_beats(self, raws: Mapping[str, Any], old: Parsed[Beat | None]) -> Parsed[Beat | None]:
        """Heartbeats by their text (``raws``): one whose text is unchanged is the one read before, when the broker
        took it; the others are taken at what their PTTL says (one round trip)."""
        from contract.kv import HEARTBEAT_TTL, _key, _load, _model, make_beat

        before = old.by_key
        changed = [m for m, r in raws.items() if r is not None and (m not in before or before[m][0] != r)]
        ats = dict(zip(changed, self.kv.taken_at([_key("hb", m) for m in changed], HEARTBEAT_TTL), strict=True))
        return Parsed({m: before[m] if m not in ats and m in before and before[m][0] == r
                       else (r, make_beat(_model(Heartbeat, _load(r)), ats.get(m))) for m, r in raws.items()})

    def _take(self, run_id: str, release: str, takes: Mapping[str, Take], known: dict[str, RunProgress | None],
              live: Mapping[str, RunProgress | None], now: float, writes: PassWrites,
              settled: dict[str, tuple[RunProgress, RunProgress]], len_models: Mapping[str, int]) -> None:
        """Take each module's broker record as :func:`plan_take` says: its rows where they differ from the history's
        or the record is final (one MGET), its telemetry summary, its completeness (:func:`record_gap`)."""
        from contract.kv import _key, _load, _model

        counts = self.history.release_row_counts(
            run_id, [m for m, t in takes.items() if t.progress is not None and not t.progress.state.terminal])
        fetch = [m for m, t in takes.items() if t.progress is not None
                 and (t.progress.state.terminal or t.progress.rows != counts[m])]
        raw_rows = dict(zip(fetch, self.kv.get_raw([_key("rows", run_id, m) for m in fetch]), strict=True))
        summarised = [m for m in fetch if (tp := takes[m].progress) is not None and tp.state.terminal
                      and tp.started_at is not None]
        summaries = {m: _model(TelemetrySummary, _load(r)) for m, r in zip(
            summarised, self.kv.get_raw([_key("telemetry", run_id, m) for m in summarised]), strict=True)}
        held_summaries: list[TelemetrySummary] | None = None
        events: list[tuple[str, float, str]] | None = None
        for m, t in takes.items():
            cur = known.get(m)
            if t.foreign:
                assert t.found is not None
                known[m] = self._record_foreign(run_id, m, release, t.found, len_models[m], now, writes)
                continue
            p = t.progress
            assert p is not None
            if t.late:
                writes.events.append((m, t.late))
            rows = parse_rows_json(raw_rows[m], run_id, m) if m in raw_rows else None
            foreign = foreign_rows(rows, release)
            if rows is not None and not foreign:
                writes.rows[m] = rows
            # the rows of another release: none taken, the part failed
            if foreign and p.state.terminal:
                p, reason = rows_failed(run_id, m, release, p, foreign, now)
                writes.events.append((m, reason))
                log.warning("run %s on %s: %s", run_id, m, reason)
            if p.state.terminal and not foreign:
                summary = summaries.get(m)
                if summary is not None:
                    writes.telemetry.append(summary)
                if p.telemetry_digest is not None and (summary is None or record_digest(summary, seal_version(p))
                                                       != p.telemetry_digest):
                    if held_summaries is None:  # an earlier sync may have recorded it
                        held_summaries = list(self.history.telemetry(run_id).values())
                    summary = next((s for s in held_summaries if s.module == m), None)
                held = (kept_rows(rows, run_id, m) if rows is not None and m in writes.rows
                        else self.history.rows(run_id, m, source=None))
                gap = record_gap(p, held, summary)
                if gap is None:
                    if is_sealed(p):
                        writes.acks.append(p)
                else:
                    if events is None:
                        events = self.history.events(run_id)
                    p = self._collecting(run_id, m, p, gap, held, now, writes, _collecting_since(events, m))
            # an unchanged module costs no write (a pass writes what changed, not N rows)
            if p != cur:
                writes.put(p, force=t.force)
            elif cur is not None and m not in raw_rows and live.get(m) is p:
                # nothing to write, the rows in step: the next pass skips it unless it changes
                settled[m] = (p, cur)
            known[m] = p

    def _collecting(self, run_id: str, module: str, p: RunProgress, gap: str, held: Sequence[ResultRow],
                    now: float, writes: PassWrites, since: float | None) -> RunProgress:
        """The module's final state ``p`` lacks ``gap`` in the history: the module collecting (bounded)."""
        if since is None:
            writes.events.append((module, f"collecting: the module reported {p.state.value}, but {gap}; "
                                          "waiting for the module to send the rest"))
            log.warning("run %s on %s: collecting, %s", run_id, module, gap)
        collecting = collecting_progress(p, gap, sum(r.source == "release" for r in held))
        return self._collect_bound(run_id, module, collecting, now, writes, since) or collecting

    def _collect_bound(self, run_id: str, module: str, cur: RunProgress, now: float, writes: PassWrites,
                       since: float | None) -> RunProgress | None:
        """A module collecting for longer than ``COLLECT_TIMEOUT``: its part ends failed, with what is missing."""
        if since is None or now - since <= self.collect_timeout:
            return None
        gap = cur.error.message if cur.error else "its final record is incomplete"
        p = cur.model_copy(update={"state": RunState.FAILED, "updated_at": max(now, cur.updated_at),
                                   "finished_at": now, "error": StepError(
                                       step="collect", message=f"{gap} (waited {now - since:.0f} s, bound "
                                                               f"{self.collect_timeout:.0f} s)")})
        writes.put(p, force=True)
        writes.events.append((module, f"failed: {gap} within {self.collect_timeout:.0f} s"))
        log.warning("run %s on %s: failed, %s", run_id, module, gap)
        if is_sealed(cur):
            # given up: the module stops sending it (its rows stay on the module)
            writes.acks.append(cur)
        return p

    def _record_lost(self, run_id: str, module: str, release: str, cur: RunProgress | None, why: str,
                     keys: int, now: float, writes: PassWrites) -> RunProgress:
        """The controller gives a module's part up: LOST, with the reason (``started_at`` keeps when)."""
        base = cur or RunProgress(run_id=run_id, module=module, release=release, keys_total=keys)
        p = base.model_copy(update={"state": RunState.LOST, "updated_at": now, "finished_at": now,
                                    "error": StepError(step=base.step or "dispatch", message=why)})
        writes.put(p, force=True)
        writes.events.append((module, f"marked lost: {why}"))
        log.warning("run %s on %s: %s", run_id, module, why)
        return p

    def _record_foreign(self, run_id: str, module: str, release: str, found: RunProgress, keys: int,
                        now: float, writes: PassWrites) -> RunProgress:
        """The module's record of ``run_id`` on the broker is of another release: its part failed, nothing taken."""
        why = (f"the broker's record of run {run_id} on {module} is of release {found.release} "
               f"({found.state.value}), not {release}: not taken as this run's result "
               "(another controller used this run id)")
        p = failed_progress(run_id, module, release, "sync", why, keys, now)
        writes.put(p, force=True)
        writes.events.append((module, why))
        log.warning("run %s on %s: %s", run_id, module, why)
        return p

    def _write(self, run_id: str, writes: PassWrites) -> None:
        """What the pass took: cancels of the modules given up first (a later delivery must not run them), then
        the history in one transaction, then the acknowledgements of the final states it holds whole."""
        for m, why in writes.cancels:
            self.kv.cancel(run_id, m, reason=why, lost=True)
        if writes.rows or writes.telemetry or writes.progress or writes.forced or writes.events:
            self.history.record_sync(run_id, rows=writes.rows, telemetry=writes.telemetry,
                                     progress=writes.progress.values(), forced=writes.forced.values(),
                                     events=writes.events)
        if writes.acks:
            self.kv.put_acks(writes.acks)

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


@functools.cache
def _rows_adapter() -> TypeAdapter[list[ResultRow]]:
    return TypeAdapter(list[ResultRow])


def parse_rows_json(raw: bytes | str | None, run_id: str, module: str) -> list[ResultRow] | None:
    """:func:`contract.kv.parse_rows` of the stored text itself (pydantic's own JSON parser, no ``json.loads``)."""
    from contract.kv import _load, parse_rows

    if raw is None:
        return None
    try:
        return _rows_adapter().validate_json(raw)
    except ValidationError:
        # not a list of rows: as parse_rows reads it (None when it is not a list)
        return parse_rows(_load(raw), run_id, module)


def _collecting_since(events: Sequence[tuple[str, float, str]], module: str) -> float | None:
    return next((ts for m, ts, msg in events if m == module and msg.startswith("collecting:")), None)
