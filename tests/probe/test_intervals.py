"""Repeated probe runs: each figure with its 95 % Student t interval over the repeats."""

from __future__ import annotations

import asyncio
import math

import pytest

from agent.probe.compare import probe_row
from agent.probe.intervals import t975, t_interval
from agent.probe.runner import ProbeConfig, probe_async
from tests.probe.fakeserver import FakeServer


def test_t_interval_by_hand():
    iv = t_interval([10.0, 12.0, 14.0])  # mean 12, sd 2, t(0.975, 2) = 4.303
    assert iv is not None and iv.n == 3 and iv.mean == pytest.approx(12.0)
    assert (iv.low, iv.high) == pytest.approx((12 - 4.303 * 2 / math.sqrt(3), 12 + 4.303 * 2 / math.sqrt(3)))
    assert t_interval([5.0]) is None


def test_t_quantiles_from_the_table_and_past_it():
    assert t975(1) == 12.706 and t975(30) == 2.042
    assert t975(40) == pytest.approx(2.021, abs=0.001) and t975(120) == pytest.approx(1.980, abs=0.001)
    with pytest.raises(ValueError):
        t975(0)


def test_a_repeated_profile_pools_its_requests_and_gives_each_figure_an_interval():
    async def go():
        async with FakeServer(tokens=5, gap_s=0.002) as srv:
            return await probe_async(ProbeConfig(base_url=srv.url, requests=4, warmup=0, repeat=3)), srv

    report, srv = asyncio.run(go())
    (r,) = report.results
    assert (r.repeats, r.requests, r.ok) == (3, 12, 12)
    assert len(srv.generations) == 12
    assert set(r.intervals) == {"ttft_p50_ms", "ttft_p90_ms", "tpot_p50_ms", "tpot_p90_ms", "e2e_p50_ms",
                                "e2e_p90_ms", "output_tps"}
    for iv in r.intervals.values():
        assert iv.n == 3 and iv.low <= iv.mean <= iv.high
    extra = probe_row(r).extra
    assert extra["probe_repeats"] == "3"
    low, high = (float(x) for x in extra["ttft_p50_ms_ci95"].split(","))
    assert low == pytest.approx(r.intervals["ttft_p50_ms"].low, rel=1e-5)
    assert high == pytest.approx(r.intervals["ttft_p50_ms"].high, rel=1e-5)
