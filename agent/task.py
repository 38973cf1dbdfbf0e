"""The run task: one delivery of a run request, from its checks to its final state (``contract.celery_app.RUN_TASK``).

A run is de-duplicated by the module's own record of it: a redelivered run that already finished here is answered
from that record and never benchmarked twice, and only a delivery of the same request (run id, release, model keys
and settings: :func:`~contract.request_identity.request_identity`) is: another request under a run id used here is
refused, the record left as it is; a run delivered more often than the request allows (the worker died under it
again and again) is failed, not retried. The task runs in the worker's main thread under the kernel's hard time limit
(:func:`agent.limits.hard_limit`); its states go out through the outbox (:mod:`agent.outbox`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from celery import Celery

from agent import hold
from agent.errors import BadInput
from agent.limits import bump_attempts, hard_limit, write_deadline
from agent.outbox import Publisher, drop_waiting
from agent.pipeline import AgentConfig, run_pipeline
from agent.recovery import keep_headers, reap_orphans, requeue, sent_headers
from agent.settings import AgentSettings
from agent.store import RunStore, forget_current, read_json
from agent.validate import RefusedRequest, refused_progress, validate_request
from contract.attest import Attestations
from contract.cancel_token import KVCancelToken
from contract.celery_app import NOOP_TASK, RUN_TASK, task_id
from contract.files import write_atomic
from contract.kv import KV
from contract.oneline import error_line
from contract.priority import ASKED, HEADERS, LEVELS
from contract.records import RunProgress, RunRequest, RunState, StepError
from contract.request_identity import release_label, request_difference

log = logging.getLogger("fleet.agent")


def execute_run(app: Celery, settings: AgentSettings, payload: dict[str, Any],
                headers: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The body of the run task (plain function, so tests can call it without a worker).

    Every path ends in a terminal state with a reason, published through the outbox; the exceptions are a clean
    interrupt (the agent shutting down, or a preemption), which re-queues the run, and a run another user's
    reservation of the module holds back (:mod:`agent.hold`), put back on the queue untouched. ``headers``: the
    controller's headers of the message (:data:`contract.priority.HEADERS`).
    """
    headers = dict(headers or {})
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
    pub = Publisher(kv, workdir, req.run_id, req.module, replicas=settings.replicas_to_wait())
    try:
        return _execute(app, settings, req, kv, pub, headers)
    except Exception as exc:  # a full disk, a bug: the run still ends, with the reason
        log.exception("run %s ended by an error of the agent", req.run_id)
        message = f"agent error: {type(exc).__name__}: {exc}"
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            message = f"disk full in the work folder: {exc}"
        p = RunProgress(run_id=req.run_id, module=req.module, release=req.release, state=RunState.FAILED,
                        step="agent", keys_total=len(req.models), updated_at=time.time(), finished_at=time.time(),
                        error=StepError(step="agent", message=message))
        forget_current(workdir, req.run_id)
        pub.final(p)
        return p.model_dump(mode="json")


def recorded_difference(store: RunStore, req: RunRequest) -> str | None:
    """Why this module's record of ``req.run_id`` is of another request (one line), or None: no record, or
    one of the same request (:func:`contract.request_identity.request_identity`), which may be resumed or answered
    from. A record whose request cannot be read is nobody's to answer from."""
    try:
        recorded = store.request(req.run_id)
    except (OSError, ValueError) as exc:
        return f"run id {req.run_id} has a record here whose request cannot be read ({error_line(exc)}): refused"
    if recorded is not None:
        return request_difference(recorded, req)
    prev = read_json(store.run_dir(req.run_id) / "progress.json")  # a record without its request (none expected)
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


def _execute(app: Celery, settings: AgentSettings, req: RunRequest, kv: KV, pub: Publisher,
             headers: dict[str, Any]) -> dict[str, Any]:
    """One delivery of a checked request: held back, refused or answered from its record before anything runs
    (:func:`_before_run`, :func:`_answered`); else the pipeline (:func:`_run_pipeline`) and its end
    (:func:`_settle`)."""
    workdir = settings.workdir.expanduser()
    run_dir = workdir / "runs" / req.run_id
    early = _before_run(app, req, kv, pub, headers, workdir)
    if early is not None:
        return early
    if headers:
        keep_headers(run_dir, headers)
    else:
        # a run re-queued by an agent that kept no headers: those of its first delivery
        headers = sent_headers(run_dir)
    _clear_leftovers(workdir, req.run_id)
    attempt = _answered(req, kv, pub, run_dir)
    if isinstance(attempt, dict):
        return attempt
    ran = _run_pipeline(settings, req, kv, pub, workdir, run_dir, attempt)
    if isinstance(ran, dict):
        return ran
    return _settle(app, req, pub, workdir, run_dir, headers, *ran)


def _before_run(app: Celery, req: RunRequest, kv: KV, pub: Publisher, headers: dict[str, Any],
                workdir: Path) -> dict[str, Any] | None:
    """The task's answer when the run does not start here: held back by another user's reservation (back on the
    queue, behind the holder's work, untouched), or another request under a run id used here (refused); else
    None."""
    held = hold.held_back(kv, req.run_id, req.module, headers, time.time())
    if held is not None:
        requeue(app, req, headers, priority=LEVELS["low"], task_id=task_id(req.module, req.run_id))
        log.info("run %s waits: %s", req.run_id, held.line())
        hold.linger(kv, req.run_id, req.module, headers, stop=stop_file(workdir).exists)
        return {"run_id": req.run_id, "held": held.line()}
    other = recorded_difference(RunStore(workdir), req)
    # before anything of this run id is touched here: its files, its outbox entry
    if other is not None:
        return refuse_other_request(req, pub, other)
    return None


def _clear_leftovers(workdir: Path, run_id: str) -> None:
    """The servers of a run whose worker was killed stopped (the port must be free before this run), and a state
    of this run waiting to be sent dropped (this delivery supersedes it)."""
    # Only a run that did not end leaves any (state.json still names it; a run that ends stopped what it started),
    # and the scan reads every process of the machine: skipped otherwise
    if RunStore(workdir).current_run() is not None:
        left = reap_orphans(workdir)
        if left:
            log.warning("stopped %d processes left by an earlier run: %s", len(left), left)
    drop_waiting(workdir, run_id)


def _finish(req: RunRequest, pub: Publisher, state: RunState, step: str, message: str) -> dict[str, Any]:
    """End the run here in ``state`` before its pipeline ran, with ``message``: published, and the task's answer."""
    p = RunProgress(run_id=req.run_id, module=req.module, release=req.release, state=state, step=step,
                    keys_total=len(req.models), updated_at=time.time(), finished_at=time.time(),
                    error=StepError(step=step, message=message))
    pub.final(p)
    return p.model_dump(mode="json")


def _answered(req: RunRequest, kv: KV, pub: Publisher, run_dir: Path) -> dict[str, Any] | int:
    """The task's answer where the run is not benchmarked (it already finished here, it was cancelled, or it was
    delivered more often than the request allows); else this delivery's attempt number (counted)."""
    prev = read_json(run_dir / "progress.json")
    if isinstance(prev, dict) and RunState(prev.get("state", "pending")).terminal:
        done = RunProgress.model_validate(prev)  # of this same request (recorded_difference, in _before_run)
        log.info("run %s already finished here (%s): not benchmarking again", req.run_id, done.state.value)
        pub.final(done)
        return done.model_dump(mode="json")
    flag = kv.cancel_flag(req.run_id, req.module)
    if flag:
        return _finish(req, pub, RunState.FAILED if flag.lost else RunState.CANCELLED, "dispatch", flag.reason)
    attempt = bump_attempts(run_dir)
    if attempt > req.max_attempts:
        return _finish(req, pub, RunState.FAILED, "dispatch",
                       f"delivered {attempt} times (agent lost during the run); giving up after {req.max_attempts}")
    return attempt


def _run_pipeline(settings: AgentSettings, req: RunRequest, kv: KV, pub: Publisher, workdir: Path, run_dir: Path,
                  attempt: int) -> tuple[RunProgress, KVCancelToken] | dict[str, Any]:
    """Run the pipeline under its deadline and cancel token, its progress published (attempt ``attempt``): its
    final state and the token; the task's answer where the pipeline could record nothing."""
    write_deadline(run_dir, time.time() + settings.run_time_limit)
    # the run stops itself a little before its soft limit (the hard limit ends the worker: hard_limit)
    deadline = time.monotonic() + settings.run_soft_time_limit - min(30.0, 0.1 * settings.run_soft_time_limit)
    token = KVCancelToken(kv, req.run_id, req.module, deadline=deadline, stop_file=stop_file(workdir),
                          honoured=frozenset(_honoured(run_dir)))
    # no rows to publish before the first one (a resumed run's kept rows count: published first)
    sent_rows = 0

    def on_progress(p: RunProgress) -> None:
        nonlocal sent_rows
        # the run's end goes out once, sealed, with finished_at and telemetry: pub.final below
        if p.state.terminal:
            return
        p = p.model_copy(update={"attempt": attempt})
        # rows first: progress never claims rows the controller lacks
        if p.rows != sent_rows and pub.rows():
            sent_rows = p.rows
        pub.progress(p)

    try:
        result = run_pipeline(req, AgentConfig.from_settings(settings), on_progress=on_progress, cancel=token,
                              ledger=Attestations(kv))
    except BadInput as exc:
        # nothing could be recorded by the pipeline (e.g. a run id reused for another release)
        return _finish(req, pub, RunState.FAILED, "dispatch", str(exc))
    return result.progress.model_copy(update={"attempt": attempt}), token


def _settle(app: Celery, req: RunRequest, pub: Publisher, workdir: Path, run_dir: Path, headers: dict[str, Any],
            final: RunProgress, token: KVCancelToken) -> dict[str, Any]:
    """The pipeline's end published: a clean interrupt kept to resume, a preemption re-queued, a lost run
    failed, any other end as it is."""
    if final.state == RunState.CANCELLED and token.shutdown:
        # stopped cleanly: state.json keeps naming the run, and the agent re-queues it when it starts again
        bump_attempts(run_dir, -1)  # a clean interrupt is not a failed delivery
        final = _interrupted(final, "interrupted: the agent is shutting down; the run resumes from its passed keys")
        with contextlib.suppress(OSError):
            RunStore(workdir).write_progress(final)
            RunStore(workdir).set_state(current_run=req.run_id, last_run=req.run_id)
        pub.final(final)
        return final.model_dump(mode="json")
    if final.state == RunState.CANCELLED and token.preempted_by:
        return _preempted(app, req, final, token.preempted_by, workdir, pub, headers)
    if final.state == RunState.CANCELLED and token.lost:
        final = final.model_copy(update={"state": RunState.FAILED, "error": StepError(
            step=final.error.step if final.error else "run", model_key=final.model_key, message=token.reason or "")})
        with contextlib.suppress(OSError):
            RunStore(workdir).write_progress(final)
    forget_current(workdir, req.run_id)
    pub.final(final)
    return final.model_dump(mode="json")


def _interrupted(final: RunProgress, message: str) -> RunProgress:
    """``final`` (the pipeline's cancelled state) as a clean interrupt: not ended, the step it stopped in named."""
    return final.model_copy(update={"state": RunState.INTERRUPTED, "finished_at": None, "error": StepError(
        step=final.error.step if final.error else "run", model_key=final.model_key, message=message)})


def _honoured(run_dir: Path) -> list[str]:
    """The urgent runs this run already stopped for (``preempted-by``): each preemption is honoured once."""
    v = read_json(run_dir / "preempted-by")
    return [str(x) for x in v] if isinstance(v, list) else []


def resume_priority(headers: Mapping[str, Any]) -> int:
    """The broker priority a preempted run goes back on its queue with: the level it was asked for (its message's
    header), not the front of the queue, so that it resumes after the urgent run and after the runs of higher
    levels that waited meanwhile, not before them (issue 48); ``normal`` where the message says none."""
    asked = headers.get(ASKED)
    return LEVELS[asked] if isinstance(asked, str) and asked in LEVELS else LEVELS["normal"]


def _preempted(app: Celery, req: RunRequest, final: RunProgress, by: str, workdir: Path,
               pub: Publisher, headers: Mapping[str, Any]) -> dict[str, Any]:
    """Stopped for the urgent run ``by``, as for a clean shutdown: interrupted (its attempt given back), put back
    on the module's queue (behind the urgent run, sent before it) to resume from its passed keys, and the
    preemption recorded so that the next delivery does not stop for it again."""
    run_dir = workdir / "runs" / req.run_id
    bump_attempts(run_dir, -1)
    final = _interrupted(final, f"interrupted: preempted by urgent run {by}; resumes from its passed keys after it")
    with contextlib.suppress(OSError):
        write_atomic(run_dir / "preempted-by", json.dumps([*_honoured(run_dir), by]))
        RunStore(workdir).write_progress(final)
    forget_current(workdir, req.run_id)
    pub.final(final)
    requeue(app, req, headers, priority=resume_priority(headers))
    log.warning("run %s preempted by urgent run %s: re-queued to resume", req.run_id, by)
    return final.model_dump(mode="json")


def stop_file(workdir: Path) -> Path:
    return workdir / "shutting-down"


def register_tasks(app: Celery, settings: AgentSettings | None) -> None:
    @app.task(name=RUN_TASK, bind=True, acks_late=True, reject_on_worker_lost=True)  # type: ignore[untyped-decorator, unused-ignore]  # celery: no type hints (strict only)
    def run_release(self: Any, payload: dict[str, Any]) -> dict[str, Any]:
        if settings is None:
            raise RuntimeError("run task reached a process without agent settings")
        with hard_limit(settings.run_time_limit):
            return execute_run(self.app, settings, payload, {k: self.request.get(k) for k in HEADERS})

    @app.task(name=NOOP_TASK, bind=True, acks_late=True)  # type: ignore[untyped-decorator, unused-ignore]  # celery: no type hints (strict only)
    def noop(self: Any, sent_at: float) -> dict[str, float]:
        return {"sent_at": sent_at, "started_at": time.time()}
