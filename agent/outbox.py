"""The outbox: a run's states go out from here, its end sent until the backend, and then the controller, took it.

``<workdir>/outbox/<run id>.json`` holds the last state the controller must see, ``<workdir>/unacked/<run id>.json``
a sealed final state waiting for the controller's acknowledgement (:class:`Publisher` says how).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from pathlib import Path

from agent.store import RunStore, check_run_id, write_atomic
from contract.digest import seal
from contract.kv import KV
from contract.records import ResultRow, RunProgress

log = logging.getLogger("fleet.agent")

# how long one WAIT for the replicas of a final state may block, s
FINAL_STATE_WAIT = 2.0
# an unacknowledged final state is sent again every this many heartbeats at first
RESEND_EVERY = 6


def _asked_version(workdir: Path, run_id: str) -> int | None:
    """The contract version of the run's request on this module (None: no readable record of it)."""
    try:
        req = RunStore(workdir).request(run_id)
    except (OSError, ValueError):
        return None
    return req.schema_version if req is not None else None


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
                 wait_s: float = FINAL_STATE_WAIT) -> None:
        self.kv, self.workdir, self.run_id, self.module = kv, workdir, run_id, module
        self.replicas, self.wait_s = replicas, wait_s

    def progress(self, p: RunProgress) -> bool:
        """A state of the run on its way (never its end: a terminal state goes out through :meth:`final`)."""
        if p.state.terminal:
            raise ValueError(f"the {p.state.value} state of {p.run_id} is published once, through Publisher.final")
        try:
            self.kv.put_progress(p)
            return True
        except Exception as exc:
            # the run goes on; the final state is published through the outbox
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
        except OSError as exc:
            # the broker has it; only a broker that drops it now is not covered
            log.warning("cannot keep the %s state of %s until the controller acknowledges it: %s", p.state.value,
                        p.run_id, exc)
    path.unlink(missing_ok=True)


def send_final(kv: KV, workdir: Path, p: RunProgress, replicas: int = 0,
               wait_s: float = FINAL_STATE_WAIT) -> RunProgress | None:
    """Rows, then the final state (a terminal one sealed with its rows: :func:`contract.digest.seal`); the state
    sent, or None when fewer than ``replicas`` replicas acknowledged them in ``wait_s`` (not yet published: a
    failover now could lose them, so the outbox keeps them)."""
    rows = _stored_rows(workdir, p.run_id)
    # sealed in the version of the request it answers: its controller's, or the one before
    if p.state.terminal:
        p = seal(p, rows, _asked_version(workdir, p.run_id))
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


def flush_outbox(kv: KV, workdir: Path, replicas: int = 0, wait_s: float = FINAL_STATE_WAIT) -> int:
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
            # the replicas are behind or gone: one WAIT per flush, so the heartbeat is not held up
            break
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
                   wait_s: float = FINAL_STATE_WAIT, now: float | None = None) -> int:
    """Final states waiting for the controller: an acknowledged one is dropped, one older than ``keep_for``
    (the broker's ``RESULT_EXPIRES``) too; one due (:func:`resend_due`; the entry's mtime: when it was last
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
                # the module's rows changed meanwhile (they are the truth): the new seal waits
                if taken != p:
                    write_atomic(path, taken.model_dump_json())
                else:
                    os.utime(path)
            log.info("sent the %s state of run %s again: not yet acknowledged by the controller", p.state.value,
                     p.run_id)
            resent += 1
    return resent
