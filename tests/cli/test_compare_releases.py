"""``fleetctl ab A B``: the run order (A B B A per round), the requests refused before anything is
dispatched (one line, exit 2), and how the paired verdict reads."""

from __future__ import annotations

import pandas as pd
import pytest

from controller.report.analysis.paired import paired_compare
from controller.report.model import PairedRun
from controller.report.render.paired import paired_records, paired_verdict_line
from controller.report.synth import paired_fleet, rows_frame
from controller.service.compare import plan_rounds, run_note
from controller.service.session import BadRequest
from tests.support.cli import TARBALL, one_line, run_main


def test_the_same_release_twice_is_named(tmp_path) -> None:
    """Issue 51: an A/B test (fleetctl ab) of a tarball with itself (or a copy) says it measures A/A noise."""
    from controller.cli.ab import same_release
    from controller.service import ValidateRequest

    one, copy, other = tmp_path / "a.tar.gz", tmp_path / "b.tar.gz", tmp_path / "c.tar.gz"
    one.write_bytes(b"x" * 100)
    copy.write_bytes(b"x" * 100)
    other.write_bytes(b"x" * 99 + b"y")
    req = lambda p: ValidateRequest(release=p, devices="all")  # noqa: E731
    assert same_release(req(one), req(one)) and same_release(req(one), req(copy))
    assert not same_release(req(one), req(other)) and not same_release(req(one), req(tmp_path / "gone.tar.gz"))
    url = lambda u: ValidateRequest(release=None, url=u, devices="all")  # noqa: E731
    assert same_release(url("https://x/r.tar.gz"), url("https://x/r.tar.gz"))
    assert not same_release(url("https://x/r.tar.gz"), req(one))


def test_a_comparison_too_coarse_for_its_tolerance_says_what_would_do() -> None:
    """Issue 51: a lost module took the detectable change from 1.2 % to 25.9 % and nothing said what to do."""
    from controller.report.render.paired import more_pairs

    assert more_pairs(1, 0.012, 0.01) == "to detect 1.0%: about --rounds 2, or more modules"
    assert more_pairs(2, 0.02, 0.01) == "to detect 1.0%: about --rounds 8, or more modules"
    assert more_pairs(1, 0.259, 0.01) == "to detect 1.0%: more modules (about 34x these, at --rounds 20)"


def test_the_plan_is_a_b_b_a_per_round() -> None:
    plan = plan_rounds(2)
    assert "".join(s.arm for s in plan) == "ABBAABBA"
    assert [s.round for s in plan] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [s.position for s in plan] == list(range(8))
    assert run_note("1.4.1", "1.4.2", plan[5], 2) == "A/B test 1.4.1 vs 1.4.2: round 2 of 2, release B (1.4.2)"


@pytest.mark.parametrize("rounds", [0, 21])
def test_a_round_count_out_of_range_is_refused(rounds: int) -> None:
    with pytest.raises(BadRequest, match=f"--rounds {rounds}: give 1 to 20"):
        plan_rounds(rounds)


@pytest.mark.parametrize(("args", "says"), [
    (["--rounds", "0"], "--rounds 0: give 1 to 20"),
    (["--tolerance", "2"], "--tolerance 2.0: give a fraction between 0 and 1 (0.01 = 1 %)"),
])
def test_a_bad_option_is_one_line_and_nothing_runs(env, capsys, args, says) -> None:
    code, _, err = run_main(capsys, "ab", TARBALL, TARBALL, "--devices", "all", *args)
    assert code == 2 and one_line(err) == f"fleetctl: error: {says}"
    assert not (env / "history.sqlite").exists()


def test_a_missing_release_b_is_refused_before_release_a_runs(env, capsys) -> None:
    missing = "SGLang-MUSA-M1000-M1000_1.4.2_sglang.tar.gz"
    code, _, err = run_main(capsys, "ab", TARBALL, missing, "--devices", "all")
    assert code == 2 and one_line(err) == f"fleetctl: error: {missing}: no such release tarball"


def test_the_verdict_line_names_the_regression_with_its_interval_and_the_detectable_change(seed_rows) -> None:
    ref = rows_frame(seed_rows)
    rows, runs = paired_fleet(ref, modules=4, rounds=1, noise=0.0, regress={("qwen35", "decode_tps"): 0.02})
    rep = paired_compare(rows, [PairedRun(run_id=r, arm=a, round=n) for r, a, n in runs],
                         release_a="1.4.1", release_b="1.4.2")
    (reg,) = rep.regressions
    assert paired_verdict_line(rep) == (
        "REGRESSED 1.4.2 vs 1.4.1: 1 round(s) A B B A on 4 module(s), tolerance 1.0%; decode detectable from 1.0%: "
        f"regressed qwen35 decode_tps -2.0% [-2.0%, -2.0%] (p {reg.p_value:.2g}; detectable from 1.0%)")
    recs = pd.DataFrame(paired_records(rep)).set_index(["model_key", "metric"])
    assert recs.loc[("qwen35", "decode_tps"), "status"] == "regressed"
    assert recs.loc[("qwen35", "tpot_ms"), "status"] == "regressed"  # in the table; folded out of the findings
    assert recs.loc[("qwen3", "decode_tps"), "status"] == "within tolerance"


def test_the_old_name_compare_releases_runs_ab_with_a_note(env, capsys) -> None:
    """Issue 50: ``compare-releases`` (runs two releases) beside ``compare`` (reads two runs) is ``ab``; the old
    name is kept hidden for one release: the note, then the verb itself (here refusing a missing release)."""
    missing = "SGLang-MUSA-M1000-M1000_1.4.2_sglang.tar.gz"
    code, _, err = run_main(capsys, "compare-releases", TARBALL, missing, "--devices", "all")
    assert code == 2 and err.splitlines() == [
        "fleetctl: note: 'fleetctl compare-releases' is now 'fleetctl ab'; the old name goes in the next release",
        f"fleetctl: error: {missing}: no such release tarball"]
