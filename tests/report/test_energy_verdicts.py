"""Energy through the verdict on synthetic fleets (fast tier): a hot module's J/token named as an energy outlier,
an injected 10 % energy regression judged as a speed regression is, with its own tolerance."""

from __future__ import annotations

import pandas as pd
import pytest

from controller.report import Thresholds, analyse
from controller.report.model import FLEET
from controller.report.render import to_markdown
from controller.report.synth import DECODE_POWER_W, fleet

SEEDS = range(3)
HOT = {"m02": (DECODE_POWER_W + 10.0) / DECODE_POWER_W}  # the simulated hot card: 10 W more leakage under load


def _names(rep):
    return [(r.module, r.model_key, r.profile, r.metric) for r in rep.regressions]


@pytest.mark.parametrize("seed", SEEDS)
def test_a_hot_module_is_named_for_its_energy_per_token_and_is_no_speed_outlier(reference, seed):
    prev = fleet(reference, energy=True, seed=10 + seed, run_id="r0")
    cur = fleet(reference, energy=True, module_power=HOT, seed=20 + seed, run_id="r1")
    rep = analyse(cur, run_id="r1", baseline=reference, baseline_id="b", previous=prev)
    assert rep.outliers == ()  # as fast as the others
    assert [(o.module, o.model_key, o.metric) for o in rep.energy_outliers] == [("m02", FLEET, "j_per_token")]
    assert rep.energy_outliers[0].factor == pytest.approx(52 / 62, abs=0.015)  # 19 % more J/token
    worst = rep.energy_outliers[0].worst[0]
    assert worst.metric == "j_per_token" and worst.value > worst.fleet_median
    assert rep.verdict == "pass"  # a module out of line is no release regression
    text = to_markdown(rep)
    assert "energy outlier" in text and "m02" in text and "J/token" in text


@pytest.mark.parametrize("seed", SEEDS)
def test_an_energy_regression_is_judged_as_a_speed_regression(reference, seed):
    prev = fleet(reference, energy=True, seed=30 + seed, run_id="r0")
    hungry = fleet(reference, energy=True, regress={("qwen3", "j_per_token"): 0.10}, seed=40 + seed, run_id="r1")
    # J/token is drawn before a regression is applied: here only the speed moves, the energy per token stays
    slower = fleet(reference, energy=True, regress={("qwen3", "decode_tps"): 0.10}, seed=40 + seed, run_id="r1")
    assert slower["j_per_token"].equals(hungry["j_per_token"].where(hungry["model_key"] != "qwen3",
                                                                   slower["j_per_token"]))
    e = analyse(hungry, run_id="r1", previous=prev)
    s = analyse(slower, run_id="r1", previous=prev)
    assert _names(e) == [(FLEET, "qwen3", FLEET, "j_per_token")]
    assert _names(s) == [(FLEET, "qwen3", FLEET, "decode_tps")]
    assert e.verdict == s.verdict == "regressed"
    (re_,), (rs,) = e.regressions, s.regressions
    assert re_.against == rs.against == "previous"
    assert (re_.n, rs.n) == (6, 11)  # energy over the 6 modules' windows, speed over the 11 profiles
    assert re_.change is not None and rs.change is not None
    assert 0.05 < re_.change < 0.15 and -0.15 < rs.change < -0.05  # the same estimator, the same noise
    assert re_.related and re_.related[0].startswith("tokens_per_j -")  # the derived figure moved with it


def test_energy_has_its_own_tolerance(reference):
    prev = fleet(reference, energy=True, seed=50, run_id="r0")
    cur = fleet(reference, energy=True, regress={("qwen3", "j_per_token"): 0.10}, seed=51, run_id="r1")
    loose = analyse(cur, run_id="r1", previous=prev, thresholds=Thresholds(energy_tolerance=0.15))
    assert loose.regressions == () and loose.verdict == "pass"
    ch = next(c for c in loose.changes if (c.model_key, c.metric) == ("qwen3", "j_per_token"))
    assert ch.status == "within tolerance"
    # the speed tolerance does not loosen energy
    strict = analyse(cur, run_id="r1", previous=prev, thresholds=Thresholds(tolerance=0.15))
    assert _names(strict) == [(FLEET, "qwen3", FLEET, "j_per_token")]
    assert Thresholds(energy_tolerance=0.2).tol("j_per_token") == 0.2 == Thresholds(energy_tolerance=0.2).tol(
        "tokens_per_j")
    assert Thresholds(energy_tolerance=0.2).tol("decode_tps") == 0.05


def test_rows_without_energy_change_nothing(reference):
    cur = fleet(reference, seed=60)
    rep = analyse(cur, run_id="r", baseline=reference, baseline_id="b")
    assert rep.energy_outliers == () and rep.regressions == () and rep.verdict == "pass"


@pytest.mark.slow  # over the fast tier's 2 s CPU budget with a neighbour on the other core
def test_the_html_and_json_reports_name_the_energy_outlier(reference):
    from controller.report.render.data import to_dict
    from controller.report.render.html import to_html

    cur = fleet(reference, energy=True, module_power=HOT, seed=70, run_id="r1")
    rep = analyse(cur, run_id="r1")
    html = to_html(rep)
    assert "<h2>Energy</h2>" in html and "<td>m02</td>" in html and "J/token vs fleet" in html
    d = to_dict(rep)
    assert [(o["module"], o["metric"]) for o in d["energy_outliers"]] == [("m02", "j_per_token")]


def _per_window(df, noise: float, seed: int, power: dict[str, float] | None = None):
    """J/token as the agent gives it: one figure per (module, key) window on every row of the key, with the
    window's own noise (the simulated benchmark's repeated TTFT requests move a window's prefill work)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = df.copy()
    for (module, _key), rows in out.groupby(["module", "model_key"]).groups.items():
        watts = DECODE_POWER_W * (power or {}).get(module, 1.0)
        decode = out.loc[rows, "decode_tps"].median()
        out.loc[rows, "j_per_token"] = watts / decode * (1 + noise * rng.standard_normal())
    out["tokens_per_j"] = 1.0 / out["j_per_token"]
    return out


@pytest.mark.parametrize("seed", SEEDS)
def test_window_noise_on_identical_modules_names_no_energy_outlier_and_a_hot_one_still_is(reference, seed):
    # make demo on four identical simulated modules: J/token 0.93x to 1.12x of the fleet's between windows, and
    # the sign test over a key's dozen rows (one window) called 4 to 6 of them outliers at p < 0.001
    same = _per_window(fleet(reference, modules=4, energy=True, seed=50 + seed, run_id="r1"), 0.05, seed)
    rep = analyse(same, run_id="r1", baseline=reference, baseline_id="b")
    assert rep.energy_outliers == ()
    hot = _per_window(fleet(reference, modules=4, energy=True, seed=60 + seed, run_id="r1"), 0.05, seed, HOT)
    rep = analyse(hot, run_id="r1", baseline=reference, baseline_id="b")
    assert [(o.module, o.model_key) for o in rep.energy_outliers] == [("m02", FLEET)]
    (o,) = rep.energy_outliers
    assert o.ci_low is not None and o.ci_high is not None
    assert o.cells == 7 and o.worst[0].profile == "window" and o.ci_low < o.factor < o.ci_high
    assert o.factor == pytest.approx(52 / 62, abs=0.05)


def test_one_window_far_out_is_a_key_outlier() -> None:
    import numpy as np

    from controller.report.analysis.energy import energy_outliers

    rows = [{"module": f"m{i}", "model_key": k, "j_per_token": v}
            for i in range(5) for k, v in (("a", 1.0 + 0.01 * i), ("b", 2.0 - 0.01 * i))]
    rows[4]["j_per_token"] = 1.5  # m2's window of key "a": 50 % more
    got = energy_outliers(pd.DataFrame(rows), Thresholds())
    assert [(o.module, o.model_key, round(1 / o.factor, 2)) for o in got] == [("m2", "a", 1.47)]  # 1.5 / 1.02
    assert got[0].worst[0].z > 4 and np.isfinite(got[0].p_value)
    assert energy_outliers(pd.DataFrame(rows[:4]), Thresholds()) == ()  # two modules: no fleet to be out of


@pytest.mark.parametrize("seed", range(10))
def test_two_runs_of_one_release_with_window_noise_name_no_energy_regression(reference, seed):
    # a key's rows all carry one window's J/token: tested over its profiles (and a module's window against its
    # previous one), two runs of one release at 5 % window noise were "regressed" on J/token 10 times in 10
    prev = _per_window(fleet(reference, modules=4, energy=True, seed=100 + seed, run_id="r0"), 0.05, 100 + seed)
    cur = _per_window(fleet(reference, modules=4, energy=True, seed=200 + seed, run_id="r1"), 0.05, 200 + seed)
    rep = analyse(cur, run_id="r1", baseline=reference, baseline_id="b", previous=prev)
    assert [r for r in rep.regressions if r.metric in ("j_per_token", "tokens_per_j")] == []


def test_a_fleet_wide_energy_rise_over_the_windows_is_still_named(reference):
    prev = _per_window(fleet(reference, modules=6, energy=True, seed=300, run_id="r0"), 0.02, 300)
    cur = _per_window(fleet(reference, modules=6, energy=True, seed=301, run_id="r1"), 0.02, 301,
                      {f"m{i:02d}": 1.10 for i in range(6)})
    rep = analyse(cur, run_id="r1", previous=prev)
    named = [(r.module, r.model_key, r.metric, r.n) for r in rep.regressions if r.metric == "j_per_token"]
    assert named == [(FLEET, k, "j_per_token", 6) for k in sorted(set(cur["model_key"]))]
