"""Small key-value records on the fleet's result backend (Redis, or files when embedded).

The one place where agents and the controller exchange state besides the task itself:
heartbeats, live progress, the rows produced so far, each run's device telemetry
summary, the durable cancel flag, the controller's acknowledgement of a run's final state, and users'
reservations of modules (written and read by controllers only). It
goes through Celery's own result backend (``backend.get/set/delete``), so the embedded
and the Redis deployments take the same code path. Values are JSON; a value that cannot
be read (a concurrent writer on the file backend) reads as absent and is read again on
the next poll.

How old a heartbeat (or a name-conflict record) is, is read from the broker, never from the clock
of the agent that wrote it (edge modules often run without NTP): on Redis from what is left of the
key's expiry (``PTTL``: the broker's own clock counts it down from the fixed expiry the writer set),
on the embedded broker from the file's mtime (set by the kernel of the host that holds the folder,
the controller's own). :class:`Beat` carries that time and the writer's measured clock skew.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from celery import Celery
from celery.backends.filesystem import FilesystemBackend
from pydantic import ValidationError

from contract.records import Heartbeat, ResultRow, RunProgress, TelemetrySummary

log = logging.getLogger(__name__)

PREFIX = "m1000-fleet"


# Cancel flags: the module sits in a fixed place, so that a Redis ACL glob gives a module its own
# flags (``cancel:<module>:*``) and the run-wide ones (``cancel-run:*``) and nobody else's. The
# layout before (``cancel:<run>`` and ``cancel:<run>:<module>``) is not read any more.
CANCEL = "cancel"  # cancel:<module>:<run>: one module's part of a run
RUN_CANCEL = "cancel-run"  # cancel-run:<run>: the whole run

# A preemption (m1000-fleet:preempt:<module>:<run>): the controller asks the module to stop its part of the run
# at once, as for a clean shutdown, for an urgent run; the module re-queues it (to resume from its passed keys) and
# honours each preemption once (the value names the urgent run). Read-only for the module, as its cancel flags.
PREEMPT = "preempt"
# a preemption the module never saw (it was between keys and ended) is gone within the hour
PREEMPT_TTL = 3600

# Fixed expiries of the records whose age the reader takes from the broker (what is left of them): the
# writer and the reader must agree on them, so they are not settings. A heartbeat key outlives any
# ``lost_after``; a name-conflict record is shown for five minutes (the refused agent exited at once).
HEARTBEAT_TTL = 7 * 86400
CONFLICT_TTL = 300


# The controller's acknowledgement of a module's final state (m1000-fleet:ack:<module>:<run>): written once its
# history holds every row the state's seal names (and the telemetry summary it refers to); the module, which may
# only read it (the module in a fixed place, as for its cancel flags), keeps re-sending that state until then.
ACK = "ack"

# A user's reservation of a module (m1000-fleet:reserve:<module>): written by controllers, read-only for its module
# (which holds other users' work queued there until it ends: agent.hold). On Redis the key expires with the
# reservation, so one made by a controller that is gone still ends; the embedded broker keeps the file, and its
# readers drop a record whose ``until`` has passed (:mod:`controller.fleet.reservations`, :func:`held_for_other`).
RESERVE = "reserve"


def _key(*parts: str) -> str:
    return ":".join((PREFIX, *parts))


def ack_key(run_id: str, module: str) -> str:
    """Key of the controller's acknowledgement of ``module``'s final state of ``run_id``."""
    return _key(ACK, module, run_id)


def preempt_key(run_id: str, module: str) -> str:
    """Key of the request that ``module`` stop its part of ``run_id`` for an urgent run (:data:`PREEMPT`)."""
    return _key(PREEMPT, module, run_id)


def reservation_key(module: str) -> str:
    """Key of ``module``'s reservation (one record per module)."""
    return _key(RESERVE, module)


def cancel_key(run_id: str, module: str | None = None) -> str:
    """Key of the cancel flag of ``module``'s part of ``run_id``, or of the whole run (``module`` None)."""
    return _key(CANCEL, module, run_id) if module else _key(RUN_CANCEL, run_id)


class Beat(NamedTuple):
    """A heartbeat as read from the broker.

    ``at``: when the broker took it, on the reader's clock (Redis: the read's time less the key's age by
    its expiry; embedded: the file's mtime). ``measured`` False: the backend could not tell (a key without
    the fixed expiry, an unknown backend) and ``at`` is the agent's own ``ts``.
    """

    hb: Heartbeat
    at: float
    measured: bool = True

    @property
    def skew(self) -> float | None:
        """The agent's clock minus the reader's, s (None: not measured)."""
        return self.hb.ts - self.at if self.measured else None


class KV:
    def __init__(self, app: Celery) -> None:
        self.backend = app.backend

    # -- raw ------------------------------------------------------------------------------
    def put(self, key: str, value: Any, *, ex: int | None = None) -> None:
        """``ex``: this key's expiry on Redis, s (default: the backend's ``result_expires``)."""
        data = _dump(value)
        if isinstance(self.backend, FilesystemBackend):
            # the file backend writes in place; readers must never see half a value
            path = os.fsdecode(self.backend._filename(key.encode()))
            tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(data)
            os.replace(tmp, path)
            return
        # loaded already when the backend is Redis (Sentinel too), not embedded
        from celery.backends.redis import RedisBackend

        if isinstance(self.backend, RedisBackend):
            # one SET with its expiry: Celery's set is MULTI, SETEX, PUBLISH, EXEC, and nobody subscribes to
            # these keys (an idle agent's beat: 2 commands instead of 8). redis-py retries a lost connection
            # once; what must arrive is re-sent by its writer.
            self.backend.client.set(key, data, ex=ex or self._expiry())
            return
        # fail fast (Celery's default retries a write for many seconds): what must arrive is re-sent by its writer
        self.backend.set(key.encode(), data, max_retries=1, interval_start=0.2, interval_step=0.5, interval_max=0.5)

    def put_many(self, items: dict[str, Any], expiry: Mapping[str, int] | None = None) -> None:
        """Several values, on Redis in one round trip (a pipeline, not a transaction: each SET as :meth:`put`'s);
        ``expiry``: key -> its own expiry, s (the others: the backend's)."""
        own = expiry or {}
        if isinstance(self.backend, FilesystemBackend) or not _is_redis(self.backend):
            for key, value in items.items():
                self.put(key, value, ex=own.get(key))
            return
        ex = self._expiry()
        pipe = self.backend.client.pipeline(transaction=False)
        for key, value in items.items():
            pipe.set(key, _dump(value), ex=own.get(key) or ex)
        pipe.execute()

    def get(self, key: str) -> Any:
        return _load(self.backend.get(key.encode()))

    def get_many(self, keys: Sequence[str]) -> list[Any]:
        out: list[Any] = []
        for raw in self.backend.mget([k.encode() for k in keys]):
            try:
                out.append(json.loads(raw) if raw is not None else None)
            except (ValueError, UnicodeDecodeError):
                out.append(None)
        return out

    def get_raw(self, keys: Sequence[str]) -> list[bytes | str | None]:
        """The stored values of ``keys`` unparsed, in one round trip (MGET): a reader that parses only what
        changed since it last read compares these."""
        return list(self.backend.mget([k.encode() for k in keys])) if keys else []

    def taken_at(self, keys: Sequence[str], ttl: int) -> list[float | None]:
        """When the broker took each of ``keys`` (written with expiry ``ttl``), on this reader's clock, in one
        round trip; None where the backend cannot tell (:meth:`get_aged`)."""
        if not keys:
            return []
        if isinstance(self.backend, FilesystemBackend):
            return [self._file_aged(k)[1] for k in keys]
        if not _is_redis(self.backend):
            return [None] * len(keys)
        pipe = self.backend.client.pipeline(transaction=False)
        for k in keys:
            pipe.pttl(k)
        left = pipe.execute()
        now = time.time()
        return [_taken_at(ms, ttl, now) for ms in left]

    def get_aged(self, keys: Sequence[str], ttl: int) -> list[tuple[Any, float | None]]:
        """(value, when the broker took it on this reader's clock) per key, for keys written with expiry ``ttl``.

        Redis: one round trip (MGET and a PTTL per key); the age is ``ttl`` less what is left. Embedded: each
        file's content and mtime. The time is None where the backend cannot tell (no such expiry left: a
        writer that set another; a backend of another kind)."""
        if not keys:
            return []
        if isinstance(self.backend, FilesystemBackend):
            return [self._file_aged(k) for k in keys]
        now = time.time()
        out: list[tuple[Any, float | None]] = []
        for value, rest in self.get_expiring(keys):
            at = now - (ttl - rest) if rest is not None and rest <= ttl + 1.0 else None
            out.append((value, at))
        return out

    def get_expiring(self, keys: Sequence[str]) -> list[tuple[Any, float | None]]:
        """(value, seconds it has left before the broker expires it) per key: the broker's clock, not this
        reader's. Redis: one round trip (MGET and a PTTL per key); None where the key has no expiry or the backend
        keeps none (the embedded broker: one machine, one clock)."""
        if not keys:
            return []
        if not _is_redis(self.backend):
            return [(v, None) for v in self.get_many(keys)]
        pipe = self.backend.client.pipeline(transaction=False)
        pipe.mget(keys)
        for k in keys:
            pipe.pttl(k)
        raw, *left = pipe.execute()
        return [(_load(value), int(ms) / 1000.0 if isinstance(ms, int) and ms >= 0 else None)
                for value, ms in zip(raw, left, strict=True)]

    def broker_offset(self) -> float | None:
        """The broker's clock less this machine's, s (Redis ``TIME``; None on the embedded broker: one clock)."""
        if not _is_redis(self.backend):
            return None
        t0 = time.time()
        sec, usec = self.backend.client.time()
        return float(sec) + float(usec) / 1e6 - (t0 + time.time()) / 2

    def _file_aged(self, key: str) -> tuple[Any, float | None]:
        path = os.fsdecode(self.backend._filename(key.encode()))
        try:
            # the content and the mtime of one file (put replaces it whole)
            with open(path, "rb") as fh:
                return _load(fh.read()), os.fstat(fh.fileno()).st_mtime
        except FileNotFoundError:
            return None, None

    def delete(self, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.backend.delete(key.encode())

    # -- heartbeats -----------------------------------------------------------------------
    def put_heartbeat(self, hb: Heartbeat, lease: dict[str, Any] | None = None) -> None:
        """The heartbeat; with ``lease``, the module's name lease too (:meth:`put_lease`), in the same round trip."""
        key = _key("hb", hb.module)
        items: dict[str, Any] = {key: hb.model_dump(mode="json")}
        if lease is not None:
            items[_key("lease", hb.module)] = lease
        self.put_many(items, {key: HEARTBEAT_TTL})  # the fixed expiry: its reader takes the beat's age from it

    def heartbeats(self, modules: Iterable[str]) -> dict[str, Heartbeat | None]:
        names = list(modules)
        values = self.get_many([_key("hb", m) for m in names]) if names else []
        return {m: _model(Heartbeat, v) for m, v in zip(names, values, strict=True)}

    def beats(self, modules: Iterable[str]) -> dict[str, Beat | None]:
        """The heartbeats of ``modules``, each with when the broker took it (:class:`Beat`)."""
        names = list(modules)
        out: dict[str, Beat | None] = {}
        for m, (value, at) in zip(names, self.get_aged([_key("hb", m) for m in names], HEARTBEAT_TTL), strict=True):
            out[m] = make_beat(_model(Heartbeat, value), at)
        return out

    # -- progress and rows -------------------------------------------------------------------
    def put_progress(self, p: RunProgress) -> None:
        """The progress; a device telemetry summary it carries (the run's last ones do) goes first under
        its own key, and never inside the progress value: progress stays small, and a controller that
        does not know the field still reads it."""
        if p.telemetry is not None:
            try:
                self.put_telemetry(p.telemetry)
            except Exception as exc:  # the run's state matters more than its device figures
                log.warning("cannot publish the device telemetry of %s: %s", p.run_id, exc)
        self.put(_key("progress", p.run_id, p.module), p.model_dump(mode="json", exclude={"telemetry"}))

    def progress(self, run_id: str, modules: Iterable[str]) -> dict[str, RunProgress | None]:
        return {m: p for (_, m), p in self.progress_of((run_id, m) for m in modules).items()}

    def progress_of(self, pairs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], RunProgress | None]:
        """The progress of (run, module) pairs of any runs, in one round trip (MGET)."""
        keys = list(dict.fromkeys(pairs))
        values = self.get_many([_key("progress", run_id, m) for run_id, m in keys]) if keys else []
        return {k: _model(RunProgress, v) for k, v in zip(keys, values, strict=True)}

    def _expiry(self) -> int | None:
        """Seconds a value written straight to Redis keeps (the backend's ``result_expires``; None: for ever)."""
        return int(self.backend.expires) if self.backend.expires else None

    def put_rows(self, run_id: str, module: str, rows: Sequence[ResultRow]) -> None:
        self.put(_key("rows", run_id, module), [r.model_dump(mode="json") for r in rows])

    def put_final(self, p: RunProgress, rows: Sequence[ResultRow], replicas: int = 0, timeout: float = 2.0) -> int:
        """A run's last state: its rows, then its progress. With ``replicas`` > 0 on Redis (Sentinel: the
        replication is asynchronous), both writes and a ``WAIT replicas timeout`` go on one connection and
        the answer is how many replicas hold them; otherwise ``replicas`` (nothing to wait for)."""
        if replicas <= 0 or isinstance(self.backend, FilesystemBackend) or not _is_redis(self.backend):
            self.put_rows(p.run_id, p.module, rows)
            self.put_progress(p)
            return replicas
        if p.telemetry is not None:
            try:
                self.put_telemetry(p.telemetry)
            except Exception as exc:
                log.warning("cannot publish the device telemetry of %s: %s", p.run_id, exc)
        ex = self._expiry()
        pipe = self.backend.client.pipeline(transaction=False)  # one connection: WAIT counts its writes
        pipe.set(_key("rows", p.run_id, p.module), _dump([r.model_dump(mode="json") for r in rows]), ex=ex)
        pipe.set(_key("progress", p.run_id, p.module), _dump(p.model_dump(mode="json", exclude={"telemetry"})), ex=ex)
        pipe.execute_command("WAIT", replicas, max(1, int(timeout * 1000)))
        return int(pipe.execute()[-1])

    def rows(self, run_id: str, module: str) -> list[ResultRow] | None:
        return parse_rows(self.get(_key("rows", run_id, module)), run_id, module)

    # -- device telemetry (agent.telemetry) --------------------------------------------------------
    def put_telemetry(self, summary: TelemetrySummary) -> None:
        self.put(_key("telemetry", summary.run_id, summary.module), summary.model_dump(mode="json"))

    def telemetry(self, run_id: str, module: str) -> TelemetrySummary | None:
        """The run's device telemetry summary of ``module`` (None: not (yet) published, or unreadable)."""
        value: TelemetrySummary | None = _model(TelemetrySummary, self.get(_key("telemetry", run_id, module)))
        return value

    # -- acknowledged final states -----------------------------------------------------------
    def put_ack(self, p: RunProgress) -> None:
        """The controller holds ``p`` (a sealed final state) completely: the module may drop it."""
        self.put_acks([p])

    def put_acks(self, ps: Sequence[RunProgress]) -> None:
        """:meth:`put_ack` of each, in one round trip."""
        self.put_many({ack_key(p.run_id, p.module): {"digest": p.rows_digest, "updated_at": p.updated_at,
                                                     "ts": time.time()} for p in ps})

    def acked(self, p: RunProgress) -> bool:
        """Whether the controller acknowledged this very final state (its rows' digest and its time)."""
        v = self.get(ack_key(p.run_id, p.module))
        return isinstance(v, dict) and v.get("digest") == p.rows_digest and v.get("updated_at") == p.updated_at

    # -- cancel ---------------------------------------------------------------------------
    def cancel(self, run_id: str, module: str | None = None, reason: str = "cancelled", *,
               lost: bool = False) -> None:
        """A durable cancel flag; ``lost``: the controller gave this module's part up (the agent fails it)."""
        self.put(cancel_key(run_id, module), {"ts": time.time(), "reason": reason, "lost": lost})

    def preempt(self, run_id: str, module: str, by: str) -> None:
        """Ask ``module`` to stop its part of ``run_id`` for the urgent run ``by`` (it resumes after)."""
        self.put(preempt_key(run_id, module), {"ts": time.time(), "by": by}, ex=PREEMPT_TTL)

    def preempted_by(self, run_id: str, module: str) -> str | None:
        """The urgent run a preemption of ``module``'s part of ``run_id`` is for, if any."""
        return _preempted_by(self.get(preempt_key(run_id, module)))

    def cancel_flag(self, run_id: str, module: str) -> CancelFlag | None:
        """The cancel flag of the run (or of this module's part of it), if any."""
        return _cancel_flag(self.get_many([cancel_key(run_id), cancel_key(run_id, module)]))

    def stop_flags(self, run_id: str, module: str) -> tuple[CancelFlag | None, str | None]:
        """:meth:`cancel_flag` and :meth:`preempted_by` in one read (what a running run asks every second)."""
        *cancels, pre = self.get_many([cancel_key(run_id), cancel_key(run_id, module), preempt_key(run_id, module)])
        return _cancel_flag(cancels), _preempted_by(pre)

    def cancelled(self, run_id: str, module: str) -> str | None:
        """The reason, when the run (or this module's part of it) was cancelled."""
        flag = self.cancel_flag(run_id, module)
        return flag.reason if flag else None

    # -- one live agent per module name ------------------------------------------------------
    def put_lease(self, module: str, lease: dict[str, Any]) -> None:
        self.put(_key("lease", module), lease)

    def lease(self, module: str) -> dict[str, Any] | None:
        v = self.get(_key("lease", module))
        return v if isinstance(v, dict) else None

    def drop_lease(self, module: str) -> None:
        self.delete(_key("lease", module))

    def put_conflict(self, module: str, record: dict[str, Any]) -> None:
        """A second agent refused the name (it exits at once): on Redis the record expires after ``CONFLICT_TTL``."""
        self.put(_key("conflict", module), record, ex=CONFLICT_TTL)

    def conflicts(self, modules: Iterable[str]) -> dict[str, tuple[dict[str, Any], float | None]]:
        """module -> (its latest name-conflict record, when the broker took it on this reader's clock)."""
        names = list(modules)
        values = [_load(raw) for raw in self.get_raw([_key("conflict", m) for m in names])]
        found = [(m, v) for m, v in zip(names, values, strict=True) if isinstance(v, dict)]
        ats = self.taken_at([_key("conflict", m) for m, _ in found], CONFLICT_TTL)  # a conflict is rare: no PTTL each
        return {m: (v, at) for (m, v), at in zip(found, ats, strict=True)}


    # -- reservations (controllers only) --------------------------------------------------------
    def put_reservation(self, module: str, record: dict[str, Any], ttl: float) -> None:
        """``module``'s reservation, kept ``ttl`` seconds on Redis (its remaining time, rounded up)."""
        self.put(reservation_key(module), record, ex=max(1, math.ceil(ttl)))

    def reservations(self, modules: Iterable[str]) -> dict[str, dict[str, Any]]:
        """module -> its reservation record, for those of ``modules`` that have one (one MGET); a record past its
        ``until`` on the embedded broker is still here: the reader judges it."""
        names = list(modules)
        got = self.get_expiring([reservation_key(m) for m in names])
        now = time.time()
        return {m: on_broker_clock(v, left, now) for m, (v, left) in zip(names, got, strict=True)
                if isinstance(v, dict)}

    def drop_reservation(self, module: str) -> None:
        self.delete(reservation_key(module))

    def reservation_and_cancel(self, run_id: str, module: str) -> tuple[Any, CancelFlag | None]:
        """``module``'s reservation record (raw) and the cancel flag of its part of ``run_id``, in one read (what
        a run's delivery asks before it starts: :mod:`agent.hold`)."""
        (res, left), *cancels = self.get_expiring([reservation_key(module), cancel_key(run_id),
                                                   cancel_key(run_id, module)])
        return on_broker_clock(res, left, time.time()), _cancel_flag([v for v, _ in cancels])


def on_broker_clock(record: Any, left: float | None, now: float) -> Any:
    """A reservation record whose ``until`` is moved onto the reader's clock from the time its key has left on the
    broker (``left``; the writer set the key's expiry to the reservation's length): a writer's clock an hour behind
    neither shortens nor lengthens it (issue 48). Unchanged where the broker keeps no expiry (embedded: one clock)."""
    if not isinstance(record, dict) or left is None:
        return record
    return {**record, "until": now + left}


def held_for_other(value: Any, user: str, now: float) -> tuple[str, float] | None:
    """(who, until) when the reservation record ``value`` is in force at ``now`` and held by a user other than
    ``user``; None otherwise (no record, an unreadable one, one past its ``until``, or ``user``'s own)."""
    if not isinstance(value, dict):
        return None
    try:
        who, until = str(value["user"]), float(value["until"])
    except (KeyError, TypeError, ValueError):
        return None
    return (who, until) if until > now and who != user else None


def parse_rows(raw: Any, run_id: str, module: str) -> list[ResultRow] | None:
    """A module's rows of a run as read (JSON loaded); None when there are none or they cannot be read."""
    if not isinstance(raw, list):
        return None
    try:
        return [ResultRow.model_validate(r) for r in raw]
    except ValidationError:
        log.warning("unreadable rows for %s on %s", run_id, module)
        return None


def make_beat(hb: Heartbeat | None, at: float | None) -> Beat | None:
    """The :class:`Beat` of ``hb`` taken by the broker ``at`` (None: not measured, the agent's ``ts`` stands in)."""
    return None if hb is None else Beat(hb, at, True) if at is not None else Beat(hb, hb.ts, False)


def _taken_at(ms: Any, ttl: int, now: float) -> float | None:
    """When a key written with expiry ``ttl`` was written, from its PTTL ``ms`` read at ``now`` (None: another)."""
    rest = int(ms) / 1000.0 if isinstance(ms, int) else -1.0
    return now - (ttl - rest) if 0.0 <= rest <= ttl + 1.0 else None


class CancelFlag(NamedTuple):
    reason: str
    lost: bool = False


def _is_redis(backend: Any) -> bool:
    # loaded already when the backend is Redis (Sentinel too), not embedded
    from celery.backends.redis import RedisBackend

    return isinstance(backend, RedisBackend)


def _load(raw: Any) -> Any:
    if raw is None:
        return None
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return None


def _dump(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def _model(cls: Any, value: Any) -> Any:
    if value is None:
        return None
    try:
        return cls.model_validate(value)
    except ValidationError:
        return None


def _preempted_by(value: Any) -> str | None:
    """The urgent run a preemption record names (:meth:`KV.preempt`), or None."""
    by = value.get("by") if isinstance(value, dict) else None
    return by if isinstance(by, str) else None


def _cancel_flag(values: Sequence[Any]) -> CancelFlag | None:
    for v in values:
        if isinstance(v, dict):
            return CancelFlag(str(v.get("reason", "cancelled")), bool(v.get("lost", False)))
    return None
