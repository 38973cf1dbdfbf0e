"""Load shapes: run profiles against a server and summarise what was measured.

Prompts are salted per run (cold by default: nothing a server cached from an earlier run, its own
benchmark's or the probe's, matches them); ``cache="warm"`` sends each measured prompt once before
(one output token, not measured) and labels the results so.

For each profile and each load shape: the shared prefix is warmed (a request of the prefix
alone, one output token), ``warmup`` requests of the profile run one at a time, then the
``requests`` measured ones run sequentially, with C in flight, or as Poisson arrivals at
R per second (exponential gaps of mean 1/R, seeded). Only the measured ones count.

The first request tells whether the server takes the engine-specific fields: an HTTP 422
(or a 400 naming them) is answered by sending the same request once more without them,
and they stay off for the rest of the run.

A server whose ``/get_server_info`` carries ``m1000_sim`` is the simulator: it runs
``time_scale`` times faster than a module, so wall times are multiplied back by that
factor; it is sent what any server is sent (it starts a request's clock when the request reaches its kernel,
for every client: docs/adr/0038), and the probe's thread takes, while it measures, the scheduling priority the
simulated release's processes take, so that the probe and the release's benchmark pay their own time alike
(docs/concepts/simulator.md "Timing fidelity on a busy machine": a wake-up late by 1 ms of wall time is N ms of
module time). Any other server: factor 1, no priority change.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from pydantic import Field

from agent.probe.intervals import Interval, t_interval
from agent.probe.measure import Exchange, Tokenizer, interpret, summarise
from agent.probe.prompts import (
    Profile,
    PromptKind,
    PromptMode,
    Prompts,
    body,
    detokenized,
    ids_as_text,
    parse_profiles,
    rejects_engine_fields,
    rejects_token_ids,
)
from agent.probe.records import SLO, Api, Cache, LoadShape, ProbeReport, ProfileResult, RequestResult
from agent.probe.sweep import (
    Level,
    StopReason,
    SweepConfig,
    SweepResult,
    capacity,
    level,
    next_level,
    requests_for,
)
from agent.probe.transport import Transport
from contract.records import Frozen

Progress = Callable[[str, int, int], None]  # (what, requests done, requests planned)


class ProbeConfig(Frozen):
    """One probe run against one OpenAI-compatible server."""

    base_url: str
    model: str | None = None  # None: the first model of /v1/models
    api: Api = "completions"
    profiles: tuple[str, ...] = ("128:128",)
    loads: tuple[LoadShape, ...] = (LoadShape(),)
    requests: int = Field(default=5, ge=1, description="measured requests per profile and load shape")
    warmup: int = Field(default=1, ge=0, description="requests before the measured ones, not counted")
    output_len: int = Field(default=100, ge=1)
    images: int = Field(default=0, ge=0, description="image_url parts per chat request")
    prompt: PromptKind = Field(default="text", description="completions prompts: text (the server's /detokenize "
                               "of random ids, else w<id> words; the server tokenizes, as a client's would) or "
                               "token ids")
    slo: SLO | None = None
    timeout_s: float = Field(default=600.0, gt=0, description="one request, send to end, wall seconds")
    time_scale: float | None = Field(default=None, gt=0, description="None: the simulated server says, else 1")
    engine_fields: bool = True
    seed: int = 0
    cache: Cache = Field(default="cold", description="cold: prompts salted per run, new to the server's prefix "
                         "cache; warm: each measured prompt sent once before (one token, not measured)")
    salt: str | None = Field(default=None, description="the run's prompt salt (None: a fresh one per run)")
    speculative: bool | None = Field(default=None, description="the server decodes speculatively (None: its "
                                     "/get_server_info says; an accept length is reported only then)")
    repeat: int = Field(default=1, ge=1, description="measured phases per profile and load shape; figures pooled, "
                        "each with its 95 % t interval over the phases")


class ProbeError(RuntimeError):
    """The probe cannot run at all (no server, no model): one line."""


class _Stopped(Exception):
    """``stop()`` said so: the run ends with what it measured."""


class Server(NamedTuple):
    """What the probe learns of the server before it measures."""

    model: str
    scale: float
    # the simulator (its /get_server_info has m1000_sim); sglang's speculative_algorithm there (None: not said)
    simulated: bool
    speculative: bool | None


async def discover(t: Transport, model: str | None, scale: float | None) -> Server:
    """The model, time scale, whether simulated and speculative decoding of the server behind ``t``."""
    simulated = False
    speculative = None
    status, raw = await t.get("/get_server_info")
    info = None
    if status == 200:
        with contextlib.suppress(ValueError):
            info = json.loads(raw)
    if isinstance(info, dict) and "speculative_algorithm" in info:
        speculative = bool(info["speculative_algorithm"])
    if scale is None:
        scale = 1.0
        sim = info.get("m1000_sim") if isinstance(info, dict) else None
        if isinstance(sim, dict) and isinstance(sim.get("time_scale"), (int, float)) and sim["time_scale"] > 0:
            scale, simulated = float(sim["time_scale"]), True
    if model is None:
        status, raw = await t.get("/v1/models")
        if status is None:
            raise ProbeError(f"no server answers at {t.base_url}")
        try:
            data = json.loads(raw).get("data") or []
            model = str(data[0]["id"])
        except (ValueError, AttributeError, IndexError, KeyError, TypeError):
            raise ProbeError(f"{t.base_url}/v1/models names no model (HTTP {status}); give the model") from None
    return Server(model, scale, simulated, speculative)


def sim_priority() -> Callable[[], None]:
    """This thread at the simulated release's priority (``M1000_SIM_PRIORITY``: ``rt``, the default,
    lowest real-time round-robin level; ``nice`` -10; ``off``), best effort; returns the undo."""
    mode = (os.environ.get("M1000_SIM_PRIORITY") or "rt").strip().lower()
    if mode == "rt" and hasattr(os, "sched_setscheduler"):
        try:
            policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
            os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))
        except OSError:  # no permission (not root, no CAP_SYS_NICE): try nice
            mode = "nice"
        else:
            return lambda: _quietly(os.sched_setscheduler, 0, policy, param)
    if mode == "nice" and hasattr(os, "setpriority"):
        try:
            old = os.getpriority(os.PRIO_PROCESS, 0)
            if old > -10:
                os.setpriority(os.PRIO_PROCESS, 0, -10)
                return lambda: _quietly(os.setpriority, os.PRIO_PROCESS, 0, old)
        except OSError:
            pass
    return lambda: None


def _quietly(fn: Callable[..., Any], *args: Any) -> None:
    with contextlib.suppress(OSError):
        fn(*args)


class _Session:
    """State of one probe run: the transport, whether engine fields are on, progress."""

    def __init__(self, cfg: ProbeConfig, t: Transport, server: Server, tokenizer: Tokenizer | None,
                 progress: Progress | None, stop: Callable[[], bool] | None) -> None:
        self.cfg = cfg
        self.t = t
        self.model = server.model
        self.scale = server.scale
        self.speculative = cfg.speculative if cfg.speculative is not None else server.speculative
        self.tokenizer = tokenizer
        self.progress = progress
        self.stop = stop or (lambda: False)
        self.engine = cfg.engine_fields
        self.mode: PromptMode = "ids" if cfg.prompt == "ids" else "words"  # text: once /detokenize answered
        self.salt = cfg.salt if cfg.salt is not None else os.urandom(4).hex()
        self.prompts = Prompts(cfg.seed, self.salt)
        self.path = "/v1/completions" if cfg.api == "completions" else "/v1/chat/completions"
        self.done = 0
        self.planned = 0

    async def detokenize(self, ids: list[int]) -> str | None:
        """The server's text of ``ids`` (``/detokenize``; not measured), or None when it has no such endpoint."""
        data = json.dumps({"model": self.model, "tokens": ids}, separators=(",", ":")).encode()
        ex = await self.t.request("POST", "/detokenize", data, headers={"Content-Type": "application/json"},
                                  timeout=min(60.0, self.cfg.timeout_s))
        return detokenized(ex.status, b"".join(d for _, d in ex.reads))

    async def choose_mode(self) -> None:
        """Text prompts: the server's own text of the ids where it detokenizes, else ``w<id>`` words."""
        if self.cfg.prompt == "text" and self.cfg.api == "completions":
            probe = self.prompts.prefix(Profile("mode", 1, 9), "completions")
            self.mode = "text" if isinstance(probe, list) and await self.detokenize(probe) is not None else "words"

    async def as_sent(self, prompt: str | list[int]) -> str | list[int]:
        if not isinstance(prompt, list) or self.mode == "ids":
            return prompt
        if self.mode == "text":
            text = await self.detokenize(prompt)
            if text is not None:
                return text
            self.mode = "words"  # it answered before: remembered for the rest of the run
        return ids_as_text(prompt)

    async def send(self, prompt: str | list[int], max_tokens: int) -> Exchange:
        return await self.send_as(await self.as_sent(prompt), max_tokens)

    async def send_as(self, prompt: str | list[int], max_tokens: int) -> Exchange:
        """One request of a prompt as it goes on the wire (token ids refused by the server: sent as words)."""
        for _ in (0, 1, 2):
            engine = self.engine
            ids = isinstance(prompt, list)
            sent = prompt if self.mode == "ids" or not isinstance(prompt, list) else ids_as_text(prompt)
            data = json.dumps(body(self.cfg.api, self.model, sent, max_tokens, images=self.cfg.images,
                                   engine_fields=engine), separators=(",", ":")).encode()
            ex = await self.t.request("POST", self.path, data, headers={"Content-Type": "application/json",
                                                                        "Accept": "text/event-stream"},
                                      timeout=self.cfg.timeout_s)
            if ex.status is None or ex.status == 200:
                return ex
            said = b"".join(d for _, d in ex.reads).decode("utf-8", "replace")
            if engine and rejects_engine_fields(ex.status, said):
                self.engine = False
                continue
            if ids and self.mode == "ids" and self.cfg.api == "completions" and rejects_token_ids(ex.status, said):
                self.mode = "words"
                continue
            return ex
        return ex

    def tick(self, what: str) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress(what, self.done, self.planned)

    async def one(self, p: Profile, tag: str, index: int, phase_t0: int) -> RequestResult:
        prompt = await self.as_sent(self.prompts.prompt(p, self.cfg.api, tag))  # written as text before the clock
        if self.cfg.cache == "warm":
            await self.send_as(prompt, 1)  # the whole prompt cached before it is measured
        start_s = (time.monotonic_ns() - phase_t0) / 1e9 * self.scale
        ex = await self.send_as(prompt, self.cfg.output_len)
        return interpret(ex, scale=self.scale, tokenizer=self.tokenizer, index=index, start_s=start_s)

    async def profile(self, p: Profile, load: LoadShape, li: int) -> ProfileResult:
        label = f"{p.name} {load.label}"
        if self.stop():
            raise _Stopped
        if p.prefix_len:
            await self.send(self.prompts.prefix(p, self.cfg.api), 1)  # warm the shared prefix
        for w in range(self.cfg.warmup):
            if self.stop():
                raise _Stopped
            await self.one(p, f"L{li}w{w}", -1, time.monotonic_ns())
            self.tick(label)
        phases = []
        for k in range(self.cfg.repeat):
            phases.append(await self.measure(p, load, f"{li}x{k}" if k else li, self.cfg.requests))
        pooled = [r for measured, _ in phases for r in measured]
        out = self._summary(p, load, pooled, sum(d for _, d in phases))
        out = out.model_copy(update={"samples": tuple(pooled), "prompt": self.mode})
        if len(phases) < 2:
            return out
        each = [self._summary(p, load, measured, d) for measured, d in phases]
        return out.model_copy(update={"repeats": len(phases), "intervals": repeat_intervals(each)})

    def _summary(self, p: Profile, load: LoadShape, measured: list[RequestResult], duration: float) -> ProfileResult:
        return summarise(measured, profile=p.name, prefill_len=p.prefill_len, input_len=p.input_len,
                         output_len=self.cfg.output_len, api=self.cfg.api, load=load, duration_s=duration,
                         slo=self.cfg.slo, time_scale=self.scale, engine_fields=self.engine,
                         speculative=self.speculative, cache=self.cfg.cache)

    async def measure(self, p: Profile, load: LoadShape, li: int | str, n: int
                      ) -> tuple[list[RequestResult], float]:
        """``n`` requests of profile ``p`` under ``load``: what each measured, and the phase's duration (server s)."""
        label = f"{p.name} {load.label}"
        results: list[RequestResult | None] = [None] * n
        t0 = time.monotonic_ns()
        ends: list[int] = []

        async def run(i: int) -> None:
            r = await self.one(p, f"L{li}r{i}", i, t0)
            results[i] = r
            ends.append(time.monotonic_ns())
            self.tick(label)

        if load.kind == "rate":
            rng = random.Random(f"{self.cfg.seed}:arrivals:{p.name}:{li}")
            tasks = []
            due = time.monotonic()
            for i in range(n):
                if self.stop():
                    break
                tasks.append(asyncio.ensure_future(run(i)))
                due += rng.expovariate(load.value) / self.scale
                await asyncio.sleep(max(0.0, due - time.monotonic()))
            await asyncio.gather(*tasks)
        else:
            width = load.concurrency or 1
            counter = iter(range(n))

            async def worker() -> None:
                for i in counter:
                    if self.stop():
                        return
                    await run(i)

            await asyncio.gather(*(worker() for _ in range(min(width, n))))
        measured = [r for r in results if r is not None]
        return measured, (max(ends) - t0) / 1e9 * self.scale if ends else 0.0


async def probe_async(cfg: ProbeConfig, *, tokenizer: Tokenizer | None = None, progress: Progress | None = None,
                      stop: Callable[[], bool] | None = None) -> ProbeReport:
    """Run every profile under every load shape of ``cfg``; ``stop()`` is asked between requests."""
    profiles = parse_profiles(cfg.profiles)
    width = max((ld.concurrency or 64 for ld in cfg.loads), default=1)
    t = Transport(cfg.base_url, max_idle=max(64, width))
    undo: Callable[[], None] = lambda: None  # noqa: E731
    try:
        server = await discover(t, cfg.model, cfg.time_scale)
        if server.simulated:
            undo = sim_priority()
        s = _Session(cfg, t, server, tokenizer, progress, stop)
        await s.choose_mode()
        s.planned = len(profiles) * len(cfg.loads) * (cfg.requests * cfg.repeat + cfg.warmup)
        results: list[ProfileResult] = []
        try:
            for p in profiles:
                for li, load in enumerate(cfg.loads):
                    results.append(await s.profile(p, load, li))
        except _Stopped:
            pass
        return ProbeReport(base_url=t.base_url, model=s.model, api=cfg.api, time_scale=s.scale,
                           engine_fields=s.engine, prompt=s.mode, speculative=s.speculative, cache=cfg.cache,
                           results=tuple(results))
    finally:
        undo()
        await t.aclose()


async def sweep_async(cfg: ProbeConfig, sweep: SweepConfig, *, tokenizer: Tokenizer | None = None,
                      progress: Progress | None = None, stop: Callable[[], bool] | None = None) -> SweepResult:
    """The SLO sweep of ``cfg``'s first profile: concurrency levels chosen by :func:`agent.probe.sweep.next_level`
    until it says why it stops; the budget is wall seconds from the first request."""
    (p, *_) = parse_profiles(cfg.profiles)
    t = Transport(cfg.base_url, max_idle=max(64, sweep.max_concurrency))
    undo: Callable[[], None] = lambda: None  # noqa: E731
    began = time.monotonic()
    levels: list[Level] = []
    reason: StopReason = "max_load"
    try:
        server = await discover(t, cfg.model, cfg.time_scale)
        if server.simulated:
            undo = sim_priority()
        deadline = began + sweep.budget_s
        s = _Session(cfg, t, server, tokenizer, progress,
                     lambda: (stop is not None and stop()) or time.monotonic() > deadline)
        await s.choose_mode()
        if p.prefix_len:
            await s.send(s.prompts.prefix(p, cfg.api), 1)
        while True:
            nxt = next_level(levels, sweep, time.monotonic() - began)
            if isinstance(nxt, str):
                reason = nxt
                break
            n = requests_for(nxt, sweep.window)
            s.planned += n
            shape = LoadShape() if nxt == 1 else LoadShape(kind="concurrency", value=nxt)
            t_level = time.monotonic()
            measured, _ = await s.measure(p, shape, len(levels), n)
            # stopped, or the budget ran out in the middle: the level does not count
            if len(measured) < n:
                reason = "stopped" if stop is not None and stop() else "budget"
                break
            levels.append(level(measured, nxt, sweep.slo, time.monotonic() - t_level))
    finally:
        undo()
        await t.aclose()
    return SweepResult(profile=p.name, slo=sweep.slo, levels=tuple(levels), capacity=capacity(levels), stop=reason,
                       wall_s=time.monotonic() - began)


def repeat_intervals(phases: list[ProfileResult]) -> dict[str, Interval]:
    """Each figure's mean over the repeated phases and its 95 % t interval (figures every phase has)."""
    values: dict[str, list[float]] = {}
    for r in phases:
        stats = (("ttft", r.ttft_ms), ("tpot", r.tpot_ms), ("e2e", r.e2e_ms))
        figs = {f"{n}_{q}_ms": getattr(st, q) for n, st in stats if st is not None for q in ("p50", "p90")}
        if r.output_throughput_tps is not None:
            figs["output_tps"] = r.output_throughput_tps
        for k, v in figs.items():
            values.setdefault(k, []).append(v)
    out: dict[str, Interval] = {}
    for k, vs in values.items():
        iv = t_interval(vs) if len(vs) == len(phases) else None
        if iv is not None:
            out[k] = iv
    return out


def run_sweep(cfg: ProbeConfig, sweep: SweepConfig, **kw: Any) -> SweepResult:
    """:func:`sweep_async` in a fresh event loop."""
    return asyncio.run(sweep_async(cfg, sweep, **kw))


def run_probe(cfg: ProbeConfig, **kw: Any) -> ProbeReport:
    """:func:`probe_async` in a fresh event loop (for synchronous callers: the CLI, the pipeline)."""
    return asyncio.run(probe_async(cfg, **kw))
