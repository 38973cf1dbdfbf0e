"""The pinned definitions on hand-made streams; every expected number is worked out by hand here."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from agent.probe.measure import interpret, percentile, stat, summarise
from agent.probe.records import SLO, LoadShape, RequestResult
from tests.probe.streams import chat, event, exchange, text

USAGE4 = {"prompt_tokens": 12, "completion_tokens": 4, "total_tokens": 16,
          "prompt_tokens_details": {"cached_tokens": 8}}


def chat_stream() -> list[tuple[float, bytes]]:
    """Role-only first chunk, an empty delta, three content chunks around a keep-alive comment,
    a finish chunk with an empty delta, a usage-only last chunk, [DONE]."""
    return [
        (5, chat(role=True)),
        (7, chat("")),
        (10, chat("Hello")),
        (12, b": keep-alive\n\n"),
        (30, chat(" big world")),
        (40, chat("!")),
        (41, chat(finish="stop")),
        (42, chat(usage=USAGE4, choices=False)),
        (43, event(b"[DONE]")),
    ]


def test_role_only_empty_delta_and_usage_only_chunks_do_not_count():
    r = interpret(exchange(chat_stream(), end_ms=44))
    assert r.ok and r.error is None
    # TTFT: send -> "Hello" at 10 ms (not the role chunk at 5, not the empty delta at 7)
    assert r.ttft_ms == pytest.approx(10.0)
    assert r.e2e_ms == pytest.approx(44.0)  # end of the body
    assert r.output_tokens == 4  # usage.completion_tokens of the usage-only chunk
    assert r.tpot_ms == pytest.approx((44 - 10) / (4 - 1))  # 11.333 ms
    assert r.itl_ms == pytest.approx((20.0, 10.0))  # 10 -> 30 -> 40
    assert r.content_chunks == 3
    assert r.input_tokens == 12 and r.cached_tokens == 8
    assert r.accept_length is None  # content chunks carry no per-chunk usage


def test_multi_token_chunks_are_one_arrival_each_and_reveal_the_accept_length():
    """Speculative bursts with continuous usage: 1, then 3, 2 and 4 tokens per verify step."""
    reads = [(100, text("a", tokens=1)), (150, text(" b c d", tokens=4)), (200, text(" e f", tokens=6)),
             (250, text(" g h i j", tokens=10, finish="length")), (251, event({"choices": [], "usage": {
                 "prompt_tokens": 128, "completion_tokens": 10}})), (252, event(b"[DONE]"))]
    r = interpret(exchange(reads, end_ms=252))
    assert r.ok
    assert r.ttft_ms == pytest.approx(100.0)
    assert r.itl_ms == pytest.approx((50.0, 50.0, 50.0))  # one gap per chunk, whatever it carries
    assert r.tpot_ms == pytest.approx((252 - 100) / 9)  # 16.889 ms per token
    assert r.output_tokens == 10
    assert r.accept_length == pytest.approx((10 - 1) / 3)  # 9 tokens in 3 steps after the first chunk


def test_times_are_multiplied_by_the_time_scale():
    r = interpret(exchange(chat_stream(), end_ms=44), scale=50)
    assert r.ttft_ms == pytest.approx(500.0) and r.e2e_ms == pytest.approx(2200.0)
    assert r.tpot_ms == pytest.approx((2200 - 500) / 3)
    assert r.itl_ms == pytest.approx((1000.0, 500.0))


def test_an_event_completed_by_a_later_read_takes_that_reads_time():
    first = chat("Hi")
    r = interpret(exchange([(3, first[:9]), (8, first[9:]), (9, chat(finish="stop", usage={"completion_tokens": 1})),
                            (9, event(b"[DONE]"))], end_ms=9))
    assert r.ttft_ms == pytest.approx(8.0)
    assert r.output_tokens == 1 and r.tpot_ms is None and r.itl_ms == ()


def test_a_finish_reason_ends_a_stream_without_done():
    r = interpret(exchange([(10, chat("x y")), (11, chat(finish="length", usage={"completion_tokens": 2}))],
                           end_ms=12))
    assert r.ok and r.tpot_ms == pytest.approx(2.0)


def test_reasoning_content_is_generated_content():
    reads = [(5, event({"choices": [{"delta": {"reasoning_content": "think"}}]})), (9, chat("ok", finish="stop")),
             (9, chat(usage={"completion_tokens": 2}, choices=False))]
    r = interpret(exchange(reads, end_ms=10))
    assert r.ttft_ms == pytest.approx(5.0) and r.output_tokens == 2


@pytest.mark.parametrize(("reads", "end", "kind", "status"), [
    # HTTP status other than 200, with the server's message kept
    ([(1, b'{"detail":"Unexpected fields in the request: ignore_eos"}')], 1, "http_status", 422),
    # a 200 with no content chunk at all (role only, then [DONE])
    ([(5, chat(role=True)), (6, event(b"[DONE]"))], 6, "empty_response", 200),
    # a 200 whose only chunk is usage with empty text (and a finish_reason)
    ([(5, text("", tokens=0, finish="stop"))], 6, "empty_response", 200),
    # no usage anywhere and no tokenizer
    ([(5, chat("a b")), (6, chat(finish="stop")), (6, event(b"[DONE]"))], 7, "missing_usage", 200),
    # cut in the middle of an event (no transport error: the bytes just end)
    ([(5, chat("a")), (6, b'data: {"choices":[{"delta":{"cont')], 7, "broken_stream", 200),
    # ended at an event boundary, but without [DONE] or a finish_reason
    ([(5, chat("a", usage={"completion_tokens": 1}))], 7, "broken_stream", 200),
    # an event that is not JSON
    ([(5, chat("a")), (6, event(b"{oops")), (6, event(b"[DONE]"))], 7, "broken_stream", 200),
    # the server reports an error inside the stream
    ([(5, chat("a")), (6, event({"error": {"message": "out of memory", "code": 500}})), (6, event(b"[DONE]"))], 7,
     "stream_error", 200),
])
def test_error_kinds(reads, end, kind, status):
    r = interpret(exchange(reads, end_ms=end, status=status))
    assert not r.ok and r.error == kind and r.status == status
    assert r.ttft_ms is None and r.detail


def test_http_status_keeps_the_message():
    r = interpret(exchange([(1, b'{"error":{"message":"too long","code":400}}')], 1, status=400))
    assert r.detail == "HTTP 400: too long"


def test_transport_failures_keep_their_kind():
    assert interpret(exchange([], 0, status=None, error="connection", detail="refused")).error == "connection"
    t = interpret(exchange([(5, chat("a"))], 600_000, error="timeout", detail="no complete answer within 600 s"))
    assert t.error == "timeout" and t.status == 200 and t.content_chunks == 1
    b = interpret(exchange([(5, chat("a"))], 9, error="broken_stream", detail="reset"))
    assert b.error == "broken_stream"


def test_a_tokenizer_counts_when_the_server_sends_no_usage():
    reads = [(5, chat("a b")), (8, chat(" c d e")), (9, chat(finish="stop")), (9, event(b"[DONE]"))]
    r = interpret(exchange(reads, end_ms=9), tokenizer=lambda s: len(s.split()))
    assert r.ok and r.output_tokens == 5 and r.tpot_ms == pytest.approx((9 - 5) / 4)


def _req(ttft: float, tpot: float | None, e2e: float, n: int, itl: tuple[float, ...] = ()) -> RequestResult:
    return RequestResult(ok=True, ttft_ms=ttft, tpot_ms=tpot, e2e_ms=e2e, output_tokens=n, itl_ms=itl,
                         input_tokens=128, cached_tokens=0)


def test_summary_of_a_run_by_hand():
    results = [
        _req(10, 11, 120, 11, (5.0, 7.0)),
        _req(20, 9, 200, 21, (9.0,)),
        _req(40, 14, 180, 11, ()),
        RequestResult(ok=False, error="timeout", detail="slow"),
        RequestResult(ok=False, error="http_status", status=500, detail="HTTP 500: boom"),
    ]
    s = summarise(results, profile="128:128", prefill_len=128, input_len=128, output_len=100, api="completions",
                  load=LoadShape(), duration_s=2.0, slo=SLO(ttft_ms=30, tpot_ms=12))
    assert (s.requests, s.ok) == (5, 3)
    assert s.errors == {"timeout": 1, "http_status": 1}  # counted, never dropped
    assert s.error_details == ("timeout: slow", "http_status: HTTP 500: boom")
    # TTFT 10, 20, 40: p50 = 20; p90 at rank 1.8 = 20 + 0.8 * 20 = 36; p99 at rank 1.98 = 39.6; mean 23.33
    assert s.ttft_ms is not None
    assert (s.ttft_ms.p50, s.ttft_ms.p90, s.ttft_ms.p99) == pytest.approx((20.0, 36.0, 39.6))
    assert s.ttft_ms.mean == pytest.approx(70 / 3) and s.ttft_ms.n == 3
    # ITL pooled over requests: 5, 7, 9 -> p50 7
    assert s.itl_ms is not None and s.itl_ms.n == 3 and s.itl_ms.p50 == pytest.approx(7.0)
    assert s.output_tokens == 43
    assert s.output_throughput_tps == pytest.approx(43 / 2.0)
    assert s.request_throughput_rps == pytest.approx(3 / 2.0)
    # good: ttft <= 30 and tpot <= 12 -> the first two (the third has TTFT 40)
    assert s.goodput_rps == pytest.approx(2 / 2.0)
    assert s.input_tokens == 128 and s.cached_tokens == 0


def test_no_slo_no_goodput_and_a_one_token_answer_meets_the_tpot_objective():
    r = summarise([_req(10, 5, 20, 3)], profile="1:1", prefill_len=1, input_len=1, output_len=3, api="chat",
                  load=LoadShape(kind="concurrency", value=4), duration_s=1.0)
    assert r.goodput_rps is None
    one = RequestResult(ok=True, ttft_ms=10, e2e_ms=10, tpot_ms=None, output_tokens=1)
    assert SLO(tpot_ms=1).met(one) and not SLO(ttft_ms=5).met(one)
    assert not SLO(ttft_ms=100).met(RequestResult(ok=False, error="timeout"))


@given(st.lists(st.floats(min_value=-1e6, max_value=1e6, allow_nan=False), min_size=1, max_size=50),
       st.floats(min_value=0, max_value=1))
def test_percentile_is_numpys_linear_default(values, q):
    assert percentile(sorted(values), q) == pytest.approx(float(np.percentile(values, q * 100)), abs=1e-6)


def test_stat_of_nothing_is_none_and_of_one_is_that_value():
    assert stat([]) is None
    s = stat([3.0])
    assert s is not None and (s.p50, s.p99, s.mean) == (3.0, 3.0, 3.0)
    four = stat([1.0, 2.0, 3.0, 4.0])
    assert four is not None and math.isclose(four.p50, 2.5)


@pytest.mark.parametrize(("text_", "ok"), [("ttft_ms=500,tpot_ms=50", True), ("e2e_ms=1", True), ("foo=1", False),
                                          ("ttft_ms=x", False), ("", False)])
def test_slo_parsing(text_, ok):
    if ok:
        assert str(SLO.parse(text_)) == text_
    else:
        with pytest.raises(ValueError):
            SLO.parse(text_)


def _merged(tokens_per_chunk: int) -> RequestResult:
    """Ten tokens in chunks of ``tokens_per_chunk`` with continuous usage (a server that merges tokens)."""
    reads: list[tuple[float, bytes]] = []
    n, t = 0, 100
    while n < 10:
        k = min(tokens_per_chunk, 10 - n)
        n += k
        reads.append((t, text(" w" * k, tokens=n, finish="length" if n == 10 else None)))
        t += 50
    reads.append((t, event(b"[DONE]")))
    return interpret(exchange(reads, end_ms=t))


def test_accept_length_only_where_the_server_decodes_speculatively_tokens_per_chunk_always():
    merged = [_merged(2), _merged(2)]
    kw: dict[str, Any] = {"profile": "128:128", "prefill_len": 128, "input_len": 128, "output_len": 10,
                          "api": "completions", "load": LoadShape(), "duration_s": 1.0}
    plain = summarise(merged, **kw, speculative=False)
    assert plain.accept_length is None and plain.tokens_per_chunk == pytest.approx(2.0)
    unknown = summarise(merged, **kw)
    assert unknown.accept_length is None and unknown.tokens_per_chunk == pytest.approx(2.0)
    spec = summarise(merged, **kw, speculative=True)
    assert spec.accept_length == pytest.approx(2.0) and spec.tokens_per_chunk == pytest.approx(2.0)
    assert _merged(1).tokens_per_chunk == 1.0
