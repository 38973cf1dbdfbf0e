"""Probe rows and the cross-check with the release's rows, by hand."""

from __future__ import annotations

import math
import statistics
from typing import Any

import pytest
from scipy import stats

from agent.probe.compare import FLAG, cross_check, probe_row
from agent.probe.intervals import t9995, t_interval
from agent.probe.records import LoadShape, ProfileResult, RequestResult, Stat
from contract.records import ResultRow


def release_row(profile: str = "128:128", **kw: float) -> ResultRow:
    values: dict[str, Any] = {"ttft_ms": 2000.0, "tpot_ms": 40.0, "prefill_tps": 64.0, "decode_tps": 25.0, **kw}
    return ResultRow(run_id="r", module="m1", release="1.4.2", model_key="qwen3", table="sweep", profile=profile,
                     model="Qwen3", size="30b_a3b", prefill_len=128, ctx_k=16, batch=1, nchip=1, input_tokens=128,
                     output_tokens=100, **values)


def result(ttft: float = 2000.0, tpot: float = 40.0, **kw: object) -> ProfileResult:
    def s(v: float) -> Stat:
        return Stat(n=3, mean=v, p50=v, p90=v * 1.1, p99=v * 1.2)
    values: dict[str, Any] = {
        "profile": "128:128", "prefill_len": 128, "input_len": 128, "output_len": 100, "api": "completions",
        "load": LoadShape(), "requests": 3, "ok": 3, "ttft_ms": s(ttft), "tpot_ms": s(tpot), "e2e_ms": s(6000),
        "output_tokens": 300, "cached_tokens": 0.0, "output_throughput_tps": 16.6, "time_scale": 50.0}
    values.update(kw)
    return ProfileResult(**values)


def test_a_probe_row_has_the_release_rows_identity_and_the_seeds_definitions():
    p = probe_row(result(ttft=2000.0, tpot=40.0), release_row())
    assert p.source == "probe"
    assert p.identity == ("r", "m1", "qwen3", "128:128", "probe")
    assert p.identity[:4] == release_row().identity[:4] and release_row().identity[4] == "release"
    assert (p.model, p.size, p.ctx_k, p.nchip, p.batch) == ("Qwen3", "30b_a3b", 16, 1, 1)
    assert p.ttft_ms == 2000.0 and p.tpot_ms == 40.0
    assert p.prefill_tps == pytest.approx(128 / 2000 * 1000)  # 64 tok/s
    assert p.decode_tps == pytest.approx(25.0)  # 1000 / 40 ms
    assert p.measured_output == 100 and p.prefix_tokens == 0
    assert p.extra["ttft_p90_ms"] == "2200" and p.extra["probe_requests"] == "3"
    assert p.extra["probe_time_scale"] == "50" and p.flags == ()


def test_a_probe_row_with_errors_says_so():
    p = probe_row(result(ok=2, errors={"timeout": 1}), release_row())
    assert p.flags == ("probe_errors",) and p.extra["probe_errors"] == "timeout=1"


def sampled(ttfts: list[float], tpot: float = 40.0, **kw: object) -> ProfileResult:
    """A probe result with these requests' TTFTs in the order sent (the first right after the release)."""
    samples = tuple(RequestResult(index=i, ok=True, ttft_ms=v, tpot_ms=tpot, e2e_ms=v + 99 * tpot, output_tokens=100,
                                  first_byte_ms=v / 2) for i, v in enumerate(ttfts))
    return result(ttft=statistics.median(ttfts), tpot=tpot, samples=samples, requests=len(ttfts), ok=len(ttfts),
                  **kw)


def test_a_release_figure_beyond_the_measured_noise_is_flagged_and_says_which_moved():
    r = sampled([100.0, 100.5, 99.5, 100.0, 100.2])  # quiet: sd 0.41 ms over the 4 usual requests
    rel = [release_row(ttft_ms=120.0, prefill_tps=128 / 120 * 1000, tpot_ms=40.0, decode_tps=25.0),
           release_row("250:250")]
    rows, found, notes = cross_check(rel, [r])
    assert rows[0].flags == (FLAG,) and rows[1].flags == () and notes == []
    assert [d.metric for d in found] == ["ttft_ms", "prefill_tps"]
    d = found[0]
    assert d.release == 120.0 and d.probe == 100.0 and d.change == pytest.approx(0.2)
    # band: t(0.9995, 3) x sd x sqrt(1.5708 / 4 + 0.5) + max(0.5 ms, 2 % of 100 ms)
    sd = statistics.stdev([100.5, 99.5, 100.0, 100.2])
    band = stats.t.ppf(0.9995, 3) * sd * math.sqrt(math.pi / 2 / 4 + 0.5) + 2.0
    assert d.noise == pytest.approx(band / 100, rel=1e-4)
    assert "the release moved: its figure is outside every usual probe request (99.5-100.5 ms)" in d.why
    assert f"beyond the noise band of +-{band:.3g} ms (4 requests" in d.why
    assert d.one_line().startswith(f"qwen3 128:128 ttft_ms: release 120, probe 100 (+20.0%): TTFT {20 - band:.3g} ms")


def test_within_the_measured_noise_nothing_is_flagged_however_far_from_five_percent():
    noisy = sampled([100.0, 97.0, 103.0, 100.0, 98.0, 102.0])  # sd 2.5 ms: a band of about +-22 ms
    rows, found, _ = cross_check([release_row(ttft_ms=115.0, prefill_tps=128 / 115 * 1000)], [noisy])
    assert found == [] and rows[0].flags == ()  # +15 %: within the noise of both clients
    rows, found, _ = cross_check([release_row(ttft_ms=125.0, prefill_tps=128 / 125 * 1000)], [noisy])
    assert rows[0].flags == (FLAG,)
    quiet = sampled([100.0, 100.02, 99.98, 100.0, 100.01, 99.99])
    rows, found, _ = cross_check([release_row(ttft_ms=101.9, prefill_tps=128 / 101.9 * 1000)], [quiet])
    assert found == []  # +1.9 %: under the 2 % floor
    rows, found, _ = cross_check([release_row(ttft_ms=101.9, prefill_tps=128 / 101.9 * 1000)], [quiet],
                                 tolerance=0.01)
    assert [d.metric for d in found] == ["ttft_ms", "prefill_tps"]
    rows, found, _ = cross_check([release_row()], [])  # no probe result: nothing judged
    assert found == [] and rows[0].flags == ()


def test_a_slow_first_request_in_a_median_of_two_is_explained_not_flagged():
    r = sampled([170.0, 100.0, 100.5, 99.5, 100.0])  # the first after the release's benchmark: 1.7x
    rows, found, notes = cross_check([release_row(ttft_ms=134.0, prefill_tps=128 / 134 * 1000)], [r])
    assert found == [] and rows[0].flags == ()
    assert notes == ["qwen3 128:128 TTFT: the first request after warm-up is 1.70x the others (the probe's first, "
                     "right after the release's benchmark): a median of 2 that includes it is 1.35x the probe's, "
                     "the release's is 1.34x; not flagged"]
    assert rows[0].extra["probe_note"] == notes[0]
    rows, found, _ = cross_check([release_row(ttft_ms=170.0, prefill_tps=128 / 170 * 1000)], [r])
    assert rows[0].flags == (FLAG,)  # the whole figure that slow: no median of two explains it


def test_with_rounds_every_usual_request_of_every_round_is_the_noise_and_drift_is_in_it():
    iv = t_interval([100.0, 104.0, 96.0])  # three rounds' TTFT p50
    assert iv is not None
    each = [100.0, 99.0, 101.0, 104.0, 103.0, 105.0, 96.0, 95.0, 97.0]  # three rounds of three, drifting
    r = sampled(each, intervals={"ttft_p50_ms": iv}, repeats=3)
    usual = each[1:]
    band = stats.t.ppf(0.9995, 7) * statistics.stdev(usual) * math.sqrt(math.pi / 2 / 8 + 1) + 2.0
    rows, found, _ = cross_check([release_row(ttft_ms=99 + band, prefill_tps=128 / (99 + band) * 1000)], [r])
    assert found == []
    rows, found, _ = cross_check([release_row(ttft_ms=101 + band, prefill_tps=128 / (101 + band) * 1000)], [r])
    assert found[0].noise == pytest.approx(band / 100, rel=1e-3) and "(3 rounds, 8 requests" in found[0].why
    p = probe_row(r, release_row())
    assert p.extra["ttft_p50_ms_ci95"] == f"{iv.low:.6g},{iv.high:.6g}" and p.extra["probe_repeats"] == "3"
    assert float(p.extra["probe_band_ttft_ms"]) == pytest.approx(band / 100, rel=1e-3)
    assert p.extra["probe_ttft_each_ms"].split(",")[:3] == ["100", "99", "101"]
    assert p.extra["probe_first_byte_each_ms"].split(",")[:2] == ["50", "49.5"]


def test_the_bands_t_quantiles_are_students():
    assert [t9995(df) for df in (1, 3, 10, 30)] == pytest.approx([stats.t.ppf(0.9995, df) for df in (1, 3, 10, 30)],
                                                                 abs=1e-3)
    assert [t9995(df) for df in (31, 60, 500)] == pytest.approx([stats.t.ppf(0.9995, df) for df in (31, 60, 500)],
                                                                rel=2e-3)
