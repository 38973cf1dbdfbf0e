"""The definitions on streams recorded from a real server (``transformers serve`` on an H200).

The recording kept the bytes, not the times; each test gives the events arrival times and
works out the figures by hand.
"""

from __future__ import annotations

import pytest

from agent.probe.measure import interpret, summarise
from agent.probe.prompts import rejects_engine_fields
from agent.probe.records import SLO, LoadShape
from tests.probe.streams import exchange, peers, recorded


def test_recorded_chat_stream_role_first_eight_tokens_in_one_chunk_usage_last_no_done():
    events = recorded()["chat"]
    assert len(events) == 3
    # role-only at 4 ms, the eight-token content chunk at 15 ms, the usage chunk at 16 ms
    r = interpret(exchange(list(zip((4.0, 15.0, 16.0), events, strict=True)), end_ms=16.5))
    assert r.ok, r.detail
    assert r.ttft_ms == pytest.approx(15.0)  # the role-only chunk at 4 ms does not count
    assert r.output_tokens == 8  # from usage: the text is eight newlines in one chunk
    assert r.content_chunks == 1 and r.itl_ms == ()  # one arrival of eight tokens: no gap at all
    assert r.tpot_ms == pytest.approx((16.5 - 15.0) / 7)
    assert r.input_tokens == 23
    assert r.accept_length is None


def test_recorded_completions_stream_usage_only_last_chunk_with_empty_text():
    events = recorded()["completions"]
    assert len(events) == 9
    times = [10.0 + 5 * i for i in range(8)] + [50.0]  # eight content chunks 5 ms apart, then usage
    r = interpret(exchange(list(zip(times, events, strict=True)), end_ms=51.0))
    assert r.ok, r.detail
    assert r.ttft_ms == pytest.approx(10.0)
    assert r.content_chunks == 8  # the last chunk's text is "": not content
    assert r.itl_ms == pytest.approx((5.0,) * 7)
    assert r.output_tokens == 8 and r.input_tokens == 4
    assert r.tpot_ms == pytest.approx((51.0 - 10.0) / 7)


def test_recorded_stream_fed_in_arbitrary_reads_gives_the_same_figures():
    data = b"".join(recorded()["completions"])
    reads = [(10.0 + i, data[i * 97:(i + 1) * 97]) for i in range(len(data) // 97 + 1)]
    r = interpret(exchange(reads, end_ms=40.0))
    first = data.index(b'" fox"') // 97  # the read that completes the first event
    first_end = data.index(b"\n\n") // 97
    assert r.ok and r.ttft_ms == pytest.approx(10.0 + max(first, first_end))
    assert r.output_tokens == 8


def test_the_recorded_422_for_ignore_eos_means_retry_without_engine_fields():
    assert rejects_engine_fields(422, '{"detail":"Unexpected fields in the request"}')
    assert rejects_engine_fields(400, "Unrecognized request argument supplied: ignore_eos")
    assert not rejects_engine_fields(400, "requested 16000 prompt tokens + 100 = more than max-total-tokens=16384")
    assert not rejects_engine_fields(500, "ignore_eos")


@pytest.mark.parametrize("peer", peers(), ids=lambda p: f"in{p['input']}-{p['latency_ms']}")
def test_tpot_formula_matches_the_recorded_peer_client(peer):
    """A peer client's figures on that server: TPOT = (E2E - TTFT)/(n - 1) reproduces its TPOT.

    Three of the four recorded lines agree to the printed digits; the one with a 2000-word
    prompt is 0.2 % off its own formula ((577.3 - 76.89) / 99 = 5.055, printed 5.065).
    """
    n = int(peer["output_len"])
    ttft, e2e = peer["ttft_ms"], peer["latency_ms"]
    step = (e2e - ttft) / (n - 1)
    reads = [(ttft + i * step, b'data: {"choices":[{"text":" t"}]}\n\n') for i in range(n)]
    reads.append((e2e, b'data: {"choices":[{"text":"","finish_reason":"length"}],"usage":{"completion_tokens":'
                       + str(n).encode() + b"}}\n\n"))
    r = interpret(exchange(reads, end_ms=e2e))
    assert r.ok and r.output_tokens == n
    assert r.ttft_ms == pytest.approx(ttft, abs=1e-6)
    assert r.tpot_ms == pytest.approx(peer["tpot_ms"], rel=0.003)


def test_run_figures_from_the_two_recorded_requests():
    """Both recorded requests as one run of 100 ms: every summary figure worked out by hand."""
    chat_events, text_events = recorded()["chat"], recorded()["completions"]
    chat = interpret(exchange(list(zip((4.0, 15.0, 16.0), chat_events, strict=True)), end_ms=16.5))
    text = interpret(exchange(list(zip([10.0 + 5 * i for i in range(8)] + [50.0], text_events, strict=True)),
                              end_ms=51.0), index=1, start_s=0.02)
    s = summarise([chat, text], profile="4:4", prefill_len=4, input_len=4, output_len=8, api="chat",
                  load=LoadShape(), duration_s=0.1, slo=SLO(ttft_ms=12))
    assert (s.requests, s.ok, s.errors) == (2, 2, {})
    assert s.ttft_ms is not None and s.ttft_ms.p50 == pytest.approx((15.0 + 10.0) / 2)  # p50 of two: their mean
    assert s.ttft_ms.p90 == pytest.approx(10.0 + 0.9 * 5.0)
    assert s.e2e_ms is not None and s.e2e_ms.p50 == pytest.approx((16.5 + 51.0) / 2)
    assert s.tpot_ms is not None and s.tpot_ms.p50 == pytest.approx(((16.5 - 15.0) / 7 + (51.0 - 10.0) / 7) / 2)
    assert s.itl_ms is not None and s.itl_ms.n == 7 and s.itl_ms.p99 == pytest.approx(5.0)  # the chat adds none
    assert s.output_tokens == 16
    assert s.output_throughput_tps == pytest.approx(16 / 0.1)
    assert s.request_throughput_rps == pytest.approx(2 / 0.1)
    assert s.goodput_rps == pytest.approx(1 / 0.1)  # only the completions request's TTFT (10 ms) is <= 12 ms
    assert s.input_tokens == pytest.approx((23 + 4) / 2) and s.accept_length is None
