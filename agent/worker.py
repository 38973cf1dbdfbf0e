"""``fleet-agent worker``: the module's Celery worker, its heartbeat, and the run task.

One worker per module consumes its own queue (``module.<name>``) with concurrency 1 and
prefetch 1: a module never benchmarks two things at once. A run is de-duplicated by the
module's own record of it: a redelivered run that already finished here is answered
from that record and never benchmarked twice, and only a delivery of the same request (run id,
release, model keys and settings: :func:`contract.records.request_identity`) is: another request
under a run id used here is refused, the record left as it is; a run delivered more often than the
request allows (the worker died under it again and again) is failed, not retried.

The worker is one process (Celery's solo pool): the run executes in its main thread, next to
the heartbeat and /metrics threads. A run's hard time limit is the kernel's (:func:`hard_limit`):
at the limit ``SIGALRM``, at its default action, ends the worker wherever the run hangs, and the
agent that starts again (systemd restarts it) stops what the run left and ends the run as failed
(:func:`recover`). A run whose process dies (the limit, the OOM killer, a signal) takes the
worker with it; the restart recovers it the same way (re-queued to resume from its passed keys,
or ended when its limit or its deliveries are spent).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from celery import Celery

from agent import malloc, procs
from agent.errors import BadInput, EvictingBroker
from agent.settings import AgentSettings
from agent.store import RunStore, check_run_id
from agent.validate import RefusedRequest, refused_progress, validate_request
from contract.celery_app import NOOP_TASK, RUN_TASK, make_app, queue_name
from contract.digest import seal
from contract.eviction import broker_eviction_problem
from contract.files import write_atomic
from contract.kv import KV, KVCancelToken
from contract.oneline import error_line
from contract.records import (
    Heartbeat,
    ResultRow,
    RunProgress,
    RunRequest,
    RunState,
    StepError,
    is_run_id,
    release_label,
    request_difference,
)
from contract.version import agent_version

log = logging.getLogger("fleet.agent")

# Every process the agent starts inherits MARK (value: the work folder), so a restarted agent can find and stop
# what a killed one left running (servers live in sessions of their own and survive their parent); a process that
# clears its environment is found by its run's cgroup (agent.procs).
MARK = procs.MARK


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


# --------------------------------------------------------------------------- heartbeat
def current_activity(workdir: Path) -> tuple[str | None, str | None]:
    """(run id, step) of the run in progress on this module, from its own files."""
    state = _read_json(workdir / "state.json")
    run_id = state.get("current_run") if isinstance(state, dict) else None
    if not run_id:
        return None, None
    prog = _read_json(workdir / "runs" / str(run_id) / "progress.json")
    step = prog.get("step") if isinstance(prog, dict) else None
    if isinstance(prog, dict) and prog.get("state") in ("done", "failed", "cancelled"):
        return None, None
    return str(run_id), (str(step) if step else None)


def make_heartbeat(settings: AgentSettings, version: str) -> Heartbeat:
    workdir = settings.workdir.expanduser()
    run_id, step = current_activity(workdir)
    free: int | None
    detail = ""
    try:
        free = shutil.disk_usage(workdir).free
    except OSError as exc:
        free, detail = None, f"work folder unusable: {exc.strerror}"
    healthy = free is not None and free >= settings.min_free_disk
    if free is not None and not healthy:
        detail = f"free disk {free / 1024**3:.2f} GiB < {settings.min_free_disk / 1024**3:.2f} GiB"
    return Heartbeat(module=settings.module, agent_version=version, ts=time.time(), run_id=run_id, step=step,
                     free_disk_bytes=free, healthy=healthy, detail=detail)


class HeartbeatThread(threading.Thread):
    """Publishes a heartbeat every ``heartbeat_interval``; a broker outage is logged, never fatal."""

    def __init__(self, app: Celery, settings: AgentSettings, lease: dict[str, Any] | None = None) -> None:
        super().__init__(name="fleet-heartbeat", daemon=True)
        self.kv = KV(app)
        self.settings = settings
        self.lease = lease
        self.version = agent_version()
        self.stopped = threading.Event()
        self.failures = 0

    def beat(self) -> Heartbeat:
        workdir = self.settings.workdir.expanduser()
        hb = make_heartbeat(self.settings, self.version)
        with contextlib.suppress(OSError):  # a full disk must not stop the heartbeat
            write_atomic(workdir / "heartbeat.json", hb.model_dump_json())
        self.kv.put_heartbeat(hb, None if self.lease is None else {**self.lease, "ts": hb.ts})  # one round trip
        s = self.settings
        flush_outbox(self.kv, workdir, s.replicas_to_wait(), s.final_state_wait)
        resend_unacked(self.kv, workdir, interval=s.final_resend_interval, keep_for=s.result_expires,
                       replicas=s.replicas_to_wait(), wait_s=s.final_state_wait)
        return hb

    def run(self) -> None:
        while not self.stopped.is_set():
            try:
                self.beat()
                if self.failures:
                    log.info("heartbeat: broker reachable again")
                self.failures = 0
            except Exception as exc:
                self.failures += 1
                if self.failures in (1, 10) or self.failures % 100 == 0:
                    log.warning("heartbeat failed (%d in a row): %s", self.failures, exc)
            self.stopped.wait(self.settings.heartbeat_interval)

    def stop(self) -> None:
        self.stopped.set()


def reap_orphans(workdir: Path, grace: float = 5.0) -> list[int]:
    """Kill processes of earlier runs on this work folder; returns their pids.

    Those in the runs' cgroups (:mod:`agent.procs`: any process, whatever its session or environment), then
    those carrying ``MARK`` (the work folder) in sessions of their own (the release's servers, the benchmark's
    processes), while the worker runs in its own: any marked process outside the worker's session is left over
    from a run that is no longer running (one run at a time).
    """
    import psutil

    killed = [x.pid for x in procs.sweep_leftover_cgroups(workdir, grace)]
    mark, me, session = str(workdir), os.getpid(), os.getsid(0)
    for p in psutil.process_iter():
        if p.pid == me:
            continue
        try:
            if p.environ().get(MARK) == mark and os.getsid(p.pid) != session:
                p.kill()
                killed.append(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return killed


# --------------------------------------------------------------------------- one agent per module name
class NameInUse(RuntimeError):
    """Another live agent holds this module's name on the broker."""


def lease_record(settings: AgentSettings) -> dict[str, Any]:
    import psutil

    return {"host": socket.gethostname(), "pid": os.getpid(), "created": psutil.Process().create_time(),
            "workdir": str(settings.workdir.expanduser()), "ts": time.time()}


def _holder_alive(held: dict[str, Any], mine: dict[str, Any], stale_after: float) -> bool:
    """Whether the agent that wrote ``held`` may still be running (same host: ask the process table)."""
    import psutil

    if held.get("host") == mine["host"]:
        try:
            return abs(psutil.Process(int(held.get("pid", 0))).create_time() - float(held.get("created", 0))) < 1e-3
        except (psutil.Error, ValueError, TypeError):
            return False
    return time.time() - float(held.get("ts", 0) or 0) < stale_after


def _same_agent(a: dict[str, Any] | None, b: dict[str, Any]) -> bool:
    return a is not None and all(a.get(k) == b[k] for k in ("host", "pid", "created"))


def claim_name(kv: KV, settings: AgentSettings) -> dict[str, Any]:
    """Take the module's name lease, or raise :class:`NameInUse` (and record the conflict for the controller)."""
    mine = lease_record(settings)
    for _ in range(2):  # claim, then read back: of two agents starting at once, one sees the other
        held = kv.lease(settings.module)
        same = _same_agent(held, mine)
        if held is not None and not same and _holder_alive(held, mine, settings.offline_after):
            kv.put_conflict(settings.module, {**mine, "held_by": {k: held.get(k) for k in ("host", "pid", "workdir")}})
            raise NameInUse(f"module name {settings.module!r} is held by a live agent on {held.get('host')} "
                            f"(pid {held.get('pid')}, {held.get('workdir')}); not starting a second one")
        if not same:
            kv.put_lease(settings.module, mine)
        time.sleep(min(0.3, settings.heartbeat_interval))
    return mine


# --------------------------------------------------------------------------- the run task
def _bump_attempts(run_dir: Path, by: int = 1) -> int:
    """Count deliveries that did not end cleanly (a clean interrupt gives its attempt back: ``by=-1``)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "attempts"
    try:
        n = int(path.read_text().strip() or 0)
    except (OSError, ValueError):
        n = 0
    n = max(0, n + by)
    write_atomic(path, f"{n}\n")
    return n


def _write_deadline(run_dir: Path, deadline: float) -> None:
    """This delivery's hard deadline (epoch seconds), for the agent that recovers the run if the kernel's
    alarm (:func:`hard_limit`) ended the worker at it."""
    try:
        write_atomic(run_dir / "deadline", f"{deadline:.3f}\n")
    except OSError as exc:  # a full disk: the run goes on; a recovery then re-queues it, as before
        log.warning("cannot record the hard deadline of %s: %s", run_dir.name, exc)


def _read_deadline(run_dir: Path) -> float | None:
    value = _read_json(run_dir / "deadline")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@contextlib.contextmanager
def hard_limit(seconds: float) -> Iterator[None]:
    """The run's hard time limit, kept by the kernel: ``ITIMER_REAL`` delivers ``SIGALRM`` after
    ``seconds`` of wall time, and its default action ends the process.

    It needs no Python code to run: it ends a run hung in a blocking call, in a loop holding the GIL,
    or stopped (``SIGSTOP``: the signal waits and ends the process when it is continued). The worker
    sets ``SIGALRM``'s default action at its start (:func:`run_worker`); the run itself is meant to stop at
    its soft limit, well before (see ``_execute``).
    """
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def _stored_rows(workdir: Path, run_id: str) -> list[ResultRow]:
    """The run's rows on this module, one per identity, the latest kept (a torn last line is skipped)."""
    try:
        return RunStore(workdir).rows(run_id)
    except (OSError, ValueError) as exc:
        log.warning("cannot read the rows of %s: %s", run_id, exc)
        return []


class Publisher:
    """Publishes one run's progress and rows; its end goes out once, through :meth:`final` and the outbox.

    The outbox (``<workdir>/outbox/<run id>.json``) holds the last state the controller must see. It is
    written before the state is sent and leaves the outbox once the backend took it (with ``replicas``: once
    that many Redis replicas acknowledged it too, so that a Sentinel failover cannot drop it); the heartbeat
    thread of the worker's main process sends what is left there (:func:`flush_outbox`), also after an
    agent restart. A terminal state is sealed as it is sent (:func:`contract.digest.seal`: the count and
    digest of every row the module keeps for the run, the digest of its telemetry summary) and then waits in
    ``<workdir>/unacked/`` until the controller acknowledges that its history holds all of it: the
    heartbeat sends it again, rows and telemetry first, until then (:func:`resend_unacked`), so a broker that
    drops keys (an evicting Redis) loses nothing the module measured.
    """

    def __init__(self, kv: KV, workdir: Path, run_id: str, module: str, *, replicas: int = 0,
                 wait_s: float = 2.0) -> None:
        self.kv, self.workdir, self.run_id, self.module = kv, workdir, run_id, module
        self.replicas, self.wait_s = replicas, wait_s

    def progress(self, p: RunProgress) -> bool:
        """A state of the run on its way (never its end: a terminal state goes out through :meth:`final`)."""
        if p.state.terminal:
            raise ValueError(f"the {p.state.value} state of {p.run_id} is published once, through Publisher.final")
        try:
            self.kv.put_progress(p)
            return True
        except Exception as exc:  # the run goes on; the final state is published through the outbox
            log.warning("cannot publish progress of %s: %s", p.run_id, exc)
            return False

    def refusal(self, p: RunProgress) -> bool:
        """The failed state of a request refused before it became a run here: published once, as is (no rows,
        no seal, no outbox: the module ran and keeps nothing for it)."""
        try:
            self.kv.put_progress(p)
            return True
        except Exception as exc:
            log.warning("cannot publish the refusal of %s: %s", p.run_id, exc)
            return False

    def rows(self) -> bool:
        try:
            self.kv.put_rows(self.run_id, self.module, _stored_rows(self.workdir, self.run_id))
            return True
        except Exception as exc:
            log.warning("cannot publish rows of %s: %s", self.run_id, exc)
            return False

    def final(self, p: RunProgress) -> None:
        path = outbox_path(self.workdir, p.run_id)
        try:
            write_atomic(path, p.model_dump_json())
        except OSError as exc:  # a full disk: send it now, nothing else can hold it
            log.warning("cannot write the outbox of %s: %s", p.run_id, exc)
        try:
            sent = send_final(self.kv, self.workdir, p, self.replicas, self.wait_s)
        except Exception as exc:
            log.warning("cannot publish the %s state of %s: %s", p.state.value, p.run_id, exc)
            return
        if sent is not None:
            _taken(self.workdir, path, sent)


def outbox_path(workdir: Path, run_id: str) -> Path:
    return workdir / "outbox" / f"{check_run_id(run_id)}.json"


def unacked_path(workdir: Path, run_id: str) -> Path:
    """A sealed final state the backend took, waiting for the controller's acknowledgement."""
    return workdir / "unacked" / f"{check_run_id(run_id)}.json"


# the heartbeat thread re-sends unacknowledged final states while the run task may start a new delivery of
# the same run (which drops them first): one at a time, so a superseded state never goes out after the drop
_UNACKED_LOCK = threading.Lock()


def drop_waiting(workdir: Path, run_id: str) -> None:
    """A new delivery of ``run_id`` supersedes the states of an earlier one still waiting to be sent or acknowledged."""
    with _UNACKED_LOCK:
        outbox_path(workdir, run_id).unlink(missing_ok=True)
        unacked_path(workdir, run_id).unlink(missing_ok=True)


def _taken(workdir: Path, path: Path, p: RunProgress) -> None:
    """The backend took ``p``: it leaves the outbox; a terminal state waits in ``unacked/`` for the controller."""
    if p.state.terminal:
        try:
            write_atomic(unacked_path(workdir, p.run_id), p.model_dump_json())
        except OSError as exc:  # the broker has it; only a broker that drops it now is not covered
            log.warning("cannot keep the %s state of %s until the controller acknowledges it: %s", p.state.value,
                        p.run_id, exc)
    path.unlink(missing_ok=True)


def send_final(kv: KV, workdir: Path, p: RunProgress, replicas: int = 0, wait_s: float = 2.0) -> RunProgress | None:
    """Rows, then the final state (a terminal one sealed with its rows: :func:`contract.digest.seal`); the state
    sent, or None when fewer than ``replicas`` replicas acknowledged them in ``wait_s`` (not yet published: a
    failover now could lose them, so the outbox keeps them)."""
    rows = _stored_rows(workdir, p.run_id)
    if p.state.terminal:
        p = seal(p, rows)
    acked = kv.put_final(p, rows, replicas, wait_s)
    if acked < replicas:
        log.warning("the %s state of run %s reached the broker but %d of %d replica(s) acknowledged it within "
                    "%g s: kept in the outbox, sent again with the next heartbeat", p.state.value, p.run_id, acked,
                    replicas, wait_s)
        return None
    return p


def _read_entry(path: Path, what: str) -> RunProgress | None:
    """A state kept in the outbox or ``unacked/``; None when it is gone, or unreadable (then removed)."""
    try:
        return RunProgress.model_validate_json(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.warning("unreadable %s %s (%s): removed", what, path.name, exc)
        path.unlink(missing_ok=True)
        return None


def flush_outbox(kv: KV, workdir: Path, replicas: int = 0, wait_s: float = 2.0) -> int:
    """Send every state waiting in the outbox (rows first); returns how many the backend took (and, with
    ``replicas``, that many replicas acknowledged)."""
    folder = workdir / "outbox"
    if not folder.is_dir():
        return 0
    sent = 0
    for path in sorted(folder.glob("*.json")):
        p = _read_entry(path, "outbox entry")
        if p is None:
            continue
        taken = send_final(kv, workdir, p, replicas, wait_s)
        if taken is None:
            break  # the replicas are behind or gone: one WAIT per flush, so the heartbeat is not held up
        _taken(workdir, path, taken)
        log.info("outbox: sent the %s state of run %s", p.state.value, p.run_id)
        sent += 1
    return sent


def resend_due(now: float, last_sent: float, first_sent: float, interval: float) -> bool:
    """Whether an unacknowledged final state is sent again now (pure): ``interval`` after it was last sent, or a
    tenth of its age when that is longer (at most hourly), so a module no controller acknowledges for days
    does not send it every half minute."""
    return now - last_sent >= max(interval, min(3600.0, (now - first_sent) / 10.0))


def resend_unacked(kv: KV, workdir: Path, *, interval: float, keep_for: float, replicas: int = 0,
                   wait_s: float = 2.0, now: float | None = None) -> int:
    """Final states waiting for the controller: an acknowledged one is dropped, one older than ``keep_for``
    (the broker's ``result_expires``) too; one due (:func:`resend_due`; the entry's mtime: when it was last
    sent) is sent again, rows and telemetry first. Returns how many were sent again."""
    folder = workdir / "unacked"
    if not folder.is_dir():
        return 0
    now = time.time() if now is None else now
    resent = 0
    for path in sorted(folder.glob("*.json")):
        with _UNACKED_LOCK:
            p = _read_entry(path, "unacknowledged final state")
            try:
                last = path.stat().st_mtime
            except OSError:
                continue
            if p is None:
                continue
            if kv.acked(p):
                path.unlink(missing_ok=True)
                log.info("the controller holds the %s state of run %s and its %s rows", p.state.value, p.run_id,
                         p.stored_rows)
                continue
            first = p.finished_at or p.updated_at
            if now - first > keep_for:
                path.unlink(missing_ok=True)
                log.warning("the %s state of run %s was not acknowledged in %.0f s: no longer sent (its rows stay "
                            "under runs/%s)", p.state.value, p.run_id, now - first, p.run_id)
                continue
            if not resend_due(now, last, first, interval):
                continue
            taken = send_final(kv, workdir, p, replicas, wait_s)
            if taken is None:
                break
            with contextlib.suppress(OSError):
                if taken != p:  # the module's rows changed meanwhile (they are the truth): the new seal waits
                    write_atomic(path, taken.model_dump_json())
                else:
                    os.utime(path)
            log.info("sent the %s state of run %s again: not yet acknowledged by the controller", p.state.value,
                     p.run_id)
            resent += 1
    return resent


def execute_run(app: Celery, settings: AgentSettings, payload: dict[str, Any]) -> dict[str, Any]:
    """The body of the run task (plain function, so tests can call it without a worker).

    Every path ends in a terminal state with a reason, published through the outbox; the only
    exception is a clean interrupt (the agent shutting down), which re-queues the run.
    """
    kv = KV(app)
    workdir = settings.workdir.expanduser()
    try:
        req = validate_request(payload, settings)
    except RefusedRequest as exc:  # runs nothing, builds no path; the module stays healthy
        log.warning("%s", exc)
        refused = refused_progress(exc, settings, time.time())
        if refused is None:
            return {"state": RunState.FAILED.value, "error": str(exc)}
        Publisher(kv, workdir, refused.run_id, refused.module).refusal(refused)
        return refused.model_dump(mode="json")
    pub = Publisher(kv, workdir, req.run_id, req.module, replicas=settings.replicas_to_wait(),
                    wait_s=settings.final_state_wait)
    try:
        return _execute(app, settings, req, kv, pub)
    except Exception as exc:  # noqa: BLE001 - a full disk, a bug: the run still ends, with the reason
        log.exception("run %s ended by an error of the agent", req.run_id)
        message = f"agent error: {type(exc).__name__}: {exc}"
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            message = f"disk full in the work folder: {exc}"
        p = RunProgress(run_id=req.run_id, module=req.module, release=req.release, state=RunState.FAILED,
                        step="agent", keys_total=len(req.models), updated_at=time.time(), finished_at=time.time(),
                        error=StepError(step="agent", message=message))
        _forget_current(workdir, req.run_id)
        pub.final(p)
        return p.model_dump(mode="json")


def _forget_current(workdir: Path, run_id: str) -> None:
    """state.json no longer names ``run_id`` as current (removed when it cannot be rewritten: a full disk)."""
    store = RunStore(workdir)
    if store.current_run() != run_id:
        return
    try:
        store.set_state(current_run=None, last_run=run_id)
    except OSError:
        store.state_path.unlink(missing_ok=True)


def recorded_difference(store: RunStore, req: RunRequest) -> str | None:
    """Why this module's record of ``req.run_id`` is of another request (one line), or None: no record, or
    one of the same request (:func:`contract.records.request_identity`), which may be resumed or answered
    from. A record whose request cannot be read is nobody's to answer from."""
    try:
        recorded = store.request(req.run_id)
    except (OSError, ValueError) as exc:
        return f"run id {req.run_id} has a record here whose request cannot be read ({error_line(exc)}): refused"
    if recorded is not None:
        return request_difference(recorded, req)
    prev = _read_json(store.run_dir(req.run_id) / "progress.json")  # a record without its request (none expected)
    label = release_label(req)
    if isinstance(prev, dict) and prev.get("release") and prev.get("release") != label:
        return (f"run id {req.run_id} was used here for release {_clip(str(prev.get('release')))}; this request is "
                f"for {req.sha256[:12]}… ({label}): refused")
    return None


def _clip(text: str, n: int = 64) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def refuse_other_request(req: RunRequest, pub: Publisher, why: str) -> dict[str, Any]:
    """A request under a run id this module used for another request: refused, published as this module's failed
    state of it. Nothing of the recorded run is touched: not its files, not its rows on the broker (the state goes
    alone, not through the outbox, which would send the recorded rows with it)."""
    log.warning("%s", why)
    now = time.time()
    p = RunProgress(run_id=req.run_id, module=req.module, release=req.release, state=RunState.FAILED,
                    step="dispatch", keys_total=len(req.models), updated_at=now, finished_at=now,
                    error=StepError(step="dispatch", message=why))
    pub.refusal(p)
    return p.model_dump(mode="json")


def _execute(app: Celery, settings: AgentSettings, req: RunRequest, kv: KV, pub: Publisher) -> dict[str, Any]:
    from agent.pipeline import AgentConfig, run_pipeline

    workdir = settings.workdir.expanduser()
    run_dir = workdir / "runs" / req.run_id
    other = recorded_difference(RunStore(workdir), req)
    if other is not None:  # before anything of this run id is touched here: its files, its outbox entry
        return refuse_other_request(req, pub, other)
    # the servers of a run whose worker was killed: the port must be free before this run. Only a run that did not end
    # leaves any (state.json still names it; a run that ends stopped what it started), and the scan reads
    # every process of the machine: skipped otherwise
    if RunStore(workdir).current_run() is not None:
        left = reap_orphans(workdir)
        if left:
            log.warning("stopped %d processes left by an earlier run: %s", len(left), left)
    drop_waiting(workdir, req.run_id)  # this delivery supersedes a state waiting to be sent or acknowledged

    def finish(state: RunState, step: str, message: str) -> dict[str, Any]:
        p = RunProgress(run_id=req.run_id, module=req.module, release=req.release, state=state, step=step,
                        keys_total=len(req.models), updated_at=time.time(), finished_at=time.time(),
                        error=StepError(step=step, message=message))
        pub.final(p)
        return p.model_dump(mode="json")

    prev = _read_json(run_dir / "progress.json")
    if isinstance(prev, dict) and RunState(prev.get("state", "pending")).terminal:
        done = RunProgress.model_validate(prev)  # of this same request (recorded_difference, above)
        log.info("run %s already finished here (%s): not benchmarking again", req.run_id, done.state.value)
        pub.final(done)
        return done.model_dump(mode="json")
    flag = kv.cancel_flag(req.run_id, req.module)
    if flag:
        return finish(RunState.FAILED if flag.lost else RunState.CANCELLED, "dispatch", flag.reason)
    attempt = _bump_attempts(run_dir)
    if attempt > req.max_attempts:
        return finish(RunState.FAILED, "dispatch",
                      f"delivered {attempt} times (agent lost during the run); giving up after {req.max_attempts}")
    _write_deadline(run_dir, time.time() + settings.run_time_limit)
    # the run stops itself a little before its soft limit (the hard limit ends the worker: hard_limit)
    deadline = time.monotonic() + settings.run_soft_time_limit - min(30.0, 0.1 * settings.run_soft_time_limit)
    token = KVCancelToken(kv, req.run_id, req.module, deadline=deadline, stop_file=stop_file(workdir))
    sent_rows = 0  # no rows to publish before the first one (a resumed run's kept rows count: published first)

    def on_progress(p: RunProgress) -> None:
        nonlocal sent_rows
        if p.state.terminal:  # the run's end goes out once, sealed, with finished_at and telemetry: pub.final below
            return
        p = p.model_copy(update={"attempt": attempt})
        if p.rows != sent_rows and pub.rows():  # rows first: progress never claims rows the controller lacks
            sent_rows = p.rows
        pub.progress(p)

    try:
        result = run_pipeline(req, AgentConfig.from_settings(settings), on_progress=on_progress, cancel=token)
    except BadInput as exc:  # nothing could be recorded by the pipeline (e.g. a run id reused for another release)
        return finish(RunState.FAILED, "dispatch", str(exc))
    final = result.progress.model_copy(update={"attempt": attempt})
    if final.state == RunState.CANCELLED and token.shutdown:
        # stopped cleanly: state.json keeps naming the run, and the agent re-queues it when it starts again
        _bump_attempts(run_dir, -1)  # a clean interrupt is not a failed delivery
        final = final.model_copy(update={"state": RunState.INTERRUPTED, "finished_at": None, "error": StepError(
            step=final.error.step if final.error else "run", model_key=final.model_key,
            message="interrupted: the agent is shutting down; the run resumes from its passed keys")})
        with contextlib.suppress(OSError):
            RunStore(workdir).write_progress(final)
            RunStore(workdir).set_state(current_run=req.run_id, last_run=req.run_id)
        pub.final(final)
        return final.model_dump(mode="json")
    if final.state == RunState.CANCELLED and token.lost:
        final = final.model_copy(update={"state": RunState.FAILED, "error": StepError(
            step=final.error.step if final.error else "run", model_key=final.model_key, message=token.reason or "")})
        with contextlib.suppress(OSError):
            RunStore(workdir).write_progress(final)
    _forget_current(workdir, req.run_id)
    pub.final(final)
    return final.model_dump(mode="json")


def requeue(app: Celery, req: RunRequest) -> None:
    """Put ``req`` back on this module's own queue: it resumes when the module takes work again."""
    app.send_task(RUN_TASK, args=[req.model_dump(mode="json")], queue=queue_name(req.module), ignore_result=True,
                  task_id=f"{req.run_id}.r{secrets.token_hex(3)}.{req.module}",  # ends in .<module> (ACL)
                  retry=True, retry_policy={"max_retries": 10, "interval_start": 0.5, "interval_step": 1,
                                            "interval_max": 5})
    log.info("run %s re-queued on %s", req.run_id, queue_name(req.module))


def stop_file(workdir: Path) -> Path:
    return workdir / "shutting-down"


def recover(app: Celery, settings: AgentSettings) -> list[str]:
    """At start: runs an earlier agent left unfinished (killed, or stopped cleanly) are reported and resumed.

    Each is re-queued on this module's queue (keys that passed are kept), or ended when it was
    cancelled or already delivered ``max_attempts`` times. Returns their run ids.
    """
    store = RunStore(settings.workdir.expanduser())
    found = [r for r in [store.current_run(), *store.runs()] if r and is_run_id(r)]
    done: list[str] = []
    for run_id in dict.fromkeys(found):
        p = store.progress(run_id) if (store.runs_dir / run_id / "progress.json").exists() else None
        left = run_id == store.current_run() or (p is not None and p.state == RunState.INTERRUPTED)
        if left and _recover_one(app, settings, store, run_id):
            done.append(run_id)
    return done


def _recover_one(app: Celery, settings: AgentSettings, store: RunStore, run_id: str) -> bool:
    workdir = store.workdir
    try:
        p = store.progress(run_id)
        req = store.request(run_id)
    except (OSError, ValueError) as exc:
        log.warning("run %s left by an earlier agent is unreadable: %s", run_id, exc)
        return False
    _forget_current(workdir, run_id)
    if req is None or (p is not None and p.state.terminal):
        return False
    kv = KV(app)
    pub = Publisher(kv, workdir, run_id, req.module, replicas=settings.replicas_to_wait(),
                    wait_s=settings.final_state_wait)
    base = p or RunProgress(run_id=run_id, module=req.module, release=req.release, keys_total=len(req.models))
    try:
        flag = kv.cancel_flag(run_id, req.module)
    except Exception as exc:
        log.warning("cannot read the cancel flag of %s: %s", run_id, exc)
        flag = None
    attempts = int(_read_json(store.run_dir(run_id) / "attempts") or 0)
    deadline = _read_deadline(store.run_dir(run_id))
    now = time.time()
    clean = base.state == RunState.INTERRUPTED
    why = (f"the agent was stopped during step {base.step or 'start'}" if clean
           else f"the agent was restarted during step {base.step or 'start'} (its earlier process died)")
    # a delivery past its hard deadline is over, whether the kernel's alarm ended the worker there
    # (hard_limit) or the agent was down past it; a run stopped cleanly (SIGTERM) resumes whenever it is back
    expired = not clean and deadline is not None and now >= deadline
    if flag is not None or attempts >= req.max_attempts or expired:
        state = (RunState.CANCELLED if flag and not flag.lost else RunState.FAILED)
        message = (flag.reason if flag else
                   f"hard time limit of {settings.run_time_limit:g} s exceeded: {why}" if expired else
                   f"{why}; delivered {attempts} times, giving up")
        final = base.model_copy(update={"state": state, "updated_at": now, "finished_at": now,
                                        "error": StepError(step=base.step or "run", message=message)})
        log.warning("run %s left by an earlier agent: %s", run_id, message)
        with contextlib.suppress(OSError):
            store.write_progress(final)
        pub.final(final)
        return True
    interrupted = base.model_copy(update={"state": RunState.INTERRUPTED, "updated_at": now, "error": StepError(
        step=base.step or "run", message=f"interrupted: {why}; resumes from its passed keys")})
    with contextlib.suppress(OSError):
        store.write_progress(interrupted)
    pub.final(interrupted)
    requeue(app, req)
    log.warning("run %s left by an earlier agent: re-queued to resume", run_id)
    return True


def register_tasks(app: Celery, settings: AgentSettings | None) -> None:
    @app.task(name=RUN_TASK, bind=True, acks_late=True, reject_on_worker_lost=True)
    def run_release(self: Any, payload: dict[str, Any]) -> dict[str, Any]:
        if settings is None:
            raise RuntimeError("run task reached a process without agent settings")
        with hard_limit(settings.run_time_limit):
            return execute_run(self.app, settings, payload)

    @app.task(name=NOOP_TASK, bind=True, acks_late=True)
    def noop(self: Any, sent_at: float) -> dict[str, float]:
        return {"sent_at": sent_at, "started_at": time.time()}


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
    import gc

    gc.collect()
    malloc.trim()


def run_worker(settings: AgentSettings, *, loglevel: str = "INFO") -> None:
    """Run the module's worker until it is stopped (SIGTERM: warm shutdown). Call it from the main thread."""
    logging.basicConfig(level=loglevel, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    workdir = settings.workdir.expanduser()
    workdir.mkdir(parents=True, exist_ok=True)
    app = make_app(settings, module=settings.module)
    problem = broker_eviction_problem(app)  # an unreachable broker raises here as claim_name would
    if problem:
        raise EvictingBroker(problem)
    lease = claim_name(KV(app), settings)  # NameInUse: another live agent has this module's name
    why = procs.hold_orphans()  # what a run starts stays the worker's descendant, daemonized or not
    if why:
        log.warning("the worker is not the subreaper of its runs: %s", why)
    left = reap_orphans(workdir)
    if left:
        log.warning("stopped %d processes left by an earlier agent: %s", len(left), left)
    stop_file(workdir).unlink(missing_ok=True)
    os.environ[MARK] = str(workdir)
    signal.signal(signal.SIGALRM, signal.SIG_DFL)  # the hard time limit ends the process (hard_limit)
    import agent.pipeline  # noqa: F401 - imported once here, not by the first run
    register_tasks(app, settings)
    log.info("agent %s for module %s, broker %s, queue %s", agent_version(), settings.module,
             settings.redacted_broker_url(), queue_name(settings.module))
    recover(app, settings)

    from celery.signals import worker_shutting_down

    @worker_shutting_down.connect(weak=False)
    def _shutting_down(**_: Any) -> None:  # SIGTERM: the run in progress stops cleanly and is re-queued
        with contextlib.suppress(OSError):
            stop_file(workdir).touch()

    hb = HeartbeatThread(app, settings, lease)
    hb.start()
    served = MetricsServing(settings)
    from celery.signals import worker_ready

    @worker_ready.connect(weak=False)
    def _serve_metrics(**_: Any) -> None:
        served.start()
        settle()

    try:
        worker = app.Worker(
            queues=[queue_name(settings.module)],
            concurrency=1,
            pool="solo",  # one process: the run in the main thread (hard_limit, recover)
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
            flush_outbox(hb.kv, workdir, settings.replicas_to_wait(), settings.final_state_wait)
            if _same_agent(hb.kv.lease(settings.module), lease):
                hb.kv.drop_lease(settings.module)
        served.stop()


def main(config: str | None = None, *, loglevel: str = "INFO") -> None:
    """``python -m agent.worker`` and ``fleet-agent worker``: settings from ``FLEET_*`` variables and the
    config file (``config``, else ``FLEET_CONFIG``)."""
    import sys

    from contract.oneline import error_line
    from contract.settings import SettingsError, load_settings

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


if __name__ == "__main__":
    main()
