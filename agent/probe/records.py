"""Typed, frozen records of the probe: load shapes, SLOs, one request's figures, one run's summary."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import Field, model_validator

from agent.probe.intervals import Interval
from contract.records import Frozen

# Why a request did not count (README "Probe" says when each one applies).
ErrorKind = Literal["http_status", "timeout", "connection", "broken_stream", "stream_error", "missing_usage",
                    "empty_response"]
ERROR_KINDS: tuple[str, ...] = get_args(ErrorKind)
Api = Literal["completions", "chat"]
PromptKind = Literal["text", "ids"]  # what the configuration asks for
PromptMode = Literal["text", "words", "ids"]  # what went: detokenized text, ``w<id>`` words, token ids
# cold: prompts new to the server; warm: each sent once before it is measured
Cache = Literal["cold", "warm"]


class LoadShape(Frozen):
    """How the measured requests are sent: one at a time, C at a time, or Poisson arrivals at R/s."""

    kind: Literal["sequential", "concurrency", "rate"] = "sequential"
    value: float = Field(default=1.0, gt=0)  # concurrency C, or rate R in requests per (server) second

    @model_validator(mode="after")
    def _whole(self) -> LoadShape:
        if self.kind == "concurrency" and self.value != int(self.value):
            raise ValueError("concurrency must be a whole number")
        if self.kind == "sequential" and self.value != 1:
            raise ValueError("sequential load has concurrency 1")
        return self

    @property
    def concurrency(self) -> int | None:
        """Requests in flight at most (None: open loop, Poisson arrivals)."""
        return None if self.kind == "rate" else int(self.value)

    @property
    def label(self) -> str:
        if self.kind == "sequential":
            return "sequential"
        if self.kind == "concurrency":
            return f"concurrency {int(self.value)}"
        return f"rate {self.value:g}/s"


def load_shapes(concurrency: str | None = None, rate: float | None = None) -> tuple[LoadShape, ...]:
    """``--concurrency 1,4,16`` or ``--rate R`` (one, not both) -> load shapes; neither: sequential."""
    if concurrency and rate is not None:
        raise ValueError("give --concurrency or --rate, not both")
    if rate is not None:
        return (LoadShape(kind="rate", value=rate),)
    if not concurrency:
        return (LoadShape(),)
    out: list[LoadShape] = []
    for item in concurrency.split(","):
        item = item.strip()
        if not item:
            continue
        if not item.isdigit() or int(item) < 1:
            raise ValueError(f"concurrency {item!r}: a whole number of at least 1")
        n = int(item)
        shape = LoadShape() if n == 1 else LoadShape(kind="concurrency", value=n)
        if shape not in out:
            out.append(shape)
    return tuple(out) or (LoadShape(),)


class SLO(Frozen):
    """Service-level objectives of goodput: a request is good when it succeeded and meets every one given."""

    ttft_ms: float | None = Field(default=None, gt=0)
    tpot_ms: float | None = Field(default=None, gt=0)
    e2e_ms: float | None = Field(default=None, gt=0)

    @classmethod
    def parse(cls, text: str) -> SLO:
        """``ttft_ms=500,tpot_ms=50,e2e_ms=8000`` (any of them)."""
        values: dict[str, float] = {}
        for item in text.split(","):
            item = item.strip()
            if not item:
                continue
            name, eq, raw = item.partition("=")
            name = name.strip()
            if not eq or name not in cls.model_fields:
                raise ValueError(f"SLO {item!r}: expected ttft_ms=, tpot_ms= or e2e_ms= with a number")
            try:
                values[name] = float(raw)
            except ValueError:
                raise ValueError(f"SLO {item!r}: {raw.strip()!r} is not a number") from None
        if not values:
            raise ValueError("SLO: give at least one of ttft_ms=, tpot_ms=, e2e_ms=")
        return cls(**values)

    def met(self, r: RequestResult) -> bool:
        if not r.ok:
            return False
        checks = ((self.ttft_ms, r.ttft_ms), (self.tpot_ms, r.tpot_ms), (self.e2e_ms, r.e2e_ms))
        # a one-token answer has no TPOT: that objective cannot be missed
        return all(limit is None or value is None or value <= limit for limit, value in checks)

    def __str__(self) -> str:
        return ",".join(f"{k}={v:g}" for k, v in self.model_dump().items() if v is not None)


class RequestResult(Frozen):
    """One measured request. Times are milliseconds of the server's clock (wall x time scale)."""

    index: int = 0
    ok: bool
    error: ErrorKind | None = None
    detail: str = ""
    status: int | None = None
    # the send instant, seconds after the measured phase began; first_byte_ms: from the send to the status line
    start_s: float = 0.0
    first_byte_ms: float | None = None
    ttft_ms: float | None = None
    e2e_ms: float | None = None
    tpot_ms: float | None = None
    itl_ms: tuple[float, ...] = ()
    output_tokens: int | None = None
    input_tokens: int | None = None
    cached_tokens: int | None = None
    content_chunks: int = 0
    tokens_per_chunk: float | None = None  # output tokens / content chunks
    # mean tokens per content chunk after the first (needs per-chunk usage)
    accept_length: float | None = None


class Stat(Frozen):
    """Percentiles (linear interpolation between closest ranks) and mean of one figure."""

    n: int
    mean: float
    p50: float
    p90: float
    p99: float


class ProfileResult(Frozen):
    """The measured phase of one profile under one load shape."""

    profile: str
    prefill_len: int
    input_len: int
    output_len: int
    api: Api
    load: LoadShape
    # measured requests sent (warm-up excluded); error kind -> requests; the first few errors, one line each
    requests: int
    ok: int
    errors: dict[str, int] = Field(default_factory=dict)
    error_details: tuple[str, ...] = ()
    # first send to last end of the measured phase (server's clock)
    duration_s: float = 0.0
    ttft_ms: Stat | None = None
    tpot_ms: Stat | None = None
    itl_ms: Stat | None = None
    e2e_ms: Stat | None = None
    # output tokens of the successful requests; medians of the server's usage.prompt_tokens and
    # usage.prompt_tokens_details.cached_tokens
    output_tokens: int = 0
    input_tokens: float | None = None
    cached_tokens: float | None = None
    output_throughput_tps: float | None = None
    request_throughput_rps: float | None = None
    goodput_rps: float | None = None
    slo: SLO | None = None
    # mean over the successful requests: 1 when every chunk is one token
    tokens_per_chunk: float | None = None
    # speculative setups only (the server says it decodes speculatively)
    accept_length: float | None = None
    time_scale: float = 1.0
    # the engine-specific request fields were sent (the server took them)
    engine_fields: bool = True
    cache: Cache = "cold"
    # how the prompts went: detokenized text, ``w<id>`` words or token ids
    prompt: PromptMode = "text"
    repeats: int = 1  # measured phases pooled in the figures above (``--repeat``)
    # with repeats: each figure's mean over them and its 95 % t interval (ttft_p50_ms, tpot_p90_ms, output_tps, ...)
    intervals: dict[str, Interval] = Field(default_factory=dict)
    # every measured request in the order sent (phase after phase): send, first byte, first token, each chunk's
    # gap, end; the first one came right after whatever ran before the probe (the release's benchmark)
    samples: tuple[RequestResult, ...] = ()


class ProbeReport(Frozen):
    """Everything one probe run measured against one server."""

    base_url: str
    model: str
    api: Api
    time_scale: float = 1.0
    engine_fields: bool = True
    # how the prompts went (ids refused by the server: words); whether the server decodes speculatively (None: it does
    # not say)
    prompt: PromptMode = "text"
    speculative: bool | None = None
    cache: Cache = "cold"
    results: tuple[ProfileResult, ...] = ()

    @property
    def errors(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.results:
            for k, v in r.errors.items():
                out[k] = out.get(k, 0) + v
        return out
