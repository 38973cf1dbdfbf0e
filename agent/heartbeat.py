"""The agent's presence on the broker: its heartbeat, and the lease on its module's name (one agent per name).

The heartbeat thread also sends what the outbox holds (:mod:`agent.outbox`): a final state not yet taken, one
the controller has not acknowledged yet.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import threading
import time
from pathlib import Path
from typing import Any

from celery import Celery

from agent.outbox import RESEND_EVERY, flush_outbox, resend_unacked
from agent.settings import AgentSettings
from agent.store import read_json, write_atomic
from contract.kv import KV
from contract.records import Heartbeat
from contract.settings import RESULT_EXPIRES
from contract.version import agent_version as agent_version  # re-exported

log = logging.getLogger("fleet.agent")


def current_activity(workdir: Path) -> tuple[str | None, str | None]:
    """(run id, step) of the run in progress on this module, from its own files."""
    state = read_json(workdir / "state.json")
    run_id = state.get("current_run") if isinstance(state, dict) else None
    if not run_id:
        return None, None
    prog = read_json(workdir / "runs" / str(run_id) / "progress.json")
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
        flush_outbox(self.kv, workdir, s.replicas_to_wait())
        resend_unacked(self.kv, workdir, interval=RESEND_EVERY * s.heartbeat_interval, keep_for=RESULT_EXPIRES,
                       replicas=s.replicas_to_wait())
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
            started = psutil.Process(int(held.get("pid", 0))).create_time()
            return bool(abs(started - float(held.get("created", 0))) < 1e-3)
        except (psutil.Error, ValueError, TypeError):
            return False
    return time.time() - float(held.get("ts", 0) or 0) < stale_after


def same_agent(a: dict[str, Any] | None, b: dict[str, Any]) -> bool:
    return a is not None and all(a.get(k) == b[k] for k in ("host", "pid", "created"))


def claim_name(kv: KV, settings: AgentSettings) -> dict[str, Any]:
    """Take the module's name lease, or raise :class:`NameInUse` (and record the conflict for the controller)."""
    mine = lease_record(settings)
    # claim, then read back: of two agents starting at once, one sees the other
    for _ in range(2):
        held = kv.lease(settings.module)
        same = same_agent(held, mine)
        if held is not None and not same and _holder_alive(held, mine, settings.offline_after):
            kv.put_conflict(settings.module, {**mine, "held_by": {k: held.get(k) for k in ("host", "pid", "workdir")}})
            raise NameInUse(f"module name {settings.module!r} is held by a live agent on {held.get('host')} "
                            f"(pid {held.get('pid')}, {held.get('workdir')}); not starting a second one")
        if not same:
            kv.put_lease(settings.module, mine)
        time.sleep(min(0.3, settings.heartbeat_interval))
    return mine
