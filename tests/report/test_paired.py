"""Paired A/B on the same modules (controller.report.analysis.paired): release B against A, A B B A per round.

Module drift (a level per round, a trend within the round) cancels in the paired differences; a 2 % decode
regression on 4 modules is named against the 1 % paired tolerance; the verdict states the minimum detectable
change; what cannot be paired is said."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from controller.report.analysis.paired import (
    PAIRED_TOLERANCE,
    minimum_detectable_change,
    pair_differences,
    paired_compare,
    paired_thresholds,
)
from controller.report.model import Arm, PairedReport, PairedRun
from controller.report.synth import paired_fleet


def _compare(rows: pd.DataFrame, runs: list[tuple[str, Arm, int]]) -> PairedReport:
    plan = [PairedRun(run_id=r, arm=a, round=n) for r, a, n in runs]
    return paired_compare(rows, plan, release_a="1.0", release_b="1.1")


def test_module_drift_between_rounds_and_within_a_round_cancels_exactly(reference: pd.DataFrame) -> None:
    rows, runs = paired_fleet(reference, modules=4, rounds=2, noise=0.0, drift=0.15, trend=0.05, seed=1)
    d, notes = pair_differences(rows, [PairedRun(run_id=r, arm=a, round=n) for r, a, n in runs])
    assert notes == []
    assert len(d) == 2 * 4 * len(reference)
    figures = d.filter(like="d_").abs().max().max()
    assert figures < 1e-12
    rep = _compare(rows, runs)
    assert rep.verdict == "pass"
    assert rep.regressions == ()
    assert max(abs(c.change) for c in rep.changes) < 1e-12


def test_a_planted_two_percent_decode_regression_on_four_modules_is_named_once(reference: pd.DataFrame) -> None:
    rows, runs = paired_fleet(reference, modules=4, rounds=1, regress={("qwen35", "decode_tps"): 0.02}, seed=7)
    rep = _compare(rows, runs)
    assert rep.verdict == "regressed"
    assert [(r.model_key, r.metric) for r in rep.regressions] == [("qwen35", "decode_tps")]  # TPOT folded in
    (reg,) = rep.regressions
    assert reg.ci_low is not None and reg.ci_high is not None
    assert reg.ci_low <= -0.02 <= reg.ci_high
    assert reg.p_value < 0.01
    assert reg.profiles == 11 and reg.pairs == 4
    assert reg.mdc is not None and 0.01 < reg.mdc < 0.02  # the smallest change it names, stated next to it
    assert rep.modules == ("m00", "m01", "m02", "m03")
    assert rep.rounds == 1 and rep.tolerance == PAIRED_TOLERANCE


def test_no_change_under_large_drift_passes(reference: pd.DataFrame) -> None:
    rows, runs = paired_fleet(reference, modules=4, rounds=2, drift=0.10, trend=0.03, seed=11)
    rep = _compare(rows, runs)
    assert rep.verdict == "pass"
    assert max(abs(c.change) for c in rep.changes) < PAIRED_TOLERANCE


def test_one_profile_much_worse_is_not_a_key_level_regression(reference: pd.DataFrame) -> None:
    rows, runs = paired_fleet(reference, modules=4, rounds=1, seed=5)
    one = (rows["release"] == "B") & (rows["model_key"] == "qwen3") & (rows["profile"] == rows.loc[
        rows["model_key"] == "qwen3", "profile"].iloc[0])
    rows.loc[one, "decode_tps"] *= 0.7
    rep = _compare(rows, runs)
    (dec,) = [c for c in rep.changes if (c.model_key, c.metric) == ("qwen3", "decode_tps")]
    assert abs(dec.change) < PAIRED_TOLERANCE
    assert dec.status != "regressed"


def test_a_module_with_rows_of_one_release_only_is_said_and_the_verdict_is_incomplete(
        reference: pd.DataFrame) -> None:
    rows, runs = paired_fleet(reference, modules=3, rounds=1, seed=2)
    rows = rows[~((rows["module"] == "m02") & (rows["release"] == "B"))]
    rep = _compare(rows, runs)
    assert rep.notes == ("module m02, round 0: rows of release A only (not paired)",)
    assert rep.verdict == "incomplete"
    assert rep.modules == ("m00", "m01")


def test_no_rows_of_the_compared_runs_is_a_failed_verdict(reference: pd.DataFrame) -> None:
    rows, runs = paired_fleet(reference, modules=2, rounds=1, seed=2)
    rep = _compare(rows.assign(run_id="other"), runs)
    assert rep.verdict == "failed"
    assert rep.notes == ("no rows of the compared runs",)


def test_minimum_detectable_change_is_the_power_calculation_at_alpha() -> None:
    th = paired_thresholds(0.01, alpha=0.01)
    # max(tol + z_0.95 se, (z_0.99 + z_0.95) se) in log units, as a relative change of a higher-is-better figure
    got = minimum_detectable_change("decode_tps", 0.003, 11, th)
    want = -math.expm1(-max(-math.log(0.99) + 1.6448536269514722 * 0.003, (2.3263478740408408 + 1.6448536269514722)
                            * 0.003))
    assert got == pytest.approx(want, rel=1e-12)
    # a noisy comparison: the test's own need dominates the tolerance
    noisy = minimum_detectable_change("tpot_ms", 0.01, 11, th)
    assert noisy == pytest.approx(math.expm1((2.3263478740408408 + 1.6448536269514722) * 0.01), rel=1e-12)
    # 6 profiles: the exact one-sided signed-rank test cannot reach p < 0.01 (2^-6 = 0.0156)
    assert minimum_detectable_change("decode_tps", 0.003, 6, th) is None
    assert minimum_detectable_change("decode_tps", 0.003, 7, th) is not None


def _with_windows(rows: pd.DataFrame, noise: float, seed: int, b_factor: float = 1.0) -> pd.DataFrame:
    """J/token as the agent gives it: one figure per run, module and key (its benchmark window) on every row of
    the key, with the window's own noise; release B's windows ``b_factor`` times A's."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = rows.copy()
    for (_run, _module, _key), at in out.groupby(["run_id", "module", "model_key"]).groups.items():
        b = str(_run) in B_RUNS
        out.loc[at, "j_per_token"] = 2.0 * (b_factor if b else 1.0) * (1 + noise * rng.standard_normal())
    return out


B_RUNS: set[str] = set()


@pytest.mark.parametrize("seed", range(8))
def test_energy_is_judged_over_the_windows_not_the_profiles(reference: pd.DataFrame, seed: int) -> None:
    # a key's dozen rows carry one window's J/token: tested over the profiles, window noise alone (10 %) made
    # "regressed" findings on J/token between two runs of one release
    rows, runs = paired_fleet(reference, modules=4, rounds=1, seed=20 + seed)
    B_RUNS.clear()
    B_RUNS.update(r for r, arm, _ in runs if arm == "B")
    same = _compare(_with_windows(rows, 0.10, seed), runs)
    assert [r for r in same.regressions if r.metric == "j_per_token"] == []
    hungry = _compare(_with_windows(rows, 0.01, seed, b_factor=1.2), runs)
    assert {r.model_key for r in hungry.regressions if r.metric == "j_per_token"} == set(reference["model_key"])


def test_start_up_figures_show_their_own_tolerance_their_starts_and_their_floor(reference: pd.DataFrame) -> None:
    """Issue 46: compare-releases printed "+14.7 % within tolerance" beside "tolerance 1.0 %", "profiles 11" of one
    start per module, and a zero-width interval; a start under the 0.1 s floor never counts."""
    from controller.report.render.paired import paired_records, paired_verdict_line

    rows, runs = paired_fleet(reference, modules=2, rounds=1, seed=3)
    b_runs = {r for r, arm, _ in runs if arm == "B"}
    rows = rows.copy()
    rows["server_ready_s"] = [1.147 if r in b_runs else 1.0 for r in rows["run_id"]]
    rows["warmup_s"] = [0.072 if r in b_runs else 0.008 for r in rows["run_id"]]
    rep = _compare(rows, runs)
    ready = next(c for c in rep.changes if c.metric == "server_ready_s" and c.model_key == "qwen3")
    assert ready.status == "within tolerance" and ready.tolerance == 0.15 and abs(ready.change - 0.147) < 1e-9
    assert ready.profiles == 0 and ready.pairs == 2 and ready.ci_low is None  # 2 starts: too few for an interval
    warm = next(c for c in rep.changes if c.metric == "warmup_s" and c.model_key == "qwen3")
    assert abs(warm.change - 8.0) < 1e-9 and warm.status == "within tolerance"  # +800 %, 64 ms: under the floor
    rec = next(r for r in paired_records(rep) if r["metric"] == "server_ready_s" and r["model_key"] == "qwen3")
    assert (rec["tolerance"], rec["profiles"], rec["pairs"], rec["interval"]) == ("15.0%", "", 2, "2 starts, too few")
    assert "tolerance 1.0% (start-up 15.0%)" in paired_verdict_line(rep)
