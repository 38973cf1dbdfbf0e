"""``fleet-agent worker``: the module's Celery worker, its heartbeat, and the run task.

One worker per module consumes its own queue (``module.<name>``) with concurrency 1 and
prefetch 1: a module never benchmarks two things at once. A run is de-duplicated by the
module's own record of it: a redelivered run that already finished here is answered
from that record and never benchmarked twice; a run delivered more often than the
request allows (the worker died under it again and again) is failed, not retried.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import threading
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from celery import Celery

from agent.celery_app import NOOP_TASK, RUN_TASK, make_app, queue_name
from agent.kv import KV, KVCancelToken
from agent.records import Heartbeat, ResultRow, RunProgress, RunState, StepError
from agent.settings import AgentSettings
from agent.store import write_atomic
from agent.validate import RefusedRequest, refused_progress, validate_request

log = logging.getLogger("fleet.agent")

MIN_FREE_DISK = 2 * 1024**3  # below this the module reports itself unhealthy
# Every process the agent starts inherits this variable (value: the work folder), so a
# restarted agent can find and stop what a killed one left running (servers live in
# sessions of their own and survive their parent).
MARK = "M1000_FLEET_AGENT_WORKDIR"


def agent_version() -> str:
    try:
        return metadata.version("m1000-fleet")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0+unknown"


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
    healthy = free is not None and free >= MIN_FREE_DISK
    if free is not None and not healthy:
        detail = f"free disk {free / 1024**3:.1f} GiB < {MIN_FREE_DISK / 1024**3:.0f} GiB"
    return Heartbeat(module=settings.module, agent_version=version, ts=time.time(), run_id=run_id, step=step,
                     free_disk_bytes=free, healthy=healthy, detail=detail)


class HeartbeatThread(threading.Thread):
    """Publishes a heartbeat every ``heartbeat_interval``; a broker outage is logged, never fatal."""

    def __init__(self, app: Celery, settings: AgentSettings) -> None:
        super().__init__(name="fleet-heartbeat", daemon=True)
        self.kv = KV(app)
        self.settings = settings
        self.version = agent_version()
        self.stopped = threading.Event()
        self.failures = 0

    def beat(self) -> Heartbeat:
        hb = make_heartbeat(self.settings, self.version)
        write_atomic(self.settings.workdir.expanduser() / "heartbeat.json", hb.model_dump_json())
        self.kv.put_heartbeat(hb)
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


def reap_orphans(workdir: Path) -> list[int]:
    """Kill processes left by an earlier agent on this work folder; returns their pids."""
    import psutil

    mark, me = str(workdir), os.getpid()
    killed: list[int] = []
    for p in psutil.process_iter():
        if p.pid == me:
            continue
        try:
            if p.environ().get(MARK) == mark:
                p.kill()
                killed.append(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, OSError):
            continue
    return killed


# --------------------------------------------------------------------------- the run task
def _bump_attempts(run_dir: Path) -> int:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "attempts"
    try:
        n = int(path.read_text().strip() or 0)
    except (OSError, ValueError):
        n = 0
    write_atomic(path, f"{n + 1}\n")
    return n + 1


def _stored_rows(workdir: Path, run_id: str) -> list[ResultRow]:
    path = workdir / "runs" / run_id / "results.jsonl"
    rows: list[ResultRow] = []
    try:
        with path.open(encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    try:
                        rows.append(ResultRow.model_validate_json(line))
                    except ValueError:
                        continue  # a torn last line: not taken for whole
    except FileNotFoundError:
        pass
    return rows


def execute_run(app: Celery, settings: AgentSettings, payload: dict[str, Any]) -> dict[str, Any]:
    """The body of the run task (plain function, so tests can call it without a worker)."""
    from agent.pipeline import AgentConfig, run_pipeline

    try:
        req = validate_request(payload, settings)
    except RefusedRequest as exc:  # runs nothing; the module stays healthy
        log.warning("%s", exc)
        refused = refused_progress(exc, settings, time.time())
        if refused is None:
            return {"refused": str(exc)}
        try:
            KV(app).put_progress(refused)
        except Exception as pexc:
            log.warning("cannot publish the refusal of %s: %s", refused.run_id, pexc)
        return refused.model_dump(mode="json")
    kv = KV(app)
    workdir = settings.workdir.expanduser()
    run_dir = workdir / "runs" / req.run_id

    def publish(p: RunProgress) -> None:
        try:
            kv.put_progress(p)
        except Exception as exc:  # the run goes on; the final state is published again
            log.warning("cannot publish progress of %s: %s", p.run_id, exc)

    def publish_rows() -> None:
        try:
            kv.put_rows(req.run_id, req.module, _stored_rows(workdir, req.run_id))
        except Exception as exc:
            log.warning("cannot publish rows of %s: %s", req.run_id, exc)

    def finish(state: RunState, step: str, message: str) -> dict[str, Any]:
        p = RunProgress(run_id=req.run_id, module=req.module, release=req.release, state=state, step=step,
                        keys_total=len(req.models), updated_at=time.time(), finished_at=time.time(),
                        error=StepError(step=step, message=message))
        publish(p)
        return p.model_dump(mode="json")

    if req.module != settings.module:
        return finish(RunState.FAILED, "dispatch", f"run for module {req.module!r} reached {settings.module!r}")
    prev = _read_json(run_dir / "progress.json")
    if isinstance(prev, dict) and prev.get("state") in ("done", "failed", "cancelled"):
        done = RunProgress.model_validate(prev)
        log.info("run %s already finished here (%s): not benchmarking again", req.run_id, done.state.value)
        publish(done)
        publish_rows()
        return done.model_dump(mode="json")
    reason = kv.cancelled(req.run_id, req.module)
    if reason:
        return finish(RunState.CANCELLED, "dispatch", reason)
    attempt = _bump_attempts(run_dir)
    if attempt > req.max_attempts:
        return finish(RunState.FAILED, "dispatch",
                      f"delivered {attempt} times (agent lost during the run); giving up after {req.max_attempts}")
    deadline = time.monotonic() + max(1.0, settings.run_soft_time_limit - 30.0)
    token = KVCancelToken(kv, req.run_id, req.module, deadline=deadline)
    sent_rows = -1

    def on_progress(p: RunProgress) -> None:
        nonlocal sent_rows
        p = p.model_copy(update={"attempt": attempt})
        if p.rows != sent_rows:
            publish_rows()  # rows first: progress never claims rows the controller cannot fetch
            sent_rows = p.rows
        publish(p)

    result = run_pipeline(req, AgentConfig.from_settings(settings), on_progress=on_progress, cancel=token)
    final = result.progress.model_copy(update={"attempt": attempt})
    publish_rows()
    publish(final)
    return final.model_dump(mode="json")


def register_tasks(app: Celery, settings: AgentSettings | None) -> None:
    @app.task(name=RUN_TASK, bind=True, acks_late=True, reject_on_worker_lost=True)
    def run_release(self: Any, payload: dict[str, Any]) -> dict[str, Any]:
        if settings is None:
            raise RuntimeError("run task reached a process without agent settings")
        return execute_run(self.app, settings, payload)

    @app.task(name=NOOP_TASK, bind=True, acks_late=True)
    def noop(self: Any, sent_at: float) -> dict[str, float]:
        return {"sent_at": sent_at, "started_at": time.time()}


def run_worker(settings: AgentSettings, *, loglevel: str = "INFO", pool: str = "prefork") -> None:
    """Run the module's worker until it is stopped (SIGTERM: warm shutdown)."""
    logging.basicConfig(level=loglevel, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    workdir = settings.workdir.expanduser()
    workdir.mkdir(parents=True, exist_ok=True)
    left = reap_orphans(workdir)
    if left:
        log.warning("stopped %d processes left by an earlier agent: %s", len(left), left)
    os.environ[MARK] = str(workdir)
    import agent.pipeline  # noqa: F401 - imported once here, so the forked pool child does not pay it per run
    app = make_app(settings)
    register_tasks(app, settings)
    log.info("agent %s for module %s, broker %s, queue %s", agent_version(), settings.module,
             settings.redacted_broker_url(), queue_name(settings.module))
    hb = HeartbeatThread(app, settings)
    hb.start()
    exporter, pusher = None, None
    if settings.metrics_port or settings.pushgateway_url:
        from agent import metrics

        registry = metrics.build_registry(workdir, settings.module)
        if settings.metrics_port:
            try:
                exporter = metrics.start_exporter(workdir, settings.module, host=settings.metrics_host,
                                                  port=settings.metrics_port, registry=registry)
            except OSError as exc:
                log.error("cannot serve /metrics on %s:%s: %s", settings.metrics_host, settings.metrics_port, exc)
        if settings.pushgateway_url:
            pusher = metrics.Pusher(registry, settings.pushgateway_url, settings.module).start()
    try:
        worker = app.Worker(
            queues=[queue_name(settings.module)],
            concurrency=1,
            pool=pool,
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
        if pusher is not None:
            pusher.stop()
        if exporter is not None:
            with contextlib.suppress(Exception):
                exporter[0].shutdown()


def main(config: str | None = None) -> None:
    """``python -m agent.worker``: settings from ``FLEET_*`` variables and ``FLEET_CONFIG``."""
    from agent.settings import load_settings

    run_worker(load_settings(AgentSettings, config))


if __name__ == "__main__":
    main()
