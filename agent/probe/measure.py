"""The probe's pinned metric definitions (pure: bytes and times in, figures out).

One request is an :class:`Exchange`: the HTTP status and the body's bytes, each read
stamped with the nanoseconds since the send instant (the transport fills it; tests make
it by hand). :func:`interpret` turns it into a :class:`RequestResult`; :func:`summarise`
turns the measured requests of one run into a :class:`ProfileResult`. docs/concepts/probe.md
states the same definitions:

- a *content chunk* is an SSE event carrying non-empty generated text (``choices[].text``,
  ``choices[].delta.content`` or ``delta.reasoning_content``); role-only, empty-delta and
  usage-only events are not content chunks. An event's time is the arrival of the read
  that completed it;
- TTFT = first content chunk - send;
- E2E = end of the response body - send;
- ITL = gaps between consecutive content chunks. A chunk carrying k tokens is one
  arrival: it adds one gap (the wait for it), not k. Percentiles of ITL are over the gaps
  of all successful requests of the run, pooled, unweighted;
- output tokens = the server's ``usage.completion_tokens`` (the last one sent); without
  usage the request fails with ``missing_usage`` unless a tokenizer is given, which then
  counts the generated text;
- TPOT = (E2E - TTFT) / (output tokens - 1) (none for a one-token answer);
- tokens per chunk = output tokens / content chunks (1 when the server streams token by token);
- accept length = mean tokens per content chunk after the first, when every content
  chunk carries a cumulative ``usage.completion_tokens`` (continuous usage), reported only for
  a server that decodes speculatively: with one chunk per verify step, the accepted draft tokens + 1;
- output throughput = output tokens of the successful requests / duration; request
  throughput = successful requests / duration; goodput = successful requests meeting
  every SLO / duration. Duration: first send to last end of the measured phase;
- percentiles: linear interpolation between closest ranks (numpy's default); p50, p90, p99.

Every duration is multiplied by the time scale (1 for a real server; N for a simulated
server running N times faster), so figures are in the server's own clock.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.probe.records import (
    SLO,
    Api,
    Cache,
    ErrorKind,
    LoadShape,
    ProfileResult,
    RequestResult,
    Stat,
)
from agent.probe.sse import SSEParser

Tokenizer = Callable[[str], int]  # generated text -> its token count
_DETAILS_KEPT = 5


@dataclass(slots=True)
class Exchange:
    """One HTTP exchange as the transport saw it; times in ns after the send instant."""

    status: int | None = None
    # reads: body bytes as they arrived (de-chunked); head_ns: the status line arrived (the answer's first byte);
    # end_ns: the body ended (or the exchange failed); error: the transport's failure (timeout, connection,
    # broken_stream)
    reads: list[tuple[int, bytes]] = field(default_factory=list)
    head_ns: int | None = None
    end_ns: int = 0
    error: ErrorKind | None = None
    detail: str = ""


@dataclass(slots=True)
class _Chunk:
    t_ns: int
    text: str
    tokens: int | None  # cumulative usage.completion_tokens carried by this event


def _fail(kind: ErrorKind, detail: str, status: int | None = None, **kw: Any) -> RequestResult:
    return RequestResult(ok=False, error=kind, detail=detail[:300], status=status, **kw)


def _text_of(choice: Any) -> str:
    if not isinstance(choice, dict):
        return ""
    parts: list[str] = []
    text = choice.get("text")
    if isinstance(text, str):
        parts.append(text)
    delta = choice.get("delta")
    if isinstance(delta, dict):
        for name in ("content", "reasoning_content", "reasoning"):
            v = delta.get(name)
            if isinstance(v, str):
                parts.append(v)
    return "".join(parts)


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _error_message(body: bytes) -> str:
    text = body.decode("utf-8", "replace").strip()
    try:
        obj = json.loads(text)
    except ValueError:
        return text[:200]
    if isinstance(obj, dict):
        err = obj.get("error", obj.get("detail", obj))
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])[:200]
        return json.dumps(err)[:200]
    return text[:200]


@dataclass(slots=True)
class _Stream:
    """What the events of one response said, in order: its content chunks, whether it ended ([DONE], a
    finish_reason), the last usage figures, and the first problem of an event."""

    chunks: list[_Chunk] = field(default_factory=list)
    done: bool = False
    finished: bool = False
    usage_tokens: int | None = None
    prompt_tokens: int | None = None
    cached: int | None = None
    problem: tuple[ErrorKind, str] | None = None

    def take(self, data: str, t_ns: int) -> None:
        """One event's data, completed by the read at ``t_ns``."""
        if data.strip() == "[DONE]":
            self.done = True
            return
        try:
            obj = json.loads(data)
        except ValueError:
            self.problem = self.problem or ("broken_stream", f"an event is not JSON: {data[:80]!r}")
            return
        if not isinstance(obj, dict):
            self.problem = self.problem or ("broken_stream", f"an event is not a JSON object: {data[:80]!r}")
            return
        if obj.get("error") is not None and not obj.get("choices"):
            self.problem = self.problem or ("stream_error",
                                            f"the server sent an error: {_error_message(data.encode())}")
            return
        choices = obj.get("choices") or ()
        text = "".join(_text_of(c) for c in choices) if isinstance(choices, list) else ""
        if isinstance(choices, list) and any(isinstance(c, dict) and c.get("finish_reason") for c in choices):
            self.finished = True
        usage = obj.get("usage")
        tokens = None
        if isinstance(usage, dict):
            tokens = _int(usage.get("completion_tokens"))
            if tokens is not None:
                self.usage_tokens = tokens
            self.prompt_tokens = _int(usage.get("prompt_tokens")) if "prompt_tokens" in usage else self.prompt_tokens
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict) and _int(details.get("cached_tokens")) is not None:
                self.cached = _int(details.get("cached_tokens"))
        if text:
            self.chunks.append(_Chunk(t_ns, text, tokens))


def _read_stream(ex: Exchange) -> tuple[_Stream, int]:
    """The events of ``ex``'s body, each at the read that completed it (those its end completes: at the end); and
    how many bytes of an event the body's end cut (0: none)."""
    parser = SSEParser()
    st = _Stream()
    for t_ns, data in ex.reads:
        for ev in parser.feed(data):
            st.take(ev.data, t_ns)
    pending, cut = parser.close()
    for ev in pending:
        st.take(ev.data, ex.end_ns)
    return st, cut


def _stream_failure(ex: Exchange, st: _Stream, cut: int, counted: bool) -> tuple[ErrorKind, str] | None:
    """Why an HTTP 200 stream failed (the first reason, in the order of the docs' definitions), or None.
    ``counted``: output tokens can be counted without usage (a tokenizer)."""
    if ex.error is not None:
        return ex.error, ex.detail or "the stream broke"
    if st.problem is not None:
        return st.problem
    if cut:
        return "broken_stream", f"the stream was cut in the middle of an event ({cut} bytes)"
    if not st.chunks:
        if not st.done and not st.finished:
            return "broken_stream", "the stream ended without content, [DONE] or a finish_reason"
        return "empty_response", "HTTP 200 without any generated content"
    if not st.done and not st.finished:
        return "broken_stream", "the stream ended without [DONE] or a finish_reason"
    if st.usage_tokens is None and not counted:
        return "missing_usage", "no usage.completion_tokens in the stream (and no tokenizer)"
    return None


def _figures(ex: Exchange, chunks: list[_Chunk], n: int, scale: float, extra: dict[str, Any]) -> RequestResult:
    """The figures of a request that succeeded: ``n`` output tokens over ``chunks`` (times scaled by ``scale``)."""
    ms = scale / 1e6
    ttft = chunks[0].t_ns * ms
    e2e = ex.end_ns * ms
    tpot = (e2e - ttft) / (n - 1) if n > 1 else None
    itl = tuple((b.t_ns - a.t_ns) * ms for a, b in zip(chunks, chunks[1:], strict=False))
    accept = None
    per_chunk = n / len(chunks)
    if len(chunks) > 1 and all(c.tokens is not None for c in chunks):
        after = (chunks[-1].tokens or 0) - (chunks[0].tokens or 0)
        accept = after / (len(chunks) - 1)
    return RequestResult(ok=True, ttft_ms=ttft, e2e_ms=e2e, tpot_ms=tpot, itl_ms=itl, output_tokens=n,
                         tokens_per_chunk=per_chunk, accept_length=accept, **extra)


def interpret(ex: Exchange, *, scale: float = 1.0, tokenizer: Tokenizer | None = None, index: int = 0,
              start_s: float = 0.0) -> RequestResult:
    """The figures of one request, or the kind of error that made it fail (never dropped)."""
    base: dict[str, Any] = {"index": index, "start_s": start_s,
                            "first_byte_ms": None if ex.head_ns is None else ex.head_ns * scale / 1e6}
    if ex.status is None:
        return _fail(ex.error or "connection", ex.detail or "no HTTP answer", **base)
    if ex.status != 200:
        body = b"".join(d for _, d in ex.reads)
        return _fail("http_status", f"HTTP {ex.status}: {_error_message(body)}", ex.status, **base)
    st, cut = _read_stream(ex)
    extra: dict[str, Any] = {**base, "status": 200, "content_chunks": len(st.chunks), "input_tokens": st.prompt_tokens,
                             "cached_tokens": st.cached}
    failure = _stream_failure(ex, st, cut, counted=tokenizer is not None)
    if failure is not None:
        return _fail(failure[0], failure[1], **extra)
    n = st.usage_tokens
    if n is None:
        assert tokenizer is not None  # _stream_failure: missing_usage otherwise
        n = tokenizer("".join(c.text for c in st.chunks))
    return _figures(ex, st.chunks, n, scale, extra)


def percentile(ordered: Sequence[float], q: float) -> float:
    """The q-quantile (0..1) of sorted values, linear between closest ranks (numpy's default)."""
    if not ordered:
        raise ValueError("percentile of nothing")
    pos = (len(ordered) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def stat(values: Sequence[float]) -> Stat | None:
    if not values:
        return None
    s = sorted(values)
    return Stat(n=len(s), mean=sum(s) / len(s), p50=percentile(s, 0.5), p90=percentile(s, 0.9),
                p99=percentile(s, 0.99))


def _median(values: list[float]) -> float | None:
    return percentile(sorted(values), 0.5) if values else None


def summarise(results: Sequence[RequestResult], *, profile: str, prefill_len: int, input_len: int, output_len: int,
              api: Api, load: LoadShape, duration_s: float, slo: SLO | None = None, time_scale: float = 1.0,
              engine_fields: bool = True, speculative: bool | None = None, cache: Cache = "cold") -> ProfileResult:
    """The figures of one measured phase; every request is counted, failed ones by kind. The accept length
    only where the server decodes speculatively (``speculative``): elsewhere tokens per chunk say how a
    server merges tokens, and that is no acceptance."""
    good = [r for r in results if r.ok]
    errors: dict[str, int] = {}
    details: list[str] = []
    for r in results:
        if not r.ok:
            kind = r.error or "connection"
            errors[kind] = errors.get(kind, 0) + 1
            if len(details) < _DETAILS_KEPT:
                details.append(f"{kind}: {r.detail}")
    tokens = sum(r.output_tokens or 0 for r in good)
    per_s = (lambda x: x / duration_s) if duration_s > 0 else (lambda x: None)
    accepts = [r.accept_length for r in good if r.accept_length is not None] if speculative else []
    per_chunk = [r.tokens_per_chunk for r in good if r.tokens_per_chunk is not None]
    return ProfileResult(
        profile=profile, prefill_len=prefill_len, input_len=input_len, output_len=output_len, api=api, load=load,
        requests=len(results), ok=len(good), errors=errors, error_details=tuple(details), duration_s=duration_s,
        ttft_ms=stat([r.ttft_ms for r in good if r.ttft_ms is not None]),
        tpot_ms=stat([r.tpot_ms for r in good if r.tpot_ms is not None]),
        itl_ms=stat([g for r in good for g in r.itl_ms]),
        e2e_ms=stat([r.e2e_ms for r in good if r.e2e_ms is not None]),
        output_tokens=tokens,
        input_tokens=_median([float(r.input_tokens) for r in good if r.input_tokens is not None]),
        cached_tokens=_median([float(r.cached_tokens) for r in good if r.cached_tokens is not None]),
        output_throughput_tps=per_s(tokens) if good else None,
        request_throughput_rps=per_s(len(good)) if results else None,
        goodput_rps=per_s(sum(1 for r in good if slo.met(r))) if slo is not None and results else None,
        slo=slo, tokens_per_chunk=sum(per_chunk) / len(per_chunk) if per_chunk else None,
        accept_length=sum(accepts) / len(accepts) if accepts else None, time_scale=time_scale,
        engine_fields=engine_fields, cache=cache,
    )
