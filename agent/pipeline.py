"""The release-validation pipeline of one module for one run.

``run_pipeline(request, config)`` verifies and unpacks the release, configures its model
paths, generates the workflow, captures ``setup_env.sh``'s variables, precompiles the
TileLang kernels (once per release and model set on this module), then for each model key
starts its server, waits until it serves, runs the benchmark, parses and stores its rows,
and stops the server's whole process group, then anything else the key left (a daemon in a
session of its own included: :meth:`Executor.sweep`). A port held before a server starts is
freed when the holder is a leftover of this agent's, else the key fails naming the holder.
Files written along the way are described in :mod:`agent.store`. A failing key does not
stop the others; a failing release-wide step ends the run (state FAILED); a cancel ends it at once (state CANCELLED).
"""

from __future__ import annotations

import json
import logging
import os
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent import env_probe, model_key, steps
from agent.config import AgentConfig
from agent.errors import BadInput, Cancelled, StepFailed
from agent.executor import CancelToken, EventCancelToken, Executor, ProcResult, utc_stamp
from agent.kernel_cache import Ledger, RunCache
from agent.model_key import proc_error
from agent.procs import Left
from agent.state import RunMachine
from agent.store import RunStore
from agent.tables import stamp
from agent.telemetry import SAMPLES_FILE, Sampler
from agent.unpack import UnpackLimits, verify_sha256
from agent.unpack import unpack as unpack_tarball
from contract.files import write_atomic
from contract.fingerprint import EnvFingerprint
from contract.records import (
    MODEL_KEYS,
    Frozen,
    KeyOutcome,
    ResultRow,
    RunProgress,
    RunRequest,
    RunState,
    StepError,
    TelemetrySummary,
)
from contract.request_identity import release_difference

__all__ = ["AgentConfig", "CancelToken", "EventCancelToken", "RunResult", "run_pipeline"]

log = logging.getLogger(__name__)

ProgressCallback = Callable[[RunProgress], None]
_RELEASE_STEPS = ("fetch", "unpack", "configure", "generate", "environment", "precompile")
_RELEASE_SHARE = 0.1  # of the progress bar; the keys share the rest


class RunResult(Frozen):
    progress: RunProgress
    rows: tuple[ResultRow, ...] = ()

    @property
    def ok(self) -> bool:
        p = self.progress
        return p.state == RunState.DONE and p.error is None and all(o.status == "passed" for o in p.outcomes)


def run_pipeline(request: RunRequest, config: AgentConfig, *, on_progress: ProgressCallback | None = None,
                 cancel: CancelToken | None = None, executor: Executor | None = None, ledger: Ledger | None = None
                 ) -> RunResult:
    """Run ``request`` on this module; never raises for a failing step (see the result's progress). Raises
    :class:`~agent.errors.BadInput` only when nothing can be recorded: an invalid run id, or a run id already used
    on this module for another release; ``ledger``: the kernel cache's attestations on the broker (None: none)."""
    ex = executor or Executor(poll_interval=config.poll_interval, stop_grace=config.stop_grace)
    return Run(request, config, ex, on_progress, cancel or EventCancelToken(), ledger).execute()


class Run:
    def __init__(self, request: RunRequest, config: AgentConfig, executor: Executor,
                 on_progress: ProgressCallback | None, cancel: CancelToken, ledger: Ledger | None = None) -> None:
        self.req = request
        self.cfg = config
        self.ex = executor
        self.on_progress = on_progress
        self.cancel = cancel
        self.store = RunStore(config.workdir)
        self.machine = RunMachine()
        self.sha16 = steps.release_digest(request.sha256)
        self.release = request.release or Path(request.tarball).name
        self.outcomes: dict[str, KeyOutcome] = {k: KeyOutcome(model_key=k, status="pending") for k in request.models}
        self.folders: dict[str, Path] = {}
        self.steps_done = 0
        self.sampler: Sampler | None = None
        self.fingerprint: EnvFingerprint | None = None
        self.ledger = ledger  # who compiled what, on the broker; None: no broker
        self.progress = RunProgress(run_id=request.run_id, module=config.module, release=self.release,
                                    keys_total=len(self.outcomes), updated_at=time.time())

    # ----- progress and events
    def emit(self, **changes: Any) -> None:
        outcomes = tuple(self.outcomes.values())
        done = sum(1 for o in outcomes if o.status not in ("pending", "running"))
        share = _RELEASE_SHARE * min(self.steps_done, len(_RELEASE_STEPS)) / len(_RELEASE_STEPS)
        keys_share = (1 - _RELEASE_SHARE) * done / max(1, len(outcomes))
        update: dict[str, Any] = {
            "state": self.machine.state, "outcomes": outcomes, "keys_done": done,
            "progress": round(min(1.0, share + keys_share), 4), "updated_at": time.time(),
            "rows": sum(o.rows for o in outcomes),
        }
        update.update(changes)
        self.progress = self.progress.model_copy(update=update)
        if self.sampler is not None:
            self.sampler.tell(self.progress.step, self.progress.model_key)
        try:
            self.store.flush_events()  # events held back first: progress never runs ahead
            self.store.write_progress(self.progress)
        except OSError as exc:  # a full disk must not hide the run's outcome
            log.warning("could not write progress of %s: %s", self.req.run_id, exc)
        if self.on_progress is not None:
            try:
                self.on_progress(self.progress)
            except Exception:  # a broken listener must never break the run
                log.exception("on_progress callback failed (ignored)")

    def note(self, **changes: Any) -> None:
        """Changes the next :meth:`emit` writes and publishes, where one follows at once (one progress write,
        not two within a millisecond; a run that stops before it ends with an emit of its own)."""
        self.progress = self.progress.model_copy(update=changes)

    def to(self, state: RunState, step: str, key: str | None = None, *, emit: bool = True) -> None:
        self.machine.transition(state)
        if emit:
            self.emit(step=step, model_key=key)
        else:
            self.note(step=step, model_key=key)

    def event(self, step: str, status: str, key: str | None = None, *, hold: bool = False, **kw: Any) -> None:
        """A line of the run's events; ``hold``: written with the next one (or the next progress), in one append."""
        try:
            self.store.add_event(self.req.run_id, step=step, status=status, model_key=key, hold=hold, **kw)
        except OSError as exc:
            log.warning("could not write event %s/%s: %s", step, status, exc)

    def check(self, step: str, key: str | None = None, deadline: float | None = None,
              timeout: float = 0.0) -> Callable[[], None]:
        def _check() -> None:
            if self.cancelled():
                raise Cancelled(step, key)
            if deadline is not None and time.monotonic() > deadline:
                raise StepFailed(StepError(step=step, model_key=key, message=f"timed out after {timeout:g} s"))
        return _check

    def cancelled(self) -> bool:
        try:
            return bool(self.cancel.is_cancelled())
        except Exception:  # a broken token: keep running, say so
            log.exception("cancel token failed (treated as not cancelled)")
            return False

    def agent_log(self, step: str, key: str | None, lines: list[str]) -> Path:
        path = self.store.next_log(self.req.run_id, step, key)
        with open(path, "a", encoding="utf-8") as f:
            for line in lines:
                f.write(f"{utc_stamp()} [agent] {line}\n")
        return path

    # ----- the run
    def execute(self) -> RunResult:
        started = time.time()
        prior = self._prepare()
        self._contain()
        self.sampler = Sampler(self.cfg.telemetry, self.store.run_dir(self.req.run_id) / SAMPLES_FILE,
                               run_id=self.req.run_id, module=self.cfg.module, attempt=prior,
                               on_event=lambda status, msg: self.event("telemetry", status, message=msg)).start()
        self.note(started_at=started, attempt=prior)
        try:
            top, env = self._release_steps()
            self._keys(top, env)
            self.to(RunState.PUBLISHING, "publish")
            self.to(RunState.DONE, "done")
        except Cancelled as exc:
            self._finish_keys("cancelled")
            self.event(exc.step, "cancelled", exc.model_key, message=str(exc))
            self.machine.transition(RunState.CANCELLED)
            self.emit(error=StepError(step=exc.step, model_key=exc.model_key, message="cancelled"))
        except StepFailed as exc:
            self._finish_keys("skipped")
            self.machine.transition(RunState.FAILED)
            self.emit(error=exc.error)
        except Exception as exc:  # an agent bug still ends the run, recorded as failed
            log.exception("run %s failed unexpectedly", self.req.run_id)
            step = self.progress.step or "run"
            self._finish_keys("skipped")
            self.machine.transition(RunState.FAILED)
            err = StepError(step=step, model_key=self.progress.model_key,
                            message=f"internal error: {type(exc).__name__}: {exc}",
                            stderr_tail=traceback.format_exc(limit=5)[-2000:])
            self.event(step, "failed", self.progress.model_key, message=err.message)
            self.emit(error=err)
        finally:
            self.sampler.stop()
            self._stopped(None, self.ex.close_run(), "the run")
            self._close_state()
        self.emit(finished_at=time.time(), progress=1.0 if self.machine.state == RunState.DONE else
                  self.progress.progress, telemetry=self._telemetry_summary())
        rows = tuple(self.store.rows(self.req.run_id))
        return RunResult(progress=self.progress, rows=rows)

    def _telemetry_summary(self) -> TelemetrySummary | None:
        if self.sampler is None or not self.cfg.telemetry.enabled:
            return None
        try:
            return self.sampler.summary()
        except Exception:  # a failed summary must not hide the run's outcome
            log.exception("telemetry summary of %s failed (left out)", self.req.run_id)
            return None

    def _prepare(self) -> int:
        """Check the request against an earlier attempt of the same run id; return this attempt's number."""
        self.store.run_dir(self.req.run_id)  # validates the run id
        # a run id is resumed for the same release only (release_difference); a person re-running
        # `fleet-agent run` may change its keys and settings. The worker, which takes requests from any controller,
        # takes a run id it has a record of only for the very same request (agent.task.recorded_difference)
        old = self.store.request(self.req.run_id)
        other = release_difference(old, self.req) if old is not None else None
        if other is not None:
            raise BadInput(other)
        self.store.write_request(self.req)
        last = self.store.last_run()
        self.store.set_state(current_run=self.req.run_id, last_run=last)
        before = self.store.progress(self.req.run_id)
        if before is None:
            return 1
        for o in before.outcomes:
            if o.status == "passed" and o.model_key in self.outcomes:
                self.outcomes[o.model_key] = o  # passed in an earlier attempt: kept, not re-run
        return before.attempt + 1

    def _contain(self) -> None:
        """The run's processes in a cgroup of their own (where there is one); what earlier runs left, stopped."""
        left, why = self.ex.open_run(self.cfg.workdir, self.req.run_id)
        if why:
            log.info("run %s has no cgroup of its own: %s (the agent's subreaper still holds its processes)",
                     self.req.run_id, why)
        self._stopped(None, left, "an earlier run")

    def _stopped(self, key: str | None, left: list[Left], by: str) -> None:
        """Record processes stopped because ``by`` left them running (nothing when none)."""
        if not left:
            return
        what = ", ".join(x.one_line() for x in left[:10]) + (f" and {len(left) - 10} more" if len(left) > 10 else "")
        msg = f"stopped {len(left)} process(es) {by} left running: {what}"
        log.warning("run %s: %s", self.req.run_id, msg)
        self.event("cleanup", "stopped", key, message=msg)

    def _close_state(self) -> None:
        try:
            self.store.set_state(current_run=None, last_run=self.req.run_id)
        except OSError as exc:
            log.warning("could not write state.json: %s", exc)

    def _finish_keys(self, status: str) -> None:
        for k, o in self.outcomes.items():
            if o.status in ("pending", "running"):
                self.outcomes[k] = o.model_copy(update={"status": status})

    # ----- release-wide steps
    def _release_steps(self) -> tuple[Path, dict[str, str]]:
        self._fetch()
        top = self._unpack()
        self._configure(top)
        base = dict(os.environ) if self.cfg.base_env is None else dict(self.cfg.base_env)
        cache = self.store.tilelang_cache(self.sha16)
        cache.mkdir(parents=True, exist_ok=True)
        pre_env = steps.script_env(base, {}, host=self.cfg.server_host, port=self.cfg.server_port, cache_dir=cache)
        self._run_step(steps.plan_generate(top, pre_env, self.cfg.generate_timeout), RunState.GENERATING)
        self.steps_done += 1
        env = self._environment(top, pre_env, cache)
        if self.cfg.kernel_cache is not None:  # the kernel cache's key needs the fingerprint first
            self._fingerprint(top, env)
        self._precompile(top, env)
        if self.fingerprint is None:
            self._fingerprint(top, env)
        return top, env

    def _fingerprint(self, top: Path, env: dict[str, str]) -> None:
        self.fingerprint = env_probe.probe_run(self, top, env)  # never fails: a failed probe says "unknown"
        self.note(fingerprint=self.fingerprint)

    def _begin(self, state: RunState, step: str) -> float:
        self.check(step)()
        self.event(step, "start", hold=True)  # written with the progress, next (and the last step's end)
        self.to(state, step)
        return time.monotonic()

    def _end(self, step: str, t0: float, status: str = "ok", message: str = "") -> None:
        """A release-wide step done. Its progress and event line are not written on their own: the next step's
        start follows at once and writes them with its own; a run that stops before that writes its end."""
        self.event(step, status, duration_s=time.monotonic() - t0, message=message, hold=True)
        self.steps_done += 1

    def _fail(self, step: str, t0: float, exc: Exception, key: str | None = None) -> StepFailed:
        self.event(step, "failed", key, duration_s=time.monotonic() - t0, message=str(exc))
        return StepFailed(StepError(step=step, model_key=key, message=str(exc)))

    def _fetch(self) -> None:
        t0 = self._begin(RunState.FETCHING, "fetch")
        path = Path(self.req.tarball)
        sha = self.req.sha256.lower()
        # a release verified before and unpacked here is not read again: the run uses the unpacked copy, and
        # hashing a multi-GiB tarball on every run is seconds of the module's CPU
        verified = self.store.release_verified(self.sha16)
        if self.store.release_dir(self.sha16).is_dir() and _read_text(verified) == sha:
            msg = f"release {sha[:16]} already verified and unpacked here: {path} not read again"
            self.agent_log("fetch", None, [msg])
            self._end("fetch", t0, "skipped", msg)
            return
        check = self.check("fetch", deadline=t0 + self.cfg.fetch_timeout, timeout=self.cfg.fetch_timeout)
        try:
            verify_sha256(path, self.req.sha256, check=check)
        except BadInput as exc:
            self.agent_log("fetch", None, [f"refused {path}: {exc}"])
            raise self._fail("fetch", t0, exc) from exc
        try:
            write_atomic(verified, sha + "\n")
        except OSError as exc:  # the next run hashes it again
            log.warning("could not record the verified digest in %s: %s", verified, exc)
        self.agent_log("fetch", None, [f"{path}: sha256 {sha} verified"])
        self._end("fetch", t0)

    def _unpack(self) -> Path:
        t0 = self._begin(RunState.UNPACKING, "unpack")
        dest = self.store.release_dir(self.sha16)
        check = self.check("unpack", deadline=t0 + self.cfg.unpack_timeout, timeout=self.cfg.unpack_timeout)
        try:
            limits = UnpackLimits(max_members=self.cfg.unpack_max_members,
                                  max_name_bytes=self.cfg.unpack_max_name_bytes)
            done = unpack_tarball(Path(self.req.tarball), dest, check=check, limits=limits)
        except (BadInput, OSError) as exc:
            self.agent_log("unpack", None, [f"refused / failed: {exc}"])
            raise self._fail("unpack", t0, exc) from exc
        gone = self.store.prune_releases(keep=self.cfg.keep_releases, current=self.sha16)
        pruned = [f"removed the unpacked releases used least recently, with their caches: {', '.join(gone)}"
                  ] if gone else []
        if done.reused:
            msg = f"release already unpacked in {dest}: reused"
            self.agent_log("unpack", None, [msg, *pruned])
            self._end("unpack", t0, "skipped", msg)
        else:
            self.agent_log("unpack", None, [f"unpacked {done.members} members into {dest}", *pruned])
            self._end("unpack", t0)
        return done.top

    def _configure(self, top: Path) -> None:
        t0 = self._begin(RunState.CONFIGURING, "configure")
        notes: list[str] = []
        for key, o in self.outcomes.items():
            if o.status != "pending":
                continue
            try:
                folder = steps.model_folder(key, self.req.model_root, self.req.model_paths)
            except BadInput as exc:
                self._key_failed(key, StepError(step="configure", model_key=key, message=str(exc)))
                notes.append(str(exc))
                continue
            if not folder.is_dir():
                err = StepError(step="configure", model_key=key, message=f"model folder {folder} not found")
                self._key_failed(key, err)
                notes.append(err.message)
                continue
            self.folders[key] = folder
        if not self.folders and not any(o.status == "passed" for o in self.outcomes.values()):
            self.agent_log("configure", None, notes)
            raise self._fail("configure", t0, BadInput("no model key can run: " + "; ".join(notes)))
        cfg_path = top / steps.CONFIG_JSON
        folders = self._all_folders()
        try:
            text = steps.configure_workflow(cfg_path.read_text(encoding="utf-8"), folders, str(cfg_path))
            write_atomic(cfg_path, text)
        except (BadInput, OSError) as exc:
            raise self._fail("configure", t0, exc) from exc
        notes.append(f"{steps.CONFIG_JSON}: model_paths = {json.dumps(folders, ensure_ascii=False)}")
        self.agent_log("configure", None, notes)
        self._end("configure", t0)

    def _all_folders(self) -> list[str]:
        """Model folders of every key this run covers (for the config and the precompile cache key)."""
        keys = [k for k in self.req.models if k in MODEL_KEYS]
        folders = [str(self.folders[k]) for k in keys if k in self.folders]
        for k in keys:  # keys passed earlier still belong to the model set
            if k not in self.folders and self.outcomes[k].status == "passed":
                folders.append(str(steps.model_folder(k, self.req.model_root, self.req.model_paths)))
        return list(dict.fromkeys(folders))

    def _environment(self, top: Path, base: dict[str, str], cache: Path) -> dict[str, str]:
        plan = steps.plan_environment(top, base, self.cfg.environment_timeout)
        log_path = self.store.next_log(self.req.run_id, plan.step)
        raw = log_path.with_suffix(".env0")
        self._run_step(plan, RunState.ENVIRONMENT, log_path=log_path, raw=raw)
        try:
            captured = steps.parse_env_capture(raw.read_bytes(), plan.env)
        finally:
            raw.unlink(missing_ok=True)  # values may be secret: never kept on disk
        with open(log_path, "a", encoding="utf-8") as f:
            f.write(f"{utc_stamp()} [agent] captured {len(captured)} variables: {', '.join(sorted(captured))}\n")
        self.steps_done += 1
        return steps.script_env(base, captured, host=self.cfg.server_host, port=self.cfg.server_port,
                                cache_dir=cache)

    def _precompile(self, top: Path, env: dict[str, str]) -> None:
        marker = self.store.precompile_marker(steps.precompile_marker(self.req.sha256, self._all_folders()))
        if marker.exists():
            self.to(RunState.PRECOMPILING, "precompile")
            msg = f"precompile cached for this release and model set ({marker.name}): skipped"
            log.info("%s", msg)
            self.agent_log("precompile", None, [msg])
            self.event("precompile", "skipped", message=msg)
            self.steps_done += 1
            self.note(precompile_cached=True, precompile_source="cached")
            return
        t0 = time.monotonic()
        shared = RunCache.of(self, self._all_folders())  # None: the fleet's kernel cache is off
        use = shared.fetch() if shared is not None else None  # None: compile (an event says why)
        if use is None:
            self._run_step(steps.plan_precompile(top, env, self.cfg.precompile_timeout), RunState.PRECOMPILING)
        else:
            self.to(RunState.PRECOMPILING, "precompile")
        took = time.monotonic() - t0
        info = {"sha256": self.req.sha256, "folders": self._all_folders(), "duration_s": took,
                "run_id": self.req.run_id, "ts": time.time(), "fetched": use.archive if use else None}
        write_atomic(marker, json.dumps(info) + "\n")
        if shared is not None and use is None:
            use = shared.publish(took)
        self.steps_done += 1
        # its wall time, judged as a start-up cost (agent.startup); written with the first key's server start, next
        self.note(precompile_cached=False, precompile_source=use.action if use else "compiled",
                  precompile_s=round(took, 3), kernel_cache=use)

    def _run_step(self, plan: steps.StepPlan, state: RunState, *, log_path: Path | None = None,
                  raw: Path | None = None) -> ProcResult:
        """Run a release-wide step (the run in ``state`` while it runs); raise :class:`StepFailed` /
        :class:`Cancelled` when it does not succeed."""
        self.check(plan.step)()
        path = log_path or self.store.next_log(self.req.run_id, plan.step, plan.model_key)
        self.event(plan.step, "start", plan.model_key, hold=True)  # written with the progress, next
        self.to(state, plan.step)
        try:
            res = self.ex.run(plan.argv, env=plan.env, cwd=plan.cwd, log_path=path, timeout=plan.timeout,
                              cancel=self.cancel, raw_stdout=raw, log_stdout=raw is None)
        except OSError as exc:
            raise self._fail(plan.step, time.monotonic(), exc, plan.model_key) from exc
        self._step_end(plan, res)
        return res

    def _step_end(self, plan: steps.StepPlan, res: ProcResult) -> None:
        if res.outcome == "cancelled":
            raise Cancelled(plan.step, plan.model_key)
        status = "ok" if res.ok else "failed"
        err = None if res.ok else proc_error(plan.step, plan.model_key, res)
        self.event(plan.step, status, plan.model_key, duration_s=res.duration_s, exit_code=res.exit_code,
                   message=err.message if err else "", hold=res.ok)  # ok: written with what comes next
        if err is not None:
            raise StepFailed(err)

    # ----- per model key
    def _keys(self, top: Path, env: dict[str, str]) -> None:
        self.to(RunState.BENCHMARKING, "benchmark", emit=False)  # written by what follows: a key's start, or the end
        for key in self.req.models:
            o = self.outcomes[key]
            if o.status == "passed":
                self.event("benchmark", "skipped", key, message="passed in an earlier attempt of this run")
                continue
            if o.status != "pending":
                continue
            self.check("benchmark", key)()
            self._one_key(top, env, key)

    def _key_failed(self, key: str, err: StepError, rows: int = 0, flagged: int = 0, duration: float = 0.0) -> None:
        self.outcomes[key] = KeyOutcome(model_key=key, status="failed", rows=rows, flagged_rows=flagged,
                                        duration_s=round(duration, 3), error=err)
        self.emit()

    def _one_key(self, top: Path, env: dict[str, str], key: str) -> None:
        t0 = time.monotonic()
        self.outcomes[key] = KeyOutcome(model_key=key, status="running")
        self.emit(step="server", model_key=key)
        kenv = steps.key_env(key, self.cfg.key_env.get(key), self.req.key_env.get(key))
        rows: list[ResultRow] = []
        try:
            rows, err = model_key.serve_and_measure(self, top, env, key, kenv)
        except StepFailed as exc:
            err = exc.error
        except Cancelled:
            self.outcomes[key] = KeyOutcome(model_key=key, status="cancelled",
                                            duration_s=round(time.monotonic() - t0, 3))
            raise
        if rows:
            env_ids = {"env_digest": self.fingerprint.digest()} if self.fingerprint is not None else {}
            stamped = stamp(rows, run_id=self.req.run_id, module=self.cfg.module, release=self.release, model_key=key,
                            **env_ids)
            self.store.put_rows(self.req.run_id, key, stamped)
        mine = [r for r in rows if r.source == "release"]  # probe rows sit beside them, not counted
        flagged = sum(1 for r in mine if r.flags)
        if err is not None:
            self._key_failed(key, err, len(mine), flagged, time.monotonic() - t0)
            return
        self.outcomes[key] = KeyOutcome(model_key=key, status="passed", rows=len(mine), flagged_rows=flagged,
                                        duration_s=round(time.monotonic() - t0, 3))
        self.emit(step="benchmark", model_key=key)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return ""
