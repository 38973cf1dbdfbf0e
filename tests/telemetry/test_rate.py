"""The sampler's rate while a window is measured, and the idle power's settle (agent.telemetry.rate): pure."""

from __future__ import annotations

import pytest

from agent.telemetry.rate import IDLE_ABS_W, Schedule, idle_window, target_samples, tool_floor


def test_the_schedule_keeps_the_floor_then_grows_with_the_window_up_to_the_base() -> None:
    s = Schedule(since=100.0, base_s=1.0, floor_s=0.04, target=30)
    assert [s.period(100.0 + t) for t in (0.0, 1.2, 2.4, 15.0, 30.0, 600.0)] == pytest.approx(
        [0.04, 0.04, 0.08, 0.5, 1.0, 1.0])


@pytest.mark.parametrize("window", [1.2, 1.4, 2.0, 6.0, 14.6, 29.0, 31.0, 600.0])
def test_every_window_of_target_x_floor_or_longer_gets_the_target_samples(window: float) -> None:
    s = Schedule(since=0.0, base_s=1.0, floor_s=0.04, target=30)
    # step through the schedule as the sampler does (the next sample one period after the last)
    t, n = 0.0, 0
    while t <= window:
        n += 1
        t += s.period(t)
    assert n >= 30
    assert s.expected(window) == pytest.approx(n, rel=0.08)
    # and not wastefully: a long window costs about what the base period costs, plus target x ln(base / floor)
    if window >= 30:
        assert n <= window / 1.0 + 30 * (1 + 3.3)


def test_a_schedule_that_cannot_be_kept_is_refused() -> None:
    with pytest.raises(ValueError, match="need 0 < floor <= base"):
        Schedule(since=0.0, base_s=1.0, floor_s=2.0, target=30)
    with pytest.raises(ValueError, match="a target of at least 1"):
        Schedule(since=0.0, base_s=1.0, floor_s=0.1, target=0)


def test_the_tools_cost_bounds_the_floor() -> None:
    assert target_samples(20) == 30
    assert tool_floor([], base_s=1.0) == 0.04  # nothing measured yet: the fastest
    assert tool_floor([0.002, 0.003, 0.004], base_s=1.0) == 0.04  # 3 ms of CPU a sample: 7.5 % of a core at the floor
    # nvidia-smi at ~40 ms of CPU a call, at most 20 % of a core: every 0.2 s
    assert tool_floor([0.038, 0.040, 0.045], base_s=1.0, share=0.2) == pytest.approx(0.2)
    assert tool_floor([3.0], base_s=1.0) == 1.0  # never slower than the base period
    with pytest.raises(ValueError, match="tool share 0"):
        tool_floor([0.01], base_s=1.0, share=0.0)


def test_idle_settles_once_the_last_window_is_flat_on_every_device() -> None:
    falling = [(t / 10, 175.0 - 10 * t) for t in range(0, 11)]  # 175 W falling to 75 W over 1 s
    flat = [(1.0 + t / 10, 70.0 + (t % 2)) for t in range(1, 21)]  # then 70-71 W
    assert idle_window({0: falling}, 1.0, window_s=1.0, waited_s=1.0) is None
    got = idle_window({0: falling + flat}, 3.0, window_s=1.0, waited_s=3.0)
    assert got is not None and got.settled and got.power_w == 70.0 and got.spread_w == 1.0 and got.samples == 11
    # two devices: both must settle; their medians and spreads add up
    assert idle_window({0: falling + flat, 1: falling}, 3.0, window_s=1.0, waited_s=3.0) is None
    two = idle_window({0: flat, 1: flat}, 3.0, window_s=1.0, waited_s=3.0)
    assert two is not None and two.power_w == 140.0 and two.spread_w == 2.0


def test_idle_that_never_settles_is_taken_as_it_is_when_the_time_is_up() -> None:
    saw = [(t / 10, 70.0 + 20 * (t % 2)) for t in range(0, 31)]  # 70 / 90 W, never within 5 %
    assert idle_window({0: saw}, 3.0, window_s=1.0, waited_s=3.0) is None
    got = idle_window({0: saw}, 3.0, window_s=1.0, waited_s=30.0, timed_out=True)
    assert got is not None and not got.settled and got.spread_w == 20.0 and got.settle_s == 30.0
    # too few samples in the window is not settled either; a low, quantised power within 1 W is
    assert idle_window({0: [(0.0, 20.0), (1.0, 20.0)]}, 1.0, window_s=1.0, waited_s=1.0) is None
    low = [(t / 10, 3.0 + IDLE_ABS_W * (t % 2)) for t in range(0, 11)]
    assert idle_window({0: low}, 1.0, window_s=1.0, waited_s=1.0) is not None
    assert idle_window({}, 1.0, window_s=1.0, waited_s=1.0, timed_out=True) is None
