"""What an earlier agent left: its processes stopped, its unfinished runs resumed (re-queued) or ended.

Every process the agent starts inherits ``agent.procs.MARK`` (value: the work folder), so a restarted agent can find
and stop what a killed one left running (servers live in sessions of their own and survive their parent); a process
that clears its environment is found by its run's cgroup (:mod:`agent.procs`). A run whose process died (the hard
limit, the OOM killer, a signal) took the worker with it; the agent that starts again re-queues it to resume from
its passed keys, or ends it when its limit or its deliveries are spent (:func:`recover`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from celery import Celery

from agent import procs
from agent.limits import read_deadline
from agent.outbox import Publisher
from agent.settings import AgentSettings
from agent.store import RunStore, forget_current, read_json
from contract.celery_app import RUN_TASK, queue_name
from contract.celery_app import task_id as run_task_id
from contract.files import write_atomic
from contract.kv import KV
from contract.priority import HEADERS
from contract.records import RunProgress, RunRequest, RunState, StepError, is_run_id

log = logging.getLogger("fleet.agent")

MARK = procs.MARK


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


def requeue(app: Celery, req: RunRequest, headers: Mapping[str, Any] | None = None, *, priority: int = 0,
            task_id: str | None = None) -> None:
    """Put ``req`` back on this module's own queue: it resumes when the module takes work again.

    ``headers``: the controller's headers the run was sent with (:data:`contract.priority.HEADERS`: the delivery's,
    or those it kept, :func:`sent_headers`), so that it keeps its user (a reservation holds it back) and its wait
    and asked priority (``fleetctl queue``). ``priority``: the broker's number, 0 (taken first: a run resumed after
    a restart or a preemption) unless given.
    """
    headers = headers or {}
    app.send_task(RUN_TASK, args=[req.model_dump(mode="json")], queue=queue_name(req.module), ignore_result=True,
                  task_id=task_id or run_task_id(req.module, req.run_id),  # <module>:<run>: fleetctl queue names it
                  priority=priority, headers={k: v for k, v in headers.items() if k in HEADERS},
                  retry=True, retry_policy={"max_retries": 10, "interval_start": 0.5, "interval_step": 1,
                                            "interval_max": 5})
    log.info("run %s re-queued on %s", req.run_id, queue_name(req.module))


def keep_headers(run_dir: Path, headers: Mapping[str, Any]) -> None:
    """Keep the controller's headers of a run's delivery (``sent.json``): a re-queue after a restart sends them."""
    kept = {k: headers[k] for k in HEADERS if headers.get(k) is not None}
    with contextlib.suppress(OSError):
        write_atomic(run_dir / "sent.json", json.dumps(kept))


def sent_headers(run_dir: Path) -> dict[str, Any]:
    """The headers :func:`keep_headers` kept for the run (empty when none were)."""
    v = read_json(run_dir / "sent.json")
    return {k: v[k] for k in HEADERS if k in v} if isinstance(v, dict) else {}


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
    forget_current(workdir, run_id)
    if req is None or (p is not None and p.state.terminal):
        return False
    kv = KV(app)
    pub = Publisher(kv, workdir, run_id, req.module, replicas=settings.replicas_to_wait())
    base = p or RunProgress(run_id=run_id, module=req.module, release=req.release, keys_total=len(req.models))
    try:
        flag = kv.cancel_flag(run_id, req.module)
    except Exception as exc:
        log.warning("cannot read the cancel flag of %s: %s", run_id, exc)
        flag = None
    attempts = int(read_json(store.run_dir(run_id) / "attempts") or 0)
    deadline = read_deadline(store.run_dir(run_id))
    now = time.time()
    clean = base.state == RunState.INTERRUPTED
    why = (f"the agent was stopped during step {base.step or 'start'}" if clean
           else f"the agent was restarted during step {base.step or 'start'} (its earlier process died)")
    # a delivery past its hard deadline is over, whether the kernel's alarm ended the worker there
    # (agent.limits.hard_limit) or the agent was down past it; a run stopped cleanly (SIGTERM) resumes whenever it is
    # back
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
    requeue(app, req, sent_headers(store.run_dir(run_id)))
    log.warning("run %s left by an earlier agent: re-queued to resume", run_id)
    return True
