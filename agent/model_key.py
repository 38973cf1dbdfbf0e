"""One model key on a running release: its server started, made ready and stopped, the release's
benchmark run and parsed, and the agent's probe beside it (the per-key steps of :mod:`agent.pipeline`).

Each step is a function of the pipeline's :class:`~agent.pipeline.Run`, whose progress, events and
cancel token it uses; a failing step raises :class:`~agent.errors.StepFailed` naming the key.

Lazy imports: the probe (:mod:`agent.probe`, with asyncio) is imported by the steps that run it, so an idle
worker does not hold it: +2.1 MiB of RSS (``bench/agent.py --imports``, raw
bench/results/agent_20261207_0349_lazy-imports.txt).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent import jit_watch, steps
from agent.config import key_probe_repeat
from agent.errors import Cancelled, StepFailed
from agent.executor import ProcResult, utc_stamp
from agent.health import first_request, port_open, probe
from agent.procs import command_of
from agent.startup import with_startup
from agent.tables import TableError, parse_tables
from agent.telemetry.energy import describe, output_tokens, window_energy, with_energy
from contract.records import ResultRow, StepError

if TYPE_CHECKING:
    from agent.pipeline import Run
    from agent.telemetry.energy import Edge
    from agent.telemetry.rate import IdleReading

log = logging.getLogger(__name__)
# readiness polling period: at most this share of the time waited so far (never under the first pause)
READY_RESOLUTION = 0.02


def serve_and_measure(run: Run, top: Path, env: dict[str, str], key: str,
                       kenv: dict[str, str]) -> tuple[list[ResultRow], StepError | None]:
    host, port = run.cfg.server_host, run.cfg.server_port
    if port_open(host, port):
        free_port(run, key, host, port)
    plan = steps.plan_server(top, key, env, kenv)
    run.event("server", "start", key)
    started = time.time()  # the module's idle power is measured before this
    t0 = time.monotonic()
    server_log = run.store.next_log(run.req.run_id, "server", key)
    try:
        server = run.ex.start(plan.argv, env=plan.env, cwd=plan.cwd, log_path=server_log)
    except OSError as exc:
        raise run._fail("server", t0, exc, key) from exc
    try:
        wait_ready(run, server, key, t0)
        ready_s = time.monotonic() - t0
        warmup_s = warm_up(run, server_log) if run.cfg.warmup_request else None
        said = f"ready in {ready_s:.3f} s" + ("" if warmup_s is None else f", first request {warmup_s:.3f} s")
        run.event("server", "ok", key, duration_s=ready_s, message=said)
        idle = measure_idle(run, key)
        run.emit(step="benchmark", model_key=key)
        rows, err = benchmark(run, top, env, key, kenv, server, idle_before=started, idle=idle)
        p = run.progress
        return with_startup(rows, server_ready_s=ready_s, warmup_s=warmup_s, precompile_source=p.precompile_source,
                            precompile_s=p.precompile_s), err
    finally:
        run.ex.stop(server)
        run.ex.close(server)
        run._stopped(key, run.ex.sweep(), f"key {key}")
        wait_port_free(run, host, port)

def free_port(run: Run, key: str, host: str, port: int) -> None:
    """The server's port is taken: stop the holder when it is this agent's leftover, else fail the key naming
    it (the release is not to blame)."""
    holders = run.ex.port_holders(port)
    foreign = [pid for pid, ours in holders if not ours]
    if not foreign and holders:
        left = [x for pid, _ in holders if pid is not None for x in run.ex.kill_tree(pid)]
        run._stopped(key, left, f"an earlier run, holding port {port},")
        wait_port_free(run, host, port)
        if not port_open(host, port):
            return
        foreign = [pid for pid, _ in run.ex.port_holders(port)]
    if any(pid is not None for pid in foreign):
        who = "; ".join(f"pid {pid} ({command_of(pid)})" for pid in foreign if pid is not None)
        msg = (f"port {host}:{port} is held by a process that is not this agent's: {who}; the server cannot "
               "start (stop that process, or give the agent another server_port)")
    else:
        msg = (f"port {host}:{port} is already in use before starting the server, by a process this agent "
               "cannot see (another user's?); stop it, or give the agent another server_port")
    run.event("server", "failed", key, message=msg)
    raise StepFailed(StepError(step="server", model_key=key, message=msg))

def wait_port_free(run: Run, host: str, port: int) -> None:
    """After a server stopped: wait (bounded) until its port is free for the next key's server."""
    deadline = time.monotonic() + run.cfg.port_free_timeout
    while port_open(host, port) and time.monotonic() < deadline:
        time.sleep(min(0.2, run.cfg.poll_interval))

def warm_up(run: Run, server_log: Path) -> float | None:
    """The first request after ready (one short completion), its wall seconds; None (and a line in the server's
    log) when it was not answered 200. Never fails the key: the benchmark that follows judges the server."""
    took = first_request(f"http://{run.cfg.server_host}:{run.cfg.server_port}", timeout=run.cfg.ready_timeout)
    if took is None:
        append_log(server_log, ["first request after ready (POST /v1/completions) not answered 200: its time is "
                                "left out"])
    return took

def wait_ready(run: Run, server: Any, key: str, t0: float) -> None:
    url = steps.health_url(run.cfg.server_host, run.cfg.server_port)
    deadline = t0 + run.cfg.ready_timeout
    pause = 0.05  # probe quickly at first, then back off to poll_interval
    while True:
        if run.cancelled():
            raise Cancelled("server", key)
        if not server.alive():
            tail = "\n".join(server.pump.tails["err"]) or "\n".join(server.pump.tails["out"])
            msg = f"server exited before it was ready (exit {server.exit_code})"
            why = steps.last_reason(tail)
            # a real server dies loading with a traceback: its last line says why
            if why:
                msg = f"{msg}: {why}"
            run.event("server", "failed", key, duration_s=time.monotonic() - t0, exit_code=server.exit_code,
                       message=msg)
            raise StepFailed(StepError(step="server", model_key=key, exit_code=server.exit_code, message=msg,
                                       stderr_tail=tail[-2000:]))
        if probe(url, timeout=min(2.0, run.cfg.poll_interval * 4)):
            return
        if time.monotonic() > deadline:
            listening = port_open(run.cfg.server_host, run.cfg.server_port)
            msg = (f"server not ready after {run.cfg.ready_timeout:g} s ({url}: "
                   + ("port open, /health not 200 yet)" if listening else "port not open yet: still loading?)"))
            run.event("server", "failed", key, duration_s=time.monotonic() - t0, message=msg)
            tail = "\n".join(server.pump.tails["err"])
            raise StepFailed(StepError(step="server", model_key=key, message=msg, stderr_tail=tail[-2000:]))
        time.sleep(pause)
        # the ready time is a judged figure: the probe's period stays within READY_RESOLUTION of the time waited
        # (a long load is polled every poll_interval, a short simulated one at the first pause)
        pause = min(run.cfg.poll_interval, pause * 2, max(0.05, READY_RESOLUTION * (time.monotonic() - t0)))

def measure_idle(run: Run, key: str) -> IdleReading | None:
    """The module's idle power in one defined state before the key's benchmark: the server up, ready and warmed,
    no request in flight, once its power has settled (:meth:`agent.telemetry.sampler.Sampler.measure_idle`,
    sampled fast); None when the module is not sampled or the measurement is off."""
    sampler = run.sampler
    if sampler is None or sampler.thread is None or run.cfg.telemetry.idle_window_s <= 0:
        return None
    # the sampler's fast schedule; the run's progress stays at the server's step
    sampler.tell("idle", key)
    try:
        return sampler.measure_idle(cancelled=run.cancelled)
    except Exception as exc:
        # an addition: never fails the key (the samples before the server are used then)
        log.warning("idle power before %s not measured: %s", key, exc)
        return None


def window_edge(run: Run) -> tuple[float, Edge | None]:
    """An edge of the benchmark window: the time, and the energy counters read at once where the module has them."""
    sampler = run.sampler
    if sampler is None or sampler.thread is None or sampler.counter is None:
        return time.time(), None
    try:
        got = sampler.edge()
    except Exception as exc:  # a counter that cannot be read: the power samples then
        log.warning("energy counter not read at the window's edge: %s", exc)
        return time.time(), None
    return got.ts, got


def benchmark(run: Run, top: Path, env: dict[str, str], key: str, kenv: dict[str, str],
               server: Any, idle_before: float | None = None,
               idle: IdleReading | None = None) -> tuple[list[ResultRow], StepError | None]:
    plan = steps.plan_benchmark(top, key, env, kenv, run.cfg.benchmark_timeout)
    log_path = run.store.next_log(run.req.run_id, "benchmark", key)
    out_path = log_path.with_suffix(".out")

    def server_gone() -> str | None:
        return None if server.alive() else f"server exited during the benchmark (exit {server.exit_code})"

    run.event("benchmark", "start", key)
    window, opened = window_edge(run)
    watch = jit_watch.Watch(plan.env, window)
    try:
        res = run.ex.run(plan.argv, env=plan.env, cwd=plan.cwd, log_path=log_path, timeout=plan.timeout,
                          cancel=run.cancel, raw_stdout=out_path, watch=server_gone)
    except OSError as exc:
        raise run._fail("benchmark", time.monotonic(), exc, key) from exc
    window_end, closed = window_edge(run)
    if res.outcome == "cancelled":
        raise Cancelled("benchmark", key)
    jit = watch.stop()
    if jit.kernels:
        append_log(log_path, [jit.one_line()])
    text = out_path.read_text(encoding="utf-8", errors="replace") if out_path.exists() else ""
    err = None if res.ok else proc_error("benchmark", key, res)
    if err is not None and res.outcome != "aborted" and not server.alive():
        err = err.model_copy(update={"message": f"{err.message}; {server_gone()}"})
    try:
        rows = steps.parse_benchmark(text, key, source=out_path.name)
    except TableError as exc:
        rows = partial_rows(text, out_path.name)  # keep what parsed cleanly; the key still fails
        if err is None:
            err = StepError(step="parse", model_key=key, message=str(exc), stderr_tail=res.stderr_tail[-2000:])
    rows = jit_watch.annotate(rows, jit)
    said = f"{len(rows)} rows" + (f"; {jit.one_line()}" if jit.kernels else "")
    run.event("benchmark", "ok" if err is None else "failed", key, duration_s=res.duration_s,
               exit_code=res.exit_code, message=said if err is None else err.message)
    if err is None and run.cfg.probe:
        rows = cross_probe(run, key, rows, server, log_path, kenv)
        if run.cfg.probe_sweep_slo:
            rows = sweep_capacity(run, key, rows, server, log_path)
    if err is None:
        edges = (opened, closed) if opened is not None and closed is not None else None
        rows = key_energy(run, rows, window, window_end, idle_before, log_path, edges=edges, idle=idle)
    return rows, err


def key_energy(run: Run, rows: list[ResultRow], start: float, end: float, idle_before: float | None,
               log_path: Path, *, edges: tuple[Edge, Edge] | None = None,
               idle: IdleReading | None = None) -> list[ResultRow]:
    """The key's release rows with the energy over its benchmark window (the server's start and the warm-up
    before the benchmark left out), when the module is sampled: the counters' difference between the window's
    edges where the module has counters, else its power samples (sampled fast while it ran); the idle power
    measured before it. A line in the benchmark's log. Never fails."""
    sampler = run.sampler
    if sampler is None or sampler.thread is None or not end > start:
        return rows
    try:
        samples = sampler.samples_until(end)
        energy = window_energy(samples, start, end, period_s=run.cfg.telemetry.period_s,
                               output_tokens=output_tokens(rows), idle_before=idle_before,
                               min_samples=run.cfg.telemetry.min_samples, edges=edges,
                               schedule=sampler.schedule_at(start), idle=idle)
    except Exception as exc:
        # the figures are an addition: a failure to make them never fails the key
        log.warning("energy of the benchmark window failed: %s", exc)
        append_log(log_path, [f"energy not measured: {type(exc).__name__}: {exc}"])
        return rows
    append_log(log_path, [describe(energy)])
    return with_energy(rows, energy)

def cross_probe(run: Run, key: str, rows: list[ResultRow], server: Any, log_path: Path,
                kenv: dict[str, str] | None = None) -> list[ResultRow]:
    """The agent's own client on some of the key's profiles, while the server still runs: probe
    rows beside the release's, release rows flagged where the two disagree beyond the measured noise (lines
    appended to the benchmark's log). Never fails the key."""
    from agent.probe import ProbeConfig, cross_check, probe_row, run_probe

    like = {r.profile: r for r in rows if r.table == "sweep"}
    wanted = [p for p in run.cfg.probe_profiles if p in like]
    if not wanted:
        return rows
    repeat, bad = key_probe_repeat(kenv or {}, run.cfg.probe_repeat)
    if bad is not None:
        append_log(log_path, [f"probe: {bad}"])
    run.emit(step="probe", model_key=key)
    run.event("probe", "start", key)
    t0 = time.monotonic()
    cfg = ProbeConfig(base_url=f"http://{run.cfg.server_host}:{run.cfg.server_port}", profiles=tuple(wanted),
                      requests=run.cfg.probe_requests, warmup=run.cfg.probe_warmup, repeat=repeat,
                      output_len=like[wanted[0]].output_tokens or 100, timeout_s=run.cfg.probe_timeout)
    try:
        report = run_probe(cfg, stop=lambda: run.cancelled() or not server.alive())
    except Exception as exc:  # the probe checks the release; it never fails the key
        log.warning("probe of %s failed: %s", key, exc)
        append_log(log_path, [f"probe failed: {type(exc).__name__}: {exc}"])
        run.event("probe", "failed", key, duration_s=time.monotonic() - t0, message=str(exc))
        return rows
    if run.cancelled():
        raise Cancelled("probe", key)
    tol = run.cfg.probe_tolerance
    results = [r for r in report.results if r.profile in like]
    probes = [probe_row(r, like[r.profile], tolerance=tol) for r in results]
    checked, found, notes = cross_check(rows, results, tol)
    lines = [f"probe {report.base_url} model {report.model}, time scale {report.time_scale:g}, prompts as "
             f"{report.prompt}, engine fields {'sent' if report.engine_fields else 'refused'}"
             + (f", {repeat} rounds" if repeat > 1 else "")]
    for p in probes:
        errs = f", errors {p.extra['probe_errors']}" if "probe_errors" in p.extra else ""
        each = p.extra.get("probe_ttft_each_ms", "")
        lines.append(f"{p.profile}: TTFT {p.ttft_ms} ms, TPOT {p.tpot_ms} ms ({p.extra.get('probe_ok')}/"
                     f"{p.extra.get('probe_requests')} ok{errs}); each TTFT in ms, first right after the release's "
                     f"benchmark: {each}")
        ci = [f"{k.removesuffix('_ci95')} [{v.replace(',', ', ')}]" for k, v in p.extra.items() if k.endswith("_ci95")]
        if ci:
            lines.append(f"{p.profile}: 95 % intervals over {p.extra.get('probe_repeats')} rounds: {'; '.join(ci)}")
    lines += [f"release benchmark disagrees beyond the measured noise: {d.one_line()}" for d in found]
    lines += [f"release and probe differ, explained: {n}" for n in notes]
    append_log(log_path, lines)
    errors = report.errors
    run.event("probe", "failed" if errors else "ok", key, duration_s=time.monotonic() - t0,
               message=f"{len(probes)} profile(s), {len(found)} disagreement(s)"
               + (f", {len(notes)} explained" if notes else "") + (f", errors {errors}" if errors else ""))
    return checked + probes


def sweep_capacity(run: Run, key: str, rows: list[ResultRow], server: Any, log_path: Path) -> list[ResultRow]:
    """The probe's SLO sweep on the key's first probed profile, within ``probe_sweep_budget``: one capacity row
    beside the others (lines appended to the benchmark's log). Never fails the key."""
    from agent.probe import ProbeConfig
    from agent.probe.compare import capacity_row
    from agent.probe.runner import run_sweep
    from agent.probe.sweep import SweepConfig, SweepSLO

    like = {r.profile: r for r in rows if r.table == "sweep" and r.source == "release"}
    wanted = [p for p in run.cfg.probe_profiles if p in like]
    if not wanted:
        return rows
    run.emit(step="probe", model_key=key)
    run.event("sweep", "start", key)
    t0 = time.monotonic()
    try:
        plan = SweepConfig(slo=SweepSLO.parse(run.cfg.probe_sweep_slo), budget_s=run.cfg.probe_sweep_budget)
        cfg = ProbeConfig(base_url=f"http://{run.cfg.server_host}:{run.cfg.server_port}", profiles=(wanted[0],),
                          output_len=like[wanted[0]].output_tokens or 100, timeout_s=run.cfg.probe_timeout)
        result = run_sweep(cfg, plan, stop=lambda: run.cancelled() or not server.alive())
    except Exception as exc:  # the sweep measures the release; it never fails the key
        log.warning("SLO sweep of %s failed: %s", key, exc)
        append_log(log_path, [f"SLO sweep failed: {type(exc).__name__}: {exc}"])
        run.event("sweep", "failed", key, duration_s=time.monotonic() - t0, message=str(exc))
        return rows
    if run.cancelled():
        raise Cancelled("probe", key)
    row = capacity_row(result, like[wanted[0]])
    cap = result.capacity
    said = (f"capacity at SLO {result.slo}: concurrency {cap.concurrency}, {cap.output_tps or 0:.2f} output tok/s"
            if cap is not None else f"capacity at SLO {result.slo}: none (concurrency 1 breaks it)")
    append_log(log_path, [f"SLO sweep {result.profile}: {row.extra.get('sweep_levels', '')}; stopped: {result.stop}; "
                          f"{said}"])
    run.event("sweep", "ok", key, duration_s=time.monotonic() - t0, message=f"{said}; stopped: {result.stop}")
    return [*rows, row]


def append_log(path: Path, lines: list[str]) -> None:
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.writelines(f"{utc_stamp()} [agent] {line}\n" for line in lines)
    except OSError as exc:
        log.warning("could not write %s: %s", path, exc)


def partial_rows(text: str, source: str) -> list[ResultRow]:
    """Rows of the tables that parse, from output cut short by a failure."""
    blocks = text.replace("\r\n", "\n").split("\n\n")
    rows: list[ResultRow] = []
    for block in blocks:
        try:
            rows.extend(r for t in parse_tables(block, source) for r in t.rows)
        except TableError:
            continue
    return rows


def proc_error(step: str, key: str | None, res: ProcResult) -> StepError:
    tail = res.stderr_tail or res.stdout_tail
    if res.outcome in ("timeout", "aborted"):
        msg = res.reason
    else:
        why = steps.failure_cause(tail, res.exit_code)
        msg = (f"{step} {why}" if why.startswith("killed by ")
               else f"{step} exited with code {res.exit_code}" + (f": {why}" if why else ""))
    return StepError(step=step, model_key=key, exit_code=res.exit_code, message=msg, stderr_tail=tail[-2000:])
