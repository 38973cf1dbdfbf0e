"""Load shapes: run profiles against a server and summarise what was measured.

For each profile and each load shape: the shared prefix is warmed (a request of the prefix
alone, one output token), ``warmup`` requests of the profile run one at a time, then the
``requests`` measured ones run sequentially, with C in flight, or as Poisson arrivals at
R per second (exponential gaps of mean 1/R, seeded). Only the measured ones count.

The first request tells whether the server takes the engine-specific fields: an HTTP 422
(or a 400 naming them) is answered by sending the same request once more without them,
and they stay off for the rest of the run.

A server whose ``/get_server_info`` carries ``m1000_sim`` is the simulator: it runs
``time_scale`` times faster than a module, so wall times are multiplied back by that
factor, the send instant goes to it in ``X-Sim-Sent-Ns`` (where its clock starts, as for
the release's own benchmark there), and the probe's thread takes, while it measures, the
scheduling priority the simulated release's processes take (docs/concepts/simulator.md "Timing fidelity on a
busy machine": a wake-up late by 1 ms of wall time is N ms of module time). Any other
server: factor 1, no such header, no priority change.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import time
from collections.abc import Callable
from typing import Any

from pydantic import Field

from agent.probe.measure import Exchange, Tokenizer, interpret, summarise
from agent.probe.prompts import (
    Profile,
    PromptKind,
    Prompts,
    body,
    ids_as_text,
    parse_profiles,
    rejects_engine_fields,
    rejects_token_ids,
)
from agent.probe.records import SLO, Api, LoadShape, ProbeReport, ProfileResult, RequestResult
from agent.probe.transport import Transport
from contract.records import Frozen

SIM_SENT_HEADER = "X-Sim-Sent-Ns"
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
    prompt: PromptKind = "ids"
    slo: SLO | None = None
    timeout_s: float = Field(default=600.0, gt=0, description="one request, send to end, wall seconds")
    time_scale: float | None = Field(default=None, gt=0, description="None: the simulated server says, else 1")
    engine_fields: bool = True
    seed: int = 0


class ProbeError(RuntimeError):
    """The probe cannot run at all (no server, no model): one line."""


class _Stopped(Exception):
    """``stop()`` said so: the run ends with what it measured."""


async def discover(t: Transport, model: str | None, scale: float | None) -> tuple[str, float, str | None]:
    """(model, time scale, send-instant header) for the server behind ``t``."""
    sent = None
    if scale is None:
        scale = 1.0
        status, raw = await t.get("/get_server_info")
        if status == 200:
            try:
                info = json.loads(raw)
            except ValueError:
                info = None
            sim = info.get("m1000_sim") if isinstance(info, dict) else None
            if isinstance(sim, dict) and isinstance(sim.get("time_scale"), (int, float)) and sim["time_scale"] > 0:
                scale, sent = float(sim["time_scale"]), SIM_SENT_HEADER
    if model is None:
        status, raw = await t.get("/v1/models")
        if status is None:
            raise ProbeError(f"no server answers at {t.base_url}")
        try:
            data = json.loads(raw).get("data") or []
            model = str(data[0]["id"])
        except (ValueError, AttributeError, IndexError, KeyError, TypeError):
            raise ProbeError(f"{t.base_url}/v1/models names no model (HTTP {status}); give the model") from None
    return model, scale, sent


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

    def __init__(self, cfg: ProbeConfig, t: Transport, model: str, scale: float, sent: str | None,
                 tokenizer: Tokenizer | None, progress: Progress | None, stop: Callable[[], bool] | None) -> None:
        self.cfg = cfg
        self.t = t
        self.model = model
        self.scale = scale
        self.sent = sent
        self.tokenizer = tokenizer
        self.progress = progress
        self.stop = stop or (lambda: False)
        self.engine = cfg.engine_fields
        self.token_ids = True  # False once the server refused a prompt of token ids (sent as words since)
        self.prompts = Prompts(cfg.seed, cfg.prompt)
        self.path = "/v1/completions" if cfg.api == "completions" else "/v1/chat/completions"
        self.done = 0
        self.planned = 0

    async def send(self, prompt: str | list[int], max_tokens: int) -> Exchange:
        for _ in (0, 1, 2):
            engine = self.engine
            ids = isinstance(prompt, list)
            sent = prompt if self.token_ids or not isinstance(prompt, list) else ids_as_text(prompt)
            data = json.dumps(body(self.cfg.api, self.model, sent, max_tokens, images=self.cfg.images,
                                   engine_fields=engine), separators=(",", ":")).encode()
            ex = await self.t.request("POST", self.path, data, headers={"Content-Type": "application/json",
                                                                        "Accept": "text/event-stream"},
                                      timeout=self.cfg.timeout_s, sent_header=self.sent)
            if ex.status is None or ex.status == 200:
                return ex
            said = b"".join(d for _, d in ex.reads).decode("utf-8", "replace")
            if engine and rejects_engine_fields(ex.status, said):
                self.engine = False  # remembered for the rest of the run
                continue
            if ids and self.token_ids and self.cfg.api == "completions" and rejects_token_ids(ex.status, said):
                self.token_ids = False  # remembered for the rest of the run
                continue
            return ex
        return ex

    def tick(self, what: str) -> None:
        self.done += 1
        if self.progress is not None:
            self.progress(what, self.done, self.planned)

    async def one(self, p: Profile, tag: str, index: int, phase_t0: int) -> RequestResult:
        start_s = (time.monotonic_ns() - phase_t0) / 1e9 * self.scale
        ex = await self.send(self.prompts.prompt(p, self.cfg.api, tag), self.cfg.output_len)
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
        n = self.cfg.requests
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
        duration = (max(ends) - t0) / 1e9 * self.scale if ends else 0.0
        return summarise(measured, profile=p.name, prefill_len=p.prefill_len, input_len=p.input_len,
                         output_len=self.cfg.output_len, api=self.cfg.api, load=load, duration_s=duration,
                         slo=self.cfg.slo, time_scale=self.scale, engine_fields=self.engine)


async def probe_async(cfg: ProbeConfig, *, tokenizer: Tokenizer | None = None, progress: Progress | None = None,
                      stop: Callable[[], bool] | None = None) -> ProbeReport:
    """Run every profile under every load shape of ``cfg``; ``stop()`` is asked between requests."""
    profiles = parse_profiles(cfg.profiles)
    width = max((ld.concurrency or 64 for ld in cfg.loads), default=1)
    t = Transport(cfg.base_url, max_idle=max(64, width))
    undo: Callable[[], None] = lambda: None  # noqa: E731
    try:
        model, scale, sent = await discover(t, cfg.model, cfg.time_scale)
        if sent is not None:
            undo = sim_priority()
        s = _Session(cfg, t, model, scale, sent, tokenizer, progress, stop)
        s.planned = len(profiles) * len(cfg.loads) * (cfg.requests + cfg.warmup)
        results: list[ProfileResult] = []
        try:
            for p in profiles:
                for li, load in enumerate(cfg.loads):
                    results.append(await s.profile(p, load, li))
        except _Stopped:
            pass
        return ProbeReport(base_url=t.base_url, model=model, api=cfg.api, time_scale=scale, engine_fields=s.engine,
                           token_ids=s.token_ids, results=tuple(results))
    finally:
        undo()
        await t.aclose()


def run_probe(cfg: ProbeConfig, **kw: Any) -> ProbeReport:
    """:func:`probe_async` in a fresh event loop (for synchronous callers: the CLI, the pipeline)."""
    return asyncio.run(probe_async(cfg, **kw))
