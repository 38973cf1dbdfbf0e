"""Energy over a benchmark window (agent.telemetry.energy): the trapezoid clipped to the window, the counter
read at its edges, coverage, gaps and resets, idle power, and the figures the rows carry. Exact values."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent.telemetry.energy import (
    counter_energy,
    describe,
    idle_power,
    integrate_power,
    output_tokens,
    window_energy,
    with_energy,
)
from contract.records import DeviceSample, ResultRow


def sample(ts: float, power: float | None = None, *, gpu: int = 0, util: float | None = 90.0,
           mj: float | None = None) -> DeviceSample:
    return DeviceSample(ts=ts, gpu=gpu, power_w=power, utilization_pct=util, energy_mj=mj)


def test_trapezoid_is_clipped_to_the_window_with_the_edges_interpolated() -> None:
    pts = [(0.0, 10.0), (1.0, 20.0), (2.0, 20.0), (3.0, 10.0)]
    got = integrate_power(pts, 0.5, 2.5, period_s=1.0)
    # [0.5, 1]: 15 -> 20 W; [1, 2]: 20 W; [2, 2.5]: 20 -> 15 W
    assert got.joules == 8.75 + 20.0 + 8.75
    assert (got.covered_s, got.points, got.period_s, got.max_gap_s, got.note) == (2.0, 2, 1.0, 1.0, "")


def test_a_window_on_sample_times_is_the_plain_trapezoid() -> None:
    pts = [(10.0, 40.0), (11.0, 50.0), (12.0, 60.0)]
    assert integrate_power(pts, 10.0, 12.0, period_s=1.0).joules == 45.0 + 55.0
    # samples in any order; those far outside the window do not matter
    assert integrate_power([(12.0, 60.0), (0.0, 999.0), (10.0, 40.0), (11.0, 50.0), (30.0, 1.0)], 10.0, 12.0,
                           period_s=1.0).joules == 100.0


def test_samples_that_do_not_reach_across_the_window_drop_the_figure() -> None:
    got = integrate_power([(1.0, 50.0), (2.0, 50.0), (3.0, 50.0)], 0.0, 4.0, period_s=1.0)
    assert got.joules is None and got.covered_s == 2.0
    assert got.note == "power samples cover 50% of the window: figure dropped"
    assert integrate_power([], 0.0, 1.0, period_s=1.0).note == "power samples cover 0% of the window: figure dropped"


def test_a_gap_in_the_samples_drops_the_figure() -> None:
    pts = [(0.0, 50.0), (1.0, 50.0), (4.0, 50.0), (5.0, 50.0)]
    got = integrate_power(pts, 0.0, 5.0, period_s=1.0)
    assert got.joules is None and got.max_gap_s == 3.0 and got.covered_s == 5.0
    assert got.note == ("a gap of 3 s in the power samples (at 1.000; more than 2.5 x the 1 s period and 5% of the "
                        "window): figure dropped")
    # 2.5 periods is still no gap
    assert integrate_power([(0.0, 50.0), (2.5, 50.0), (3.0, 50.0)], 0.0, 3.0, period_s=1.0).joules == 150.0


def test_a_gap_outside_the_window_does_not_matter() -> None:
    pts = [(-10.0, 5.0), (0.0, 50.0), (1.0, 50.0), (2.0, 50.0), (20.0, 5.0)]
    assert integrate_power(pts, 0.0, 2.0, period_s=1.0).joules == 100.0


def test_the_counter_is_read_at_the_edges() -> None:
    pts = [(0.0, 0.0), (1.0, 1000.0), (2.0, 3000.0), (3.0, 3500.0)]
    got = counter_energy(pts, 0.5, 2.5, period_s=1.0)
    assert got.joules == (3250.0 - 500.0) / 1000 and got.note == ""


def test_a_counter_reset_drops_the_figure() -> None:
    pts = [(0.0, 5000.0), (1.0, 6000.0), (2.0, 100.0), (3.0, 1100.0)]
    got = counter_energy(pts, 0.0, 3.0, period_s=1.0)
    assert got.joules is None
    assert got.note == "the energy counter went back from 6000 to 100 mJ at 2.000 (a reset): figure dropped"
    # a reset outside the window does not matter
    assert counter_energy([(-5.0, 9000.0), *pts[1:]], 2.0, 3.0, period_s=1.0).joules == 1.0


def test_an_empty_window_is_refused() -> None:
    with pytest.raises(ValueError, match="empty"):
        integrate_power([(0.0, 1.0)], 2.0, 2.0, period_s=1.0)


def test_idle_power_is_the_median_of_the_latest_idle_samples_before_the_key() -> None:
    samples = [sample(float(t), p, util=u) for t, p, u in
               [(0, 30, 0), (1, 18, 0), (2, 19, 0), (3, 60, 80), (4, 21, 0), (5, 20, None), (6, 22, 0),
                (7, 23, 0), (8, 50, 0)]]
    assert idle_power(samples, 8.0) == (21.0, 5)  # 19, 21, 20, 22, 23: the busy one and the later one aside
    assert idle_power(samples, 0.0) == (None, 0)
    two = [*samples, sample(6.5, 10.0, gpu=1, util=0)]
    assert idle_power(two, 8.0) == (31.0, 6)  # devices add up


# the arithmetic tests take a 10 s window at 1 s (11 samples) with min_samples=11; the rule has its own test
def run_samples(power: float, *, mj: bool = False) -> list[DeviceSample]:
    """Idle before 10 s, then ``power`` W from 10 s to 20 s (a sample a second; the counter from 0)."""
    out = [sample(float(t), 20.0, util=0) for t in range(5, 10)]
    out += [sample(float(t), power, mj=(t - 10) * power * 1000 if mj else None) for t in range(10, 21)]
    return out


def test_window_energy_from_the_power_samples() -> None:
    e = window_energy(run_samples(50.0), 10.0, 20.0, period_s=1.0, min_samples=11, output_tokens=250, idle_before=9.5)
    assert (e.energy_j, e.j_per_token, e.tokens_per_j, e.avg_power_w) == (500.0, 2.0, 0.5, 50.0)
    assert (e.idle_power_w, e.energy_above_idle_j) == (20.0, 300.0)
    w = e.window
    assert (w.source, w.window_s, w.samples, w.period_s, w.coverage, w.max_gap_s, w.output_tokens) == (
        "samples", 10.0, 11, 1.0, 1.0, 1.0, 250)
    assert (w.idle_samples, w.note) == (5, "")
    assert describe(e) == ("energy over the benchmark window: 500 J in 10.0 s from the samples (coverage 100%, "
                           "period 1 s), 2 J/token, average 50 W, idle 20 W")


def test_window_energy_prefers_the_counter() -> None:
    samples = run_samples(50.0, mj=True)
    samples = [s.model_copy(update={"power_w": 99.0}) if s.ts >= 10 else s for s in samples]  # power disagrees
    e = window_energy(samples, 10.0, 20.0, period_s=1.0, min_samples=11, output_tokens=100)
    assert e.window.source == "counter" and e.energy_j == 500.0 and e.j_per_token == 5.0


def test_a_dropped_window_keeps_its_evidence_and_no_figure() -> None:
    samples = [s for s in run_samples(50.0) if not 12 <= s.ts <= 15]
    e = window_energy(samples, 10.0, 20.0, period_s=1.0, min_samples=11, output_tokens=100)
    assert e.energy_j is e.j_per_token is e.avg_power_w is e.energy_above_idle_j is None
    assert e.idle_power_w == 20.0 and e.window.max_gap_s == 5.0
    assert e.window.note.startswith("a gap of 5 s in the power samples")
    assert describe(e).startswith("energy over the benchmark window (10.0 s): a gap of 5 s")


def test_no_output_tokens_keeps_the_energy_but_no_per_token_figure() -> None:
    e = window_energy(run_samples(50.0), 10.0, 20.0, period_s=1.0, min_samples=11, output_tokens=0)
    assert e.energy_j == 500.0 and e.j_per_token is None and e.tokens_per_j is None
    assert e.window.note == "no output tokens in the window (or no energy): no energy per token"


def test_every_device_of_the_module_adds_up() -> None:
    samples = run_samples(50.0) + [s.model_copy(update={"gpu": 1, "power_w": 10.0}) for s in run_samples(50.0)]
    e = window_energy(samples, 10.0, 20.0, period_s=1.0, min_samples=11, output_tokens=300)
    assert e.energy_j == 600.0 and e.j_per_token == 2.0 and e.idle_power_w == 30.0


def test_rows_take_the_figures_and_their_output_tokens() -> None:
    rows = [ResultRow(table="sweep", profile="128:128", model="Qwen3", output_tokens=100, measured_output=98),
            ResultRow(table="sweep", profile="250:250", model="Qwen3", output_tokens=100),
            ResultRow(table="sweep", profile="128:128", model="Qwen3", output_tokens=100, source="probe")]
    assert output_tokens(rows) == 198
    e = window_energy(run_samples(50.0), 10.0, 20.0, period_s=1.0, min_samples=11, output_tokens=output_tokens(rows))
    out = with_energy(rows, e)
    assert [r.energy_j for r in out] == [500.0, 500.0, None]
    assert out[0].j_per_token == 2.52525 and out[0].tokens_per_j == 0.396
    assert out[1].energy is not None and out[1].energy.output_tokens == 198 and out[2].energy is None


# -- a real recording: NVML's counter against nvidia-smi's power samples on an H200 (fixture README) -----------
H200 = Path(__file__).resolve().parents[1] / "fixtures" / "h200" / "energy-decode-loop.jsonl"


def _recording() -> dict[str, list[dict[str, Any]]]:
    by: dict[str, list[dict[str, Any]]] = {}
    for line in H200.read_text().splitlines():
        r = json.loads(line)
        by.setdefault(r["kind"], []).append(r)
    return by


def test_on_the_h200_the_integrated_samples_agree_with_the_energy_counter_within_5_percent() -> None:
    rec = _recording()
    counter = [(r["ts"], float(r["mj"])) for r in rec["nvml"]]
    ratios = {}
    for w in rec["window"]:
        ref = counter_energy(counter, w["start"], w["end"], period_s=0.05)
        assert ref.joules is not None and ref.note == ""
        for kind, period in (("smi1s", 1.0), ("smi100", 0.1)):
            pts = [(r["ts"], r["power.draw"]) for r in rec[kind]]
            got = integrate_power(pts, w["start"], w["end"], period_s=period)
            assert got.joules is not None and got.covered_s == pytest.approx(w["end"] - w["start"])
            ratios[w["name"], kind] = got.joules / ref.joules
    assert all(abs(r - 1) <= 0.05 for r in ratios.values()), ratios
    # the figures of bench/results/energy_h200_20261202_1247.txt
    assert round(ratios["full", "smi1s"], 4) == 0.9830 and round(ratios["half", "smi1s"], 4) == 0.9846
    assert round(ratios["full", "smi100"], 4) == 0.9845 and round(ratios["half", "smi100"], 4) == 0.9882


def test_the_h200_windows_energy_per_token_from_the_counter() -> None:
    rec = _recording()
    full = rec["window"][0]
    ref = counter_energy([(r["ts"], float(r["mj"])) for r in rec["nvml"]], full["start"], full["end"], period_s=0.05)
    assert ref.joules is not None and round(ref.joules, 1) == 20884.6
    assert round(ref.joules / full["tokens"] * 1000, 4) == 3.4556  # mJ per token of the synthetic decode loop
    samples = [DeviceSample(ts=r["ts"], gpu=0, power_w=r["power.draw"], energy_mj=None) for r in rec["smi1s"]]
    e = window_energy(samples, full["start"], full["end"], period_s=1.0, output_tokens=full["tokens"])
    assert e.window.source == "samples" and e.window.coverage == 1.0 and e.window.note == ""
    assert e.energy_j is not None and abs(e.energy_j / ref.joules - 1) < 0.05


def test_a_window_with_too_few_samples_inside_drops_the_figure() -> None:
    # a benchmark's power steps between prefill, decode and idle: a handful of samples says which phase each hit
    e = window_energy(run_samples(50.0), 10.0, 20.0, period_s=1.0, output_tokens=250)
    assert e.energy_j is e.j_per_token is None and e.window.samples == 11
    assert e.window.note == ("11 samples inside the 10 s window, fewer than 20: figure dropped (sample faster, "
                             "or a longer window)")
    counter = window_energy(run_samples(50.0, mj=True), 10.0, 20.0, period_s=1.0, output_tokens=250)
    assert counter.j_per_token is None and counter.window.note.startswith("11 samples inside")
    twenty = [sample(10.0 + t / 2, 50.0) for t in range(21)]
    assert window_energy(twenty, 10.0, 20.0, period_s=0.5, output_tokens=250).j_per_token == 2.0


def test_the_counter_read_at_the_window_edges_needs_nothing_in_between() -> None:
    from agent.telemetry.energy import Edge, edge_energy

    opened, closed = Edge(10.0, {0: 5_000.0, 1: 1_000.0}), Edge(12.0, {0: 105_000.0, 1: 51_000.0})
    assert edge_energy(opened, closed) == ({0: 100.0, 1: 50.0}, "")
    # no power sample at all: the edges alone give the figure, and 2 readings are not "too few samples"
    got = window_energy([], 10.0, 12.0, period_s=1.0, output_tokens=150, edges=(opened, closed))
    assert got.energy_j == 150.0 and got.j_per_token == 1.0 and got.avg_power_w == 75.0
    assert (got.window.source, got.window.samples, got.window.coverage, got.window.note) == ("counter", 2, 1.0, "")


def test_a_counter_that_goes_back_between_the_edges_is_refused_in_one_line() -> None:
    from agent.telemetry.energy import Edge, edge_energy

    got = window_energy([sample(9.0, 50.0, util=0.0)], 10.0, 12.0, period_s=1.0, output_tokens=10,
                        edges=(Edge(10.0, {0: 9_000.0}), Edge(12.0, {0: 400.0})))
    assert got.energy_j is None and got.j_per_token is None and got.idle_power_w == 50.0
    assert got.window.note == ("the energy counter of device 0 went back from 9000 to 400 mJ over the window "
                               "(a reset or a wrap): figure dropped")
    assert "\n" not in got.window.note and describe(got).endswith("figure dropped")
    assert edge_energy(Edge(0.0, {0: 1.0}), Edge(1.0, {0: 2.0, 1: 2.0}))[1] == (
        "the energy counters of devices [0] at the window's start but [0, 1] at its end: figure dropped")
    # an edge without counters: the power samples decide (none here)
    assert window_energy([], 0.0, 1.0, period_s=1.0, output_tokens=1,
                         edges=(Edge(0.0), Edge(1.0))).window.note == "no device samples: no energy figure"


def test_gaps_are_judged_against_the_fast_schedules_period() -> None:
    from agent.telemetry.rate import Schedule

    fast = Schedule(since=0.0, base_s=1.0, floor_s=0.05, target=30)
    pts = [(t * 0.05, 50.0) for t in range(0, 41)]  # every 0.05 s over [0, 2]
    assert integrate_power(pts, 0.0, 2.0, period_s=1.0, schedule=fast).joules == pytest.approx(100.0)
    holed = [p for p in pts if not 0.5 < p[0] < 0.9]  # 0.4 s without a sample, where 0.05 s was kept
    got = integrate_power(holed, 0.0, 2.0, period_s=1.0, schedule=fast)
    assert got.joules is None and got.note == ("a gap of 0.4 s in the power samples (at 0.500; more than 2.5 x the "
                                               "0.05 s period and 5% of the window): figure dropped")
    # a stall of up to 5 % of the window is bridged (0.1 s of 2 s), more than 2.5 fast periods though it is
    stalled = [p for p in pts if not 0.5 < p[0] < 0.6]
    assert integrate_power(stalled, 0.0, 2.0, period_s=1.0, schedule=fast).joules == pytest.approx(100.0)
    # at the base period the same hole is no gap; before the schedule began, the base period is the rule
    assert integrate_power(holed, 0.0, 2.0, period_s=1.0).joules == pytest.approx(100.0)
    late = Schedule(since=0.95, base_s=1.0, floor_s=0.05, target=30)
    assert integrate_power(holed, 0.0, 2.0, period_s=1.0, schedule=late).joules == pytest.approx(100.0)


def test_the_measured_idle_power_and_its_spread_go_with_the_figures() -> None:
    from agent.telemetry.rate import IdleReading

    pts = [sample(t / 10, 60.0) for t in range(0, 31)]
    idle = IdleReading(power_w=21.0, spread_w=0.5, samples=24, settle_s=1.2, settled=True)
    got = window_energy(pts, 0.5, 2.5, period_s=0.1, output_tokens=60, idle=idle, min_samples=5)
    assert got.idle_power_w == 21.0 and got.energy_above_idle_j == pytest.approx((60.0 - 21.0) * 2.0)
    w = got.window
    assert (w.idle_samples, w.idle_spread_w, w.idle_settle_s, w.idle_settled) == (24, 0.5, 1.2, True)
    assert "idle 21 W (spread 0.5 W over 24 samples, settled after 1.2 s)" in describe(got)
