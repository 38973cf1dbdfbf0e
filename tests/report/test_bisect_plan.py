"""The pure planner of ``fleetctl bisect``: probes, bounds, rounds, calls."""

from __future__ import annotations

import itertools

import pytest

from controller.service.bisect_plan import (
    BisectPlanError,
    Call,
    Measured,
    Target,
    bounds,
    call_of,
    next_probes,
    rounds_needed,
    still_open,
    target_call,
)


def _bisect(n: int, first_bad: int, k: int, skip: frozenset[int] = frozenset()) -> tuple[int, tuple[int, ...]]:
    """Rounds and suspects of a bisection over ``n`` releases whose first bad one is ``first_bad``, with an
    oracle that never errs and cannot measure ``skip``."""
    calls: list = [None] * n
    calls[0], calls[-1] = "good", "bad"
    rounds = 0
    while not bounds(calls).done:
        probes = next_probes(calls, k)
        assert 0 < len(probes) <= k and len(set(probes)) == len(probes)
        for p in probes:
            calls[p] = "skip" if p in skip else ("bad" if p >= first_bad else "good")
        rounds += 1
    return rounds, bounds(calls).suspects


@pytest.mark.parametrize("k", [1, 2, 3, 4, 8])
def test_every_first_bad_of_16_releases_is_named_within_the_rounds_k_modules_need(k: int):
    worst = 0
    for first_bad in range(1, 16):
        rounds, suspects = _bisect(16, first_bad, k)
        assert suspects == (first_bad,)
        worst = max(worst, rounds)
    assert worst == rounds_needed(14, k)


def test_rounds_needed_is_log_base_k_plus_1_of_the_possibilities():
    # 16 releases: 14 between the good and the bad one, 15 possible answers
    assert [rounds_needed(14, k) for k in (1, 2, 4, 8)] == [4, 3, 2, 2]
    assert rounds_needed(0, 4) == 0 and rounds_needed(1, 1) == 1 and rounds_needed(99, 9) == 2


def test_four_modules_probe_every_third_candidate_of_16_releases_then_the_two_left() -> None:
    calls: list = [None] * 16
    calls[0], calls[-1] = "good", "bad"
    assert next_probes(calls, 4) == (3, 6, 9, 12)
    calls[3], calls[6], calls[9], calls[12] = "good", "good", "bad", "bad"
    assert next_probes(calls, 4) == (7, 8)


def test_a_skipped_candidate_is_named_among_the_suspects_when_it_cannot_be_passed():
    rounds, suspects = _bisect(16, 9, 4, skip=frozenset({8}))
    assert suspects == (8, 9) and rounds == 2
    _, suspects = _bisect(16, 9, 4, skip=frozenset({7}))
    assert suspects == (9,)


def test_the_last_good_below_the_first_bad_bounds_the_answer_even_after_a_noisy_good_above_it():
    b = bounds(["good", None, "bad", "good", None, "bad"])
    assert (b.good, b.bad, b.untested) == (0, 2, (1,))


def test_endpoints_must_be_good_then_bad():
    with pytest.raises(BisectPlanError, match="first candidate must be the good"):
        bounds(["bad", None, "good"])
    with pytest.raises(BisectPlanError, match="at least one module"):
        next_probes(["good", None, "bad"], 0)


@pytest.mark.parametrize(("change", "lo", "hi", "want"), [
    (-0.01, -0.02, 0.00, "good"), (-0.07, -0.09, -0.05, "bad"), (-0.04, -0.06, -0.02, "unsure"),
    (-0.041, None, None, "bad"), (-0.039, None, None, "good")])
def test_a_target_is_called_by_where_its_change_sits_between_good_and_bad(change, lo, hi, want):
    assert target_call(Target("qwen3", "decode_tps", -0.08), Measured(change, lo, hi)) == want


def test_an_unsure_target_is_called_on_its_estimate_at_the_last_measurement_and_direction_counts():
    t = Target("qwen3", "ttft_ms", 0.10)  # TTFT up 10 %: bad
    assert target_call(t, Measured(0.06, 0.03, 0.09)) == "unsure"
    assert target_call(t, Measured(0.06, 0.03, 0.09), final=True) == "bad"
    assert target_call(t, Measured(0.04, 0.01, 0.049)) == "good"


@pytest.mark.parametrize(("calls", "want"), [
    (("good", "good"), "good"), (("good", "bad"), "bad"), (("unsure", "bad"), "bad"), (("good", "unsure"), "unsure"),
    ((), "unsure")])
def test_a_candidate_is_bad_on_any_target_good_on_all(calls, want):
    assert call_of(calls) == want


def test_probes_are_distinct_and_inside_for_every_small_case() -> None:
    for n, k in itertools.product(range(2, 12), range(1, 6)):
        calls: list = [None] * n
        calls[0], calls[-1] = "good", "bad"
        probes = next_probes(calls, k)
        assert len(probes) == min(k, n - 2) and all(0 < p < n - 1 for p in probes)


def test_a_lost_or_unsure_candidate_the_round_made_irrelevant_is_not_measured_again() -> None:
    """Issue 51: candidate 3's module was lost while candidate 2 was called bad: 3 no longer matters."""
    calls: list[Call | None] = ["good", None, "bad", None, None, "bad"]
    b = bounds(calls)
    assert still_open([3, 1], b) == (1,)
    assert still_open([1, 3, 4], bounds(["good", "good", None, None, "bad", "bad"])) == (3,)
    assert still_open([2, 3], bounds(["good", "good", None, None, "bad", "bad"])) == (2, 3)
    assert still_open([1, 4], None) == (1, 4)  # no calls yet: nothing to leave out
