"""The SLO sweep's pure parts: the SLO, the steady-state window, a level's figures, the next level and the stop."""

from __future__ import annotations

import pytest

from agent.probe.records import RequestResult
from agent.probe.sweep import Level, SweepConfig, SweepSLO, capacity, level, next_level, requests_for, steady_window

SLO = SweepSLO.parse("ttft_p90_ms=1000,tpot_p90_ms=50")


def _req(i: int, ttft: float = 500.0, tpot: float = 40.0, start: float = 0.0, ok: bool = True) -> RequestResult:
    e2e = ttft + 99 * tpot
    return RequestResult(index=i, ok=ok, ttft_ms=ttft if ok else None, tpot_ms=tpot if ok else None,
                         e2e_ms=e2e if ok else None, start_s=start, output_tokens=100 if ok else None,
                         error=None if ok else "timeout")


def _lv(c: int, met: bool, tps: float, wall: float = 10.0) -> Level:
    return Level(concurrency=c, sent=requests_for(c, 8), window=max(8, c), ok=max(8, c), output_tps=tps,
                 wall_s=wall, met=met)


def test_slo_parses_percentile_objectives_and_names_a_bad_one():
    assert SLO.limits == (("ttft_p90_ms", 1000.0), ("tpot_p90_ms", 50.0))
    assert str(SLO) == "ttft_p90_ms=1000,tpot_p90_ms=50"
    for bad, words in (("ttft_ms=5", "FIGURE_pQ_ms"), ("ttft_p95_ms=5", "pQ one of"), ("tpot_p90_ms=x", "not a number"),
                       ("tpot_p90_ms=0", "positive"), ("", "at least one")):
        with pytest.raises(ValueError, match=words):
            SweepSLO.parse(bad)


def test_steady_window_leaves_out_the_ramp_up_and_the_drain_by_send_order():
    reqs = [_req(i) for i in (5, 0, 3, 1, 4, 2, 6, 7, 8, 9)]
    assert [r.index for r in steady_window(reqs, 3)] == [3, 4, 5, 6]
    assert requests_for(1, 8) == 10 and requests_for(16, 8) == 48


def test_a_level_takes_its_figures_from_the_window_and_meets_the_slo_only_when_all_succeeded():
    ramp = [_req(i, ttft=5000.0) for i in range(2)]  # the first two queue their prefills at once: left out
    window = [_req(2 + i, ttft=400.0 + 10 * i, start=i * 1.0) for i in range(10)]
    drain = [_req(12 + i, ttft=5000.0) for i in range(2)]
    lv = level(ramp + window + drain, 2, SLO, wall_s=3.0)
    assert (lv.concurrency, lv.sent, lv.window, lv.ok) == (2, 14, 10, 10)
    assert lv.figures["ttft_p90_ms"] == pytest.approx(400 + 10 * 8.1)  # 9 x 0.9 = rank 8.1
    assert lv.met
    e2e_s = sum(400.0 + 10 * i + 99 * 40.0 for i in range(10)) / 10 / 1000  # mean E2E of the window
    assert lv.request_rps == pytest.approx(2 / e2e_s)  # Little's law: 2 in flight, each e2e_s long
    assert lv.output_tps == pytest.approx(2 / e2e_s * 100)
    failed = level(ramp + window[:-1] + [_req(11, ok=False)] + drain, 2, SLO, wall_s=3.0)
    assert failed.ok == 9 and not failed.met


def test_levels_double_until_the_slo_breaks_then_bisect_then_stop():
    cfg = SweepConfig(slo=SLO, budget_s=1e6)
    assert next_level([], cfg, 0) == 1
    levels = [_lv(1, True, 10), _lv(2, True, 19), _lv(4, True, 35), _lv(8, True, 60), _lv(16, False, 90)]
    assert next_level(levels, cfg, 0) == 12
    levels.append(_lv(12, True, 80))
    assert next_level(levels, cfg, 0) == 14
    levels.append(_lv(14, False, 85))
    assert next_level(levels, cfg, 0) == "slo"  # 12 met, 14 broke: within 25 % of 12
    best = capacity(levels)
    assert best is not None and best.concurrency == 12
    fine = cfg.model_copy(update={"resolution": 0.01})
    assert next_level(levels, fine, 0) == 13


def test_stops_when_throughput_stops_rising_or_the_budget_or_the_largest_level():
    cfg = SweepConfig(slo=SLO, budget_s=100.0, max_concurrency=4)
    flat = [_lv(1, True, 10), _lv(2, True, 19), _lv(4, True, 19.5)]
    assert next_level(flat, cfg.model_copy(update={"max_concurrency": 64}), 0) == "saturated"
    assert next_level([_lv(1, True, 10), _lv(2, True, 19), _lv(4, True, 35)], cfg, 0) == "max_load"
    assert next_level([_lv(1, True, 10, wall=30.0)], cfg, 50.0) == 2  # level 2: ~36 s more, within 100
    assert next_level([_lv(1, True, 10, wall=30.0)], cfg, 70.0) == "budget"
    assert next_level([_lv(1, False, 10)], cfg, 0) == "slo"
    assert capacity([_lv(1, False, 10)]) is None
