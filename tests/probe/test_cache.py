"""Cold by default: prompts salted per run, so a server's prefix cache holds nothing of them (issue 29).

Against a loopback server with a radix-style prefix cache that answers with a real server's recorded
stream (``transformers serve``): two consecutive probe runs measure the same cold TTFT; ``cache="warm"``
measures the cached prompt and says so.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agent.probe.compare import probe_row
from agent.probe.runner import ProbeConfig, probe_async
from tests.probe.fakeserver import FakeServer
from tests.probe.streams import recorded


def _replay() -> list[bytes]:
    return [e.removeprefix(b"data: ").strip() for e in recorded()["completions"]]


async def _runs(n: int, **kw: Any) -> tuple[FakeServer, list]:
    async with FakeServer(prefix_cache=True, prefill_s=0.0004, replay=_replay(), gap_s=0.0005) as srv:
        cfg = ProbeConfig(base_url=srv.url, profiles=("128:128",), requests=3, warmup=0, **kw)
        return srv, [await probe_async(cfg) for _ in range(n)]


def test_two_consecutive_runs_find_nothing_cached_and_measure_the_same_ttft():
    srv, (first, second) = asyncio.run(_runs(2))
    a, b = first.results[0], second.results[0]
    assert (a.ok, b.ok) == (3, 3)
    assert a.cached_tokens == 0 and b.cached_tokens == 0  # the second run's prompts are its own
    assert a.cache == b.cache == "cold"
    assert b.ttft_ms.p50 == pytest.approx(a.ttft_ms.p50, rel=0.5)  # 128 x 0.4 ms of prefill both times
    assert min(a.ttft_ms.p50, b.ttft_ms.p50) >= 128 * 0.4 * 0.9
    # no two prompts share even their first two tokens (ids drawn from 29,000: two prompts of six share the first
    # one by chance once in ~2,000 runs, which make test met; the first two, once in ~60 million)
    assert len({tuple(p[:2]) for p in srv.prompts}) == 6


def test_the_same_salt_gives_the_same_prompts_and_a_warm_cache():
    _, (first, second) = asyncio.run(_runs(2, salt="fixed"))
    assert first.results[0].cached_tokens == 0 and second.results[0].cached_tokens == 127


def test_warm_measures_each_prompt_after_it_was_sent_once_and_labels_the_row():
    srv, (warm,) = asyncio.run(_runs(1, cache="warm"))
    r = warm.results[0]
    assert r.cache == "warm" and r.cached_tokens == 127
    assert len(srv.generations) == 6  # each measured prompt sent once before (one output token)
    assert [g.body["max_tokens"] for g in srv.generations] == [1, 100] * 3
    assert r.ttft_ms.p50 < 128 * 0.4 * 0.5  # a cached prompt: little left to prefill
    assert probe_row(r).extra["probe_cache"] == "warm"
