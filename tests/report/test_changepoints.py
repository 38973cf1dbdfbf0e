"""The change-point detector on planted series, the release order, and ``fleetctl trend`` (history and CSV)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import typer
from typer.testing import CliRunner

from controller.history import History
from controller.report.analysis.changepoints import DetectorSettings, analyse_series, detect
from controller.report.synth import fleet, planted_series
from controller.report.trend import TrendError, release_order
from tests.support.cli import given_app
from tests.support.frames import frame_to_rows


@pytest.mark.parametrize("shift", [0.10, 0.15, 0.20])
def test_planted_shift_at_one_percent_noise_found_within_one_release(shift):
    for seed in range(10):
        x, at = planted_series(seed, shift=-shift, noise=0.01, outliers=0)
        cps = detect(x)
        assert len(cps) == 1, (seed, cps)
        assert abs(cps[0].index - at) <= 1
        assert cps[0].ci_low < -shift * 0.8 and cps[0].ci_high > -shift * 1.2 and cps[0].in_force


def test_no_shift_series_has_no_change_point_in_most_seeds():
    hits = sum(bool(detect(planted_series(10**6 + seed, noise=0.02)[0])) for seed in range(40))
    assert hits <= 1


def test_a_level_shift_is_reported_once_and_a_reverted_one_is_not_in_force():
    x, at = planted_series(3, n=40, shift=-0.10, at=12, noise=0.01, outliers=0)
    cps = detect(x)
    assert [c.index for c in cps] == [12]
    x[28:] /= 0.90  # back to the old level
    back = detect(x)
    assert [c.index for c in back] == [12, 28]
    assert [c.in_force for c in back] == [False, True]


def test_outliers_are_named_not_change_points():
    x, _ = planted_series(5, shift=0.0, noise=0.01, outliers=0)
    x[10] *= 1.3
    d = analyse_series(x)
    assert d.outliers == (10,) and d.change_points == ()


def test_release_order_by_version_else_by_first_run():
    runs = pd.DataFrame({"release": ["1.10.0", "1.9.0", "1.9.0", "2.0rc1"], "created_at": [1.0, 3.0, 0.5, 2.0]})
    assert release_order(runs) == ["1.9.0", "1.10.0", "2.0rc1"]
    nightly = pd.DataFrame({"release": ["1.9.0", "nightly-b", "nightly-a"], "created_at": [5.0, 1.0, 2.0]})
    assert release_order(nightly) == ["nightly-b", "nightly-a", "1.9.0"]


def test_bad_setting_is_refused():
    with pytest.raises(ValueError, match="max_pvalue"):
        DetectorSettings(max_pvalue=0)


def _app(history: History) -> typer.Typer:
    return given_app(history)


def _history(path: Path, reference: pd.DataFrame, **change) -> History:
    """12 releases 1.0.0 .. 1.11.0 of qwen3 on 3 modules, 1 % noise; ``change`` (fleet()'s keywords) from 1.6.0 on."""
    ref = reference[reference["model_key"] == "qwen3"]
    h = History(path)
    for i in range(12):
        rel = f"1.{i}.0"
        df = fleet(ref, modules=3, noise=0.01, seed=i, run_id=f"run-{i}", release=rel, **(change if i >= 6 else {}))
        h.create_run(f"run-{i}", release=rel, models=["qwen3"], modules=["m00", "m01", "m02"])
        h.upsert_rows(frame_to_rows(df))
        h.set_run_state(f"run-{i}", "done")
        time.sleep(0.002)
    return h


def test_trend_names_the_release_of_a_planted_regression(reference, tmp_path):
    h = _history(tmp_path / "history.sqlite", reference, regress={("qwen3", "decode_tps"): 0.10})
    try:
        res = CliRunner().invoke(_app(h), ["trend", "--metric", "decode_tps", "--devices", "none", "-o", "json"])
        assert res.exit_code == 0, res.output
        recs = json.loads(res.stdout)
        assert len(recs) == 1  # every profile of the key moved at 1.6.0: one finding
        (r,) = recs
        assert (r["release"], r["scope"], r["in_force"]) == ("1.6.0", "fleet", "yes")
        assert -0.13 < r["size_value"] < -0.07
        assert len(r["moved_with"]) == len(set(reference.loc[reference["model_key"] == "qwen3", "profile"])) - 1
        strict = CliRunner().invoke(_app(h), ["trend", "--metric", "decode_tps", "--devices", "none", "--max-pvalue",
                                              "0.0001", "-o", "json"])  # issue 46: was silently empty under 1/2000
        assert [(x["release"], x["kind"]) for x in json.loads(strict.stdout)] == [("1.6.0", "step")]
        assert json.loads(strict.stdout)[0]["p_value"] <= 0.0001
    finally:
        h.close()


def test_trend_names_one_slow_module_once_with_what_moved_with_it(reference, tmp_path):
    h = _history(tmp_path / "history.sqlite", reference, module_factor={"m02": 0.85})
    try:
        res = CliRunner().invoke(_app(h), ["trend", "--devices", "m02", "-o", "json"])
        assert res.exit_code == 0, res.output
        recs = json.loads(res.stdout)
        assert [(r["release"], r["scope"]) for r in recs] == [("1.6.0", "m02")]
        assert recs[0]["metric"] in ("decode_tps", "prefill_tps")
        assert any(" tpot_ms " in m for m in recs[0]["moved_with"])
    finally:
        h.close()


def test_trend_from_csv_finds_the_step_and_bad_input_is_one_line(tmp_path: Path):
    x, at = planted_series(1, shift=0.15, noise=0.01, outliers=0)
    f = tmp_path / "s.csv"
    pd.DataFrame({"n": range(len(x)), "v": x}).to_csv(f, index=False)
    app = _app(History(tmp_path / "h.sqlite"))
    ok = CliRunner().invoke(app, ["trend", "--from-csv", str(f), "--column", "v", "--order-by", "n", "-o", "json"])
    assert ok.exit_code == 0, ok.output
    assert [r["index"] for r in json.loads(ok.stdout)] == [at]
    for args, needle in ((["--column", "w"], "no column 'w' (columns: n, v)"),
                         (["--column", "v", "--order-by", "t"], "no column 't'")):
        bad = CliRunner().invoke(app, ["trend", "--from-csv", str(f), *args])
        assert bad.exit_code != 0 and isinstance(bad.exception, TrendError)
        assert needle in str(bad.exception)
    missing = CliRunner().invoke(app, ["trend", "--from-csv", str(tmp_path / "none.csv"), "--column", "v"])
    assert isinstance(missing.exception, TrendError) and "none.csv" in str(missing.exception)


@pytest.mark.parametrize("text", ["v\n1\n2\n\n4\n5\n", "n,v\n1,1\n2,2\n3,\n4,4\n5,5\n"])
def test_a_blank_in_a_csv_is_refused_naming_its_line_or_left_out_when_asked(tmp_path: Path, text: str):
    """Issue 46: a one-column CSV with a blank was silently shorter (every later index moved); with two columns the
    blank was "np.float64(nan) is not a number"."""
    f = tmp_path / "s.csv"
    f.write_text(text + "\n\n")  # blank lines at the end are not rows
    app = _app(History(tmp_path / "h.sqlite"))
    bad = CliRunner().invoke(app, ["trend", "--from-csv", str(f), "--column", "v"])
    assert isinstance(bad.exception, TrendError)
    line = 4  # the header is line 1
    assert str(bad.exception) == (f"{f}: line {line}, column 'v': blank (1 row with a blank; --skip-blanks leaves "
                                  "them out)")
    ok = CliRunner().invoke(app, ["trend", "--from-csv", str(f), "--column", "v", "--skip-blanks"])
    assert ok.exit_code == 0, ok.output
    assert f"1 row with a blank left out (line {line})" in ok.stderr
    assert ok.stdout.strip() == "no change points in 4 values of 'v'; no change point can be named under 6 releases"


def test_a_csv_value_that_is_not_a_number_is_named_with_its_line(tmp_path: Path):
    f = tmp_path / "s.csv"
    f.write_text("n,v\n1,1\n2,abc\n")
    bad = CliRunner().invoke(_app(History(tmp_path / "h.sqlite")), ["trend", "--from-csv", str(f), "--column", "v"])
    assert isinstance(bad.exception, TrendError)
    assert str(bad.exception) == f"{f}: line 3, column 'v': 'abc' is not a finite number"
    f.write_text("n,v\n1,1\n2,2\n3,1e999\n")  # beyond a float: named by its line and text (issue 51), not its index
    bad = CliRunner().invoke(_app(History(tmp_path / "h.sqlite")), ["trend", "--from-csv", str(f), "--column", "v"])
    assert str(bad.exception) == f"{f}: line 4, column 'v': '1e999' is not a finite number"


def test_csv_rows_without_order_by_are_named_by_their_line(tmp_path: Path):
    """Issue 51: without --order-by the change was at "release 5" (rows numbered from 0); now "line 7"."""
    f = tmp_path / "s.csv"
    f.write_text("v\n" + "10\n" * 5 + "20\n" * 5)
    res = CliRunner().invoke(_app(History(tmp_path / "h.sqlite")), ["trend", "--from-csv", str(f), "--column", "v",
                                                                   "-o", "json"])
    assert res.exit_code == 0, res.output
    assert [cp["release"] for cp in json.loads(res.stdout)] == ["line 7"]


def test_candidates_closer_than_a_segment_are_pruned_to_the_real_one():
    from controller.report.analysis.changepoints import prune

    x, at = planted_series(2, shift=0.2, at=15, noise=0.01, outliers=0)
    assert [c.index for c in prune(x, [14, 15, 16, 29])] == [15]


def test_the_nile_example_of_the_docs_has_its_published_change_point(tmp_path: Path):
    """docs/howto/trends.md: the Nile's flow at Aswan drops after 1898 (Cobb 1978)."""
    nile = Path(__file__).resolve().parents[2] / "docs" / "data" / "nile.csv"
    args = ["trend", "--from-csv", str(nile), "--column", "volume", "--order-by", "year", "-o", "json"]
    res = CliRunner().invoke(_app(History(tmp_path / "h.sqlite")), args)
    assert res.exit_code == 0, res.output
    (cp,) = json.loads(res.stdout)
    assert (cp["release"], cp["in_force"], round(cp["size_value"], 3)) == ("1899", "yes", -0.231)


def test_the_commands_defaults_are_the_detectors():
    s = DetectorSettings()
    cmd = typer.main.get_group(_app(History(":memory:"))).commands["trend"]
    defaults = {p.name: p.default for p in cmd.params}
    assert (defaults["min_magnitude"], defaults["max_pvalue"]) == (s.min_magnitude, s.max_pvalue)


def test_a_step_is_named_once_each_side_has_three_releases():
    """A 20 % step in little noise is named with 3 releases on each side, in a history of any length (the
    permutation test of ADR 0017 could not name one under 12 releases, nor with 3 after it under 25)."""
    def step(n: int, at: int):
        return [100.0 + 0.1 * (i % 3) if i < at else 80.0 + 0.1 * (i % 3) for i in range(n)]

    assert [c.index for c in detect(step(6, 3))] == [3]
    assert detect(step(6, 2)) == () and detect(step(5, 3)) == ()  # 2 releases on one side: never
    for n in (11, 12, 20, 25, 60):
        assert [c.index for c in detect(step(n, n - 3))] == [n - 3], n


def test_a_clean_step_is_found_at_every_length_and_position():
    """Issue 46: a -8 % step in 1 % noise, at least 3 releases on each side, is found (within one release) at every
    history length from 12 to 40 and every position (the permutation test missed it 5 releases from the end of 15
    and found it 4 or 6 from the end). Every series at once (the batch path, equal to the per-series one)."""
    from controller.report.analysis.changepoints_batch import analyse_many

    series, planted = [], []
    for n in range(12, 41):
        for at in range(3, n - 2):
            x = 100 * (1 + 0.01 * np.random.default_rng(1000 * n + at).standard_normal(n))
            x[at:] *= 0.92
            series.append(x)
            planted.append(at)
    assert len(series) == 609
    for x, at, d in zip(series, planted, analyse_many(series), strict=True):
        assert any(c.kind == "step" and abs(c.index - at) <= 1 and c.size < 0 for c in d.change_points), \
            (len(x), at, d.change_points)


@pytest.mark.parametrize("max_pvalue", [0.002, 1e-4, 1e-8])
def test_the_smallest_step_found_shrinks_with_more_releases_on_either_side(max_pvalue):
    """Detectability is monotone: the smallest step the test names (the values on their levels) shrinks as
    either side grows, for histories up to 100 releases (past ~110 releases with 3 after a step, the test's
    factor, the number of splits, grows faster than the t-test's power: ADR 0039)."""
    from controller.report.analysis.changepoints import smallest_step

    s = DetectorSettings(max_pvalue=max_pvalue, min_magnitude=0.0)
    for before in range(3, 97):
        for after in range(3, 101 - before):
            here = smallest_step(before + after, after, 0.01, s)
            assert here is not None
            longer_after = smallest_step(before + after + 1, after + 1, 0.01, s)
            longer_before = smallest_step(before + after + 1, after, 0.01, s)
            assert longer_after is not None and longer_after < here, (before, after)
            assert longer_before is not None and longer_before < here, (before, after)


def test_a_max_pvalue_far_below_the_old_resolution_is_honoured():
    """--max-pvalue 0.0001 (the permutation test's p could not go under 1/2000: it silently found nothing) finds
    a 38 % jump in 15 releases with p under it, and a p asked smaller than the step's is none."""
    x = [100.0 + (i % 3) * 0.5 for i in range(15)]
    x = [v * (1.38 if i >= 10 else 1) for i, v in enumerate(x)]
    (cp,) = detect(x, DetectorSettings(max_pvalue=1e-4))
    assert cp.index == 10 and cp.p_value <= 1e-4
    assert detect(x, DetectorSettings(max_pvalue=cp.p_value / 2)) == ()


@pytest.mark.parametrize("seed", range(10))
def test_a_steady_drift_is_one_drift_not_a_staircase(seed):
    """Issue 46: +0.5 % a release over 40 releases with 1 % noise was three steps (+4.9 %, +4.8 %, +5.7 %)."""
    rng = np.random.default_rng(seed)
    x = 100 * 1.005 ** np.arange(40) * (1 + 0.01 * rng.standard_normal(40))
    (d,) = detect(x)
    assert d.kind == "drift" and d.end - d.index >= 28 and d.in_force
    assert 0.004 < d.slope_low < d.slope < d.slope_high < 0.0075
    assert d.size == pytest.approx(d.slope * (d.end - d.index + 1))


def test_a_step_with_an_outlier_beside_it_is_a_step():
    """An outlier next to a step is replaced half-way (the mean of the levels either side): left out of the drift's
    fit, it does not make the step a ramp."""
    x, at = planted_series(0, shift=-0.2, noise=0.01)
    d = analyse_series(x)
    assert at - 1 in d.outliers
    assert [(c.kind, c.index) for c in d.change_points] == [("step", at)]


def test_trend_without_a_change_says_over_how_many_releases(reference, tmp_path):
    h = _history(tmp_path / "history.sqlite", reference)
    try:
        res = CliRunner().invoke(_app(h), ["trend", "--metric", "decode_tps"])
        assert res.exit_code == 0, res.output
        assert res.stdout.strip().startswith("no change points over 12 releases; the smallest step it could find "
                                             "here: 3.0% in the middle, 3.0% 3 releases from the end (noise ")
        fine = CliRunner().invoke(_app(h), ["trend", "--metric", "decode_tps", "--min-magnitude", "0.001"])
        got = re.search(r"here: ([\d.]+)% in the middle, ([\d.]+)% 3 releases from the end \(noise ([\d.]+)%, "
                        r"median of (\d+) series; none under --min-magnitude 0.1%\)", fine.stdout)
        assert got, fine.stdout
        middle, fresh, noise = (float(got[i]) for i in (1, 2, 3))
        assert 0.1 < middle < fresh < 10 * noise and int(got[4]) == 11  # decode_tps: one fleet series a profile
        ref = reference[reference["model_key"] == "qwen3"]
        h.create_run("run-x", release="2.0.0", models=["qwen3"], modules=["m00"])
        h.upsert_rows(frame_to_rows(fleet(ref, modules=["m00"], noise=0.01, seed=99, run_id="run-x",
                                          release="2.0.0")))
        h.set_run_state("run-x", "done")
        one = CliRunner().invoke(_app(h), ["trend", "--models", "qwen3", "--devices", "m00", "--metric", "ttft_ms"])
        assert one.exit_code == 0, one.output
        assert "over 13 releases" in one.stdout
    finally:
        h.close()


def test_trend_over_one_release_says_none_can_be_named_under_six(reference, tmp_path):
    h = History(tmp_path / "history.sqlite")
    try:
        ref = reference[reference["model_key"] == "qwen3"]
        h.create_run("run-0", release="1.0.0", models=["qwen3"], modules=["m00"])
        h.upsert_rows(frame_to_rows(fleet(ref, modules=["m00"], noise=0.01, seed=0, run_id="run-0", release="1.0.0")))
        h.set_run_state("run-0", "done")
        res = CliRunner().invoke(_app(h), ["trend"])
        assert res.exit_code == 0, res.output
        assert res.stdout.strip() == "no change points over 1 release (none can be named under 6: docs/howto/trends.md)"
    finally:
        h.close()


def test_a_fleet_wide_shift_is_one_finding_that_names_the_modules_that_moved_with_it(reference, tmp_path):
    h = _history(tmp_path / "history.sqlite", reference, regress={("qwen3", "decode_tps"): 0.10})
    try:
        res = CliRunner().invoke(_app(h), ["trend", "--metric", "decode_tps", "-o", "json"])
        assert res.exit_code == 0, res.output
        recs = json.loads(res.stdout)
        assert [(r["release"], r["scope"]) for r in recs] == [("1.6.0", "fleet")]
        assert recs[0]["modules_moved"] == ["m00", "m01", "m02"]
        table = CliRunner().invoke(_app(h), ["trend", "--metric", "decode_tps", "-o", "csv"])
        assert table.stdout.splitlines()[1].endswith(',"m00, m01, m02"')
    finally:
        h.close()


def test_the_side_medians_equal_the_medians_of_each_values_neighbours() -> None:
    """hampel's vectorised medians (whole windows at once, the short ones at the ends apart) equal the plain ones."""
    import numpy as np

    from controller.report.analysis.changepoints import _side_medians

    rng = np.random.default_rng(7)
    for n in (3, 5, 7, 8, 20, 101):
        for h in (1, 2, 3):
            if n < 2 * h + 1:
                continue
            x = rng.normal(size=n)
            before, after = _side_medians(x, h)
            assert before.tolist() == [float(np.median(x[max(0, i - h):i])) for i in range(1, n - 1)], (n, h)
            assert after.tolist() == [float(np.median(x[i + 1:i + 1 + h])) for i in range(1, n - 1)], (n, h)
