"""The sampler: one thread per run on the module, asking the device tool every ``period_s``.

It can neither stall nor fail a run: every call of the tool has a timeout (the tool's whole
process group is killed past it), a missing, hanging or failing tool is recorded once (an
event of step ``telemetry`` and a note in the summary) and the run goes on; a failing tool
is asked again with back-off, a missing one not at all. The pipeline tells it what the run
is doing (:meth:`Sampler.tell`); each sample carries the run id, attempt, step and model key.
It asks ``--query --json`` first; a tool that refuses it or answers no JSON is asked its
``--query-gpu`` CSV (and ``-q`` for what that lacks) for the rest of the run, noted once.

:func:`run_tool` is this package's one I/O seam with processes (tests pass their own).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import resource
import shutil
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Literal

from pydantic import BaseModel, ConfigDict, Field

from agent.procs import REAPER
from agent.telemetry.energy import GAP_FACTOR, MIN_SAMPLES, Edge
from agent.telemetry.fields import BY_NAME, FIELDS, NUMERIC
from agent.telemetry.gmi_json import JSON_FLAGS, NotGmiJson, parse_json
from agent.telemetry.nvml import nvml_counter
from agent.telemetry.parse import Reading, invalid_field, parse_csv, parse_q
from agent.telemetry.plan import TOOLS, QueryPlan, choose_tool
from agent.telemetry.rate import (
    FAST_STEPS,
    IDLE_SAMPLES,
    MIN_PERIOD_S,
    TOOL_SHARE,
    IdleReading,
    Schedule,
    idle_window,
    target_samples,
    tool_floor,
)
from agent.telemetry.summary import read_samples, summarize
from contract.records import DeviceInfo, DeviceSample, TelemetrySummary

log = logging.getLogger(__name__)

SAMPLES_FILE = "telemetry.jsonl"


class TelemetryConfig(BaseModel):
    """How the agent samples its devices (frozen; part of :class:`agent.pipeline.AgentConfig`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = True
    period_s: float = Field(default=1.0, gt=0, description="one sample of every device per period, s")
    tool: str | None = Field(default=None, description="device tool (name or path); default: mthreads-gmi, "
                                                        "else nvidia-smi, whichever is on PATH")
    timeout_s: float = Field(default=5.0, gt=0, description="one call of the tool, s; then it is killed")
    q_every: int = Field(default=10, ge=1, description="'-q' fallback for fields the query lacks: every N samples")
    backoff_max_s: float = Field(default=300.0, gt=0, description="longest pause after failing calls, s")
    min_samples: int = Field(default=MIN_SAMPLES, ge=1, description="samples a benchmark window needs inside it "
                                                                    "for an energy figure")
    fast: bool = Field(default=True, description="sample faster during a key's idle measurement and benchmark "
                                                 "(agent.telemetry.rate: every window of 1.5 x min_samples x the "
                                                 "floor or longer gets 1.5 x min_samples samples)")
    min_period_s: float = Field(default=MIN_PERIOD_S, gt=0, description="the fastest period, s")
    tool_share: float = Field(default=TOOL_SHARE, gt=0, le=1, description="while sampling fast, sampling may take "
                                                                         "at most this share of one core (its "
                                                                         "measured CPU a sample bounds the rate)")
    idle_window_s: float = Field(default=1.0, ge=0, description="idle power before each key's benchmark: the "
                                                                "server up and idle, over a settled window this "
                                                                "long, s (0: the samples before the server starts)")
    idle_max_s: float = Field(default=30.0, gt=0, description="longest wait for the idle power to settle, s")


# -- the process seam ----------------------------------------------------------------------------
@dataclass(frozen=True)
class ToolResult:
    outcome: Literal["ok", "failed", "missing", "timeout"]
    exit_code: int | None = None
    stdout: str = ""
    stderr: str = ""
    duration_s: float = 0.0

    def first_line(self) -> str:
        text = (self.stderr.strip() or self.stdout.strip()).splitlines()
        return text[0][:200] if text else ""


Runner = Callable[[Sequence[str], float, threading.Event], ToolResult]


def run_tool(argv: Sequence[str], timeout: float, stop: threading.Event) -> ToolResult:
    """Run ``argv`` in a session of its own; kill its process group past ``timeout`` or on ``stop``."""
    t0 = time.monotonic()
    # owned: the agent's reaper (a subreaper's) leaves it to this wait
    try:
        proc = REAPER.start(lambda: subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            start_new_session=True, env={**os.environ, "LC_ALL": "C"}))
    except OSError as exc:  # not found, not executable
        return ToolResult("missing", stderr=f"{argv[0]}: {exc.strerror or exc}")
    try:
        return _wait_tool(proc, t0, timeout, stop)
    finally:
        if proc.returncode is not None:
            REAPER.disown(proc.pid)


def _wait_tool(proc: subprocess.Popen[bytes], t0: float, timeout: float, stop: threading.Event) -> ToolResult:
    deadline = t0 + timeout
    while True:
        try:
            out, err = proc.communicate(timeout=max(0.01, min(0.25, deadline - time.monotonic())))
            break
        except subprocess.TimeoutExpired:
            if stop.is_set() or time.monotonic() >= deadline:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.communicate(timeout=2.0)  # reaped; a process stuck in the kernel is left behind
                return ToolResult("timeout", proc.returncode, duration_s=time.monotonic() - t0)
    text = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
    return ToolResult("ok" if proc.returncode == 0 else "failed", proc.returncode, *text,
                      duration_s=time.monotonic() - t0)


def _cpu_of_sample() -> float:
    """CPU seconds so far of this thread and of the process's reaped children (a sample's cost is the difference
    across it: the tool's process, reaped by the sample, and the parsing; a child of another thread reaped
    meanwhile counts too, which the median over the latest samples leaves out)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.thread_time() + r.ru_utime + r.ru_stime


# -- the sampler -------------------------------------------------------------------------------
EventSink = Callable[[str, str], None]  # (status, message)
# the devices' cumulative energy counters, mJ per device index (agent.telemetry.nvml; None: none offered)
CounterReader = Callable[[], dict[int, float]]


class Sampler:
    """Samples every device of the module into ``path`` (JSON lines) until :meth:`stop`."""

    def __init__(self, config: TelemetryConfig, path: Path, *, run_id: str, module: str, attempt: int = 1,
                 on_event: EventSink | None = None, runner: Runner = run_tool,
                 which: Callable[[str], str | None] = shutil.which, clock: Callable[[], float] = time.time,
                 counter: CounterReader | None = None) -> None:
        self.cfg = config
        self.path = path
        self.run_id, self.module, self.attempt = run_id, module, attempt
        self.on_event = on_event
        self.runner = runner
        self.which = which
        self.clock = clock
        self.counter = counter
        # the time of the latest sample written; (step, model key): replaced whole, read whole
        self.last_ts = -math.inf
        self.doing: tuple[str, str | None] = ("", None)
        self.notes: list[str] = []
        self.devices: dict[int, DeviceInfo] = {}
        self.tool = ""
        self.samples = 0
        self.calls = 0
        self.plan: QueryPlan | None = None
        # --query --json until the tool refuses it; the driver --json names (the environment fingerprint reads it)
        self.mode: Literal["json", "csv"] = "json"
        self.driver: str | None = None
        self.firmware: dict[int, str] = {}
        self.q_fields: frozenset[str] = frozenset()
        self._q_checked = False
        self._q_last: dict[int, Reading] = {}
        self._q_age = 0
        self._gone = False
        self._stop = threading.Event()
        self._wake = threading.Event()  # set by tell() when a fast step begins, and by stop()
        self._thread: threading.Thread | None = None
        # CPU seconds of the latest samples: the tool's processes (reaped children) and this thread's parsing
        self.sample_cpu_s: deque[float] = deque(maxlen=20)
        # the fast steps' schedules, in order, and the one in force (None: the base period)
        self.schedules: list[Schedule] = []
        self._fast: Schedule | None = None
        self._recent: deque[tuple[float, int, float]] = deque(maxlen=4096)  # (ts, gpu, W) of the latest samples

    # -- what the pipeline calls -------------------------------------------------------------
    def start(self) -> Sampler:
        """Find the tool (a missing one is noted here, in the caller's order of events) and start sampling."""
        if not self.cfg.enabled or self._thread is not None:
            return self
        tool = choose_tool(self.cfg.tool, self.which)
        if tool is None:
            wanted = self.cfg.tool or " or ".join(TOOLS)
            self._note("unavailable", f"no device tool: {wanted} not found; no device telemetry for this run")
            return self
        self.tool = os.path.basename(tool)
        self.plan = QueryPlan.initial(tool)
        if self.counter is None and self.tool == "nvidia-smi":
            self.counter = nvml_counter()
        thread = threading.Thread(target=self._run, name=f"telemetry-{self.run_id}", daemon=True)
        try:
            thread.start()
        except RuntimeError as exc:  # no thread to be had: the run goes on without telemetry
            self._note("failed", f"telemetry sampler not started: {exc}")
            return self
        self._thread = thread
        return self

    @property
    def thread(self) -> threading.Thread | None:
        """The sampling thread (None when not sampling: disabled, no tool, or not started)."""
        return self._thread

    def tell(self, step: str, model_key: str | None) -> None:
        """What the run does now; a step of :data:`~agent.telemetry.rate.FAST_STEPS` starts its fast schedule
        (the sampling thread woken at once)."""
        if (step, model_key) == self.doing:
            return
        self.doing = (step, model_key)
        if self.cfg.fast and step in FAST_STEPS:
            floor = tool_floor(list(self.sample_cpu_s), base_s=self.cfg.period_s, share=self.cfg.tool_share,
                               min_period_s=min(self.cfg.min_period_s, self.cfg.period_s))
            self._fast = Schedule(since=self.clock(), base_s=self.cfg.period_s, floor_s=floor,
                                  target=target_samples(self.cfg.min_samples))
            self.schedules.append(self._fast)
            self._wake.set()
        else:
            self._fast = None

    def schedule_at(self, ts: float) -> Schedule | None:
        """The fast schedule in force at ``ts`` (None: the base period)."""
        found = None
        for s in self.schedules:
            if s.since <= ts:
                found = s
        return found

    def edge(self) -> Edge:
        """The devices' energy counters now, read at once (not by the sampling thread): a window's edge."""
        counters = self._read_counter() if self.counter is not None else None
        return Edge(ts=self.clock(), counters=counters or None)

    def measure_idle(self, cancelled: Callable[[], bool] = lambda: False) -> IdleReading | None:
        """The idle power in the state the run is in now (the caller told the step ``idle``): sampled fast until
        the last ``idle_window_s`` of samples settle (a longer window where the tool's cost keeps the sampler
        slower: one more than :data:`~agent.telemetry.rate.IDLE_SAMPLES` periods of its floor), at most
        ``idle_max_s``; None when not sampling (or no power sample came)."""
        if self._thread is None or not self._thread.is_alive() or self.cfg.idle_window_s <= 0:
            return None
        since = self.clock()
        stale = GAP_FACTOR * self.cfg.period_s + self.cfg.timeout_s  # no sample for this long: not answering
        # a hanging or failing tool is not waited for (nor is a run slowed)
        if self.last_ts < since - stale:
            return None
        fast = self._fast
        # the window holds IDLE_SAMPLES samples at the schedule's floor, however costly the tool (nvidia-smi's
        # floor: ADR 0037)
        window = max(self.cfg.idle_window_s,
                     (IDLE_SAMPLES + 1) * (fast.floor_s if fast is not None else self.cfg.period_s))
        t0 = time.monotonic()
        while True:
            waited = time.monotonic() - t0
            timed_out = (waited >= self.cfg.idle_max_s or self._stop.is_set() or not self._thread.is_alive()
                         or self.last_ts < self.clock() - stale)
            points: dict[int, list[tuple[float, float]]] = {}
            for ts, gpu, watts in list(self._recent):
                if ts >= since:
                    points.setdefault(gpu, []).append((ts, watts))
            got = idle_window(points, self.clock(), window_s=window, waited_s=waited, min_samples=IDLE_SAMPLES,
                              timed_out=timed_out or cancelled())
            if got is not None or timed_out or cancelled():
                return got
            self._stop.wait(min(0.05, self.cfg.period_s / 4))

    def stop(self) -> None:
        """Stop sampling (a call of the tool in flight is killed); returns within a few seconds."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            if self._thread.is_alive():
                log.warning("telemetry sampler of %s did not stop in time (left behind)", self.run_id)

    def samples_until(self, ts: float, timeout: float | None = None) -> list[DeviceSample]:
        """This attempt's samples so far, once one taken at or after ``ts`` is written (waited for at most
        ``timeout``, default two periods and a call's timeout; not at all when not sampling): what an energy
        window ending at ``ts`` needs."""
        wait = 2 * self.cfg.period_s + self.cfg.timeout_s if timeout is None else timeout
        deadline = time.monotonic() + wait
        # a sampler that has not answered for a while (a hanging tool) is not waited for: the gap drops the figure
        answering = self.last_ts >= ts - GAP_FACTOR * self.cfg.period_s
        while (answering and self._thread is not None and self._thread.is_alive() and self.last_ts < ts
               and not self._stop.is_set() and time.monotonic() < deadline):
            self._stop.wait(min(0.05, self.cfg.period_s / 4))
        return [s for s in read_samples(self.path) if s.attempt == self.attempt]

    def summary(self) -> TelemetrySummary:
        """Summary of every sample of this run in ``path`` (earlier attempts included)."""
        return summarize(read_samples(self.path), run_id=self.run_id, module=self.module, tool=self.tool,
                         period_s=self.cfg.period_s, devices=self.devices.values(), notes=self.notes)

    # -- the thread ------------------------------------------------------------------------------
    def _note(self, status: str, message: str) -> None:
        if message in self.notes:
            return
        self.notes.append(message)
        log.info("telemetry: %s", message)
        if self.on_event is not None:
            try:
                self.on_event(status, message)
            except Exception:  # a broken listener must not stop the sampler
                log.exception("telemetry event listener failed (ignored)")

    def _run(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as fh:
                self._loop(fh)
        except Exception as exc:  # the sampler must never break a run
            log.exception("telemetry sampler failed")
            self._note("failed", f"telemetry sampler stopped: {type(exc).__name__}: {exc}")

    def period(self) -> float:
        """The period in force now: the fast step's schedule, else the base period."""
        fast = self._fast
        return fast.period(self.clock()) if fast is not None else self.cfg.period_s

    def _loop(self, fh: IO[str]) -> None:
        failures = 0
        next_at = time.monotonic()
        while not self._stop.is_set():
            c0 = _cpu_of_sample()
            ok = self._sample_once(fh)
            if self._gone:
                return
            now = time.monotonic()
            period = self.period()
            if ok:
                self.sample_cpu_s.append(_cpu_of_sample() - c0)
                failures = 0
                next_at += period
                if next_at < now:  # the tool took longer than a period: skip, do not catch up
                    next_at = now + period
            else:
                failures += 1
                next_at = now + min(self.cfg.backoff_max_s, period * 2 ** min(failures, 16))
            if self._wake.wait(max(0.0, next_at - now)):  # a fast step began: sample now, on its schedule
                self._wake.clear()
                next_at = time.monotonic()

    def _call(self, argv: list[str]) -> ToolResult | None:
        """One call of the tool; None (noted) when it is gone, hangs or the sampler stops."""
        self.calls += 1
        res = self.runner(argv, self.cfg.timeout_s, self._stop)
        if res.outcome == "ok":
            return res
        if self._stop.is_set():
            return None
        if res.outcome == "failed":
            return res
        if res.outcome == "missing":
            self._gone = True
            self._note("unavailable", f"{self.tool} cannot be run: {res.first_line()}; no device telemetry")
        else:
            self._note("timeout", f"{self.tool} did not answer within {self.cfg.timeout_s:g} s (killed); "
                                  f"asked again with back-off, the run goes on")
        return None

    def _read_json(self) -> tuple[Reading, ...] | str | None:
        """``--query --json``'s readings; why not, when the tool answered but not with JSON; None when it
        did not answer (noted)."""
        assert self.plan is not None
        res = self._call(self.plan.json_argv())
        if res is None:
            return None
        try:
            if res.outcome != "ok":
                raise NotGmiJson(f"exit code {res.exit_code}" + (f": {res.first_line()}" if res.first_line() else ""))
            answer = parse_json(res.stdout)
        except NotGmiJson as exc:
            return str(exc)
        self.driver, self.firmware = answer.driver, dict(answer.firmware)
        return answer.readings

    def _to_csv(self, why: str) -> None:
        """JSON failed where the query CSV answered: CSV (and ``-q``) for the rest of the run."""
        self.mode = "csv"
        why = f"{self.tool} does not answer '{' '.join(JSON_FLAGS)}' ({why}); reading its --query-gpu CSV and -q"
        if self.tool.startswith("mthreads-gmi"):  # JSON is what it was seen to speak: worth a note
            self._note("info", why)
        else:  # nvidia-smi has no JSON: expected, not noted
            log.info("telemetry: %s", why)

    def _query(self) -> ToolResult | None:
        """The query's answer; a refused field name is dropped (or re-spelled) and the query asked again."""
        assert self.plan is not None
        for _ in range(2 * len(FIELDS)):
            res = self._call(self.plan.argv())
            if res is None or res.outcome == "ok":
                return res
            bad = invalid_field(res.stdout + "\n" + res.stderr)
            new = self.plan.refuse(bad) if bad else None
            if new is None:
                self._note("failed", f"{self.tool} exited with code {res.exit_code}: {res.first_line()}")
                return None
            self.plan = new
        return None

    def _read_csv(self) -> tuple[Reading, ...] | None:
        """The query CSV's readings, with what it lacks from ``-q``; None when the tool failed (noted)."""
        res = self._query()
        if res is None:
            return None
        assert self.plan is not None
        readings = parse_csv(res.stdout, self.plan.columns)
        if not readings:
            self._note("failed", f"{self.tool} answered without a device row: {res.first_line()!r}")
            return None
        if self.plan.dropped:
            self._note("info", f"{self.tool}'s query interface does not offer {', '.join(self.plan.dropped)}")
        return self._with_fallback(readings)

    def _sample_once(self, fh: IO[str]) -> bool:
        if self.mode == "csv":
            readings = self._read_csv()
        else:
            # a JSON answer that fails switches to CSV only once CSV answers: a broken tool fails both
            got = self._read_json()
            readings = self._read_csv() if isinstance(got, str) else got
            if isinstance(got, str) and readings:
                self._to_csv(got)
        if not readings:
            return False
        step, key = self.doing
        ts = self.clock()
        energy = self._read_counter()
        lines = []
        for r in readings:
            if r.gpu not in self.devices or (r.name and not self.devices[r.gpu].name):
                self.devices[r.gpu] = DeviceInfo(gpu=r.gpu, name=r.name or "", uuid=r.uuid or "")
            s = DeviceSample.model_validate({**r.values, "ts": ts, "gpu": r.gpu, "run_id": self.run_id,
                                             "module": self.module, "attempt": self.attempt, "step": step,
                                             "model_key": key, "energy_mj": energy.get(r.gpu)})
            lines.append(s.model_dump_json(exclude_none=True) + "\n")
            if s.power_w is not None:
                self._recent.append((ts, s.gpu, s.power_w))
        fh.write("".join(lines))
        fh.flush()
        self.samples += len(readings)
        self.last_ts = ts
        return True

    def _read_counter(self) -> dict[int, float]:
        """The energy counters (mJ per device), when the device offers them; a failing read is noted once and
        the counter left alone for the rest of the run (energy then comes from the power samples)."""
        if self.counter is None:
            return {}
        try:
            return self.counter()
        except Exception as exc:  # a counter that cannot be read must not stop the sampling
            self.counter = None
            self._note("info", f"energy counter not readable ({type(exc).__name__}: {exc}); energy from the "
                               "power samples")
            return {}

    def _with_fallback(self, readings: tuple[Reading, ...]) -> tuple[Reading, ...]:
        """Fields the query lacks, from ``-q`` (checked once; then re-read every ``q_every`` samples)."""
        assert self.plan is not None
        if not self._q_checked:
            self._q_checked = True
            lacking = set(self.plan.dropped) | {f for f in NUMERIC if all(f in r.absent for r in readings)}
            lacking = {f for f in lacking if BY_NAME[f].q_paths}
            if lacking:
                q = self._read_q(sorted(lacking))
                self.q_fields = frozenset(f for f in lacking if any(f in r.values for r in q.values()))
                if self.q_fields:
                    self._q_last = q
                    self._note("info", f"{', '.join(sorted(self.q_fields))} read from '{self.tool} -q' "
                                       f"every {self.cfg.q_every} samples")
        elif self.q_fields:
            self._q_age += 1
            if self._q_age >= self.cfg.q_every:
                self._q_age = 0
                self._q_last = self._read_q(sorted(self.q_fields)) or self._q_last
        if not self.q_fields:
            return readings
        return tuple(r.merged(self._q_last[r.gpu], self.q_fields) if r.gpu in self._q_last else r for r in readings)

    def _read_q(self, names: list[str]) -> dict[int, Reading]:
        assert self.plan is not None
        self.calls += 1
        res = self.runner(self.plan.q_argv(), self.cfg.timeout_s, self._stop)
        if res.outcome != "ok":
            return {}
        return {r.gpu: r for r in parse_q(res.stdout, names)}
