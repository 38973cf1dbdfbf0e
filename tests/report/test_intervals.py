"""Every finding carries its 95 % interval (issue 30, item 3; docs/adr/0018-intervals-of-findings.md): on
synthetic fleets with a planted change, each kind of finding's interval holds the change, none is invented
below 6 modules / profiles, and the verdict line, the Markdown, the HTML and the JSON show them (fast tier)."""

from __future__ import annotations

import json

import pytest

from controller.report import Thresholds, analyse
from controller.report.model import FLEET, PRIMARY_METRICS
from controller.report.render import findings_json, regression_line, to_dict, to_json, to_markdown, verdict_line
from controller.report.synth import fleet

SEEDS = range(5)
PROFILE = ("qwen3", "250:16000")


def _one_profile_slower(cur, frac):
    sel = (cur["model_key"] == PROFILE[0]) & (cur["profile"] == PROFILE[1])
    cur.loc[sel, "prefill_tps"] *= 1 - frac
    cur.loc[sel, "ttft_ms"] /= 1 - frac
    return cur


@pytest.mark.parametrize("seed", SEEDS)
def test_a_one_profile_fleet_regression_carries_the_interval_of_its_fleet_median(reference, seed):
    cur = _one_profile_slower(fleet(reference, modules=8, seed=seed), 0.20)
    rep = analyse(cur, run_id="r", baseline=reference, baseline_id="b")
    (reg,) = rep.regressions
    assert (reg.module, reg.model_key, reg.profile, reg.metric) == (FLEET, *PROFILE, "prefill_tps")
    assert reg.change is not None and reg.ci_low is not None and reg.ci_high is not None
    assert reg.ci_low <= reg.change <= reg.ci_high
    assert reg.ci_low <= -0.20 <= reg.ci_high  # 8 modules: [x(1), x(8)], coverage 1 - 2/256
    assert reg.ci_high - reg.ci_low < 0.08


def test_a_one_profile_fleet_regression_on_5_modules_has_no_interval(reference):
    cur = _one_profile_slower(fleet(reference, modules=5, seed=3), 0.20)
    rep = analyse(cur, run_id="r", baseline=reference, baseline_id="b")
    (reg,) = rep.regressions
    assert reg.profile == PROFILE[1] and (reg.ci_low, reg.ci_high) == (None, None)
    assert regression_line(reg) == f"fleet: qwen3 250:16000 prefill_tps {reg.change:+.1%} [no interval (n < 6)] " \
                                   f"vs baseline ({reg.related[0]})"
    assert "| no interval (n < 6) |" in to_markdown(rep)


@pytest.mark.parametrize("seed", SEEDS)
def test_a_module_slower_than_its_previous_run_carries_the_interval_of_its_median_over_profiles(reference, seed):
    prev = fleet(reference, modules=["a", "b"], seed=10 + seed, run_id="p")
    cur = fleet(reference, modules=["a", "b"], seed=20 + seed, run_id="c")
    sel = (cur["module"] == "b") & (cur["model_key"] == "qwen35_fq")
    cur.loc[sel, "decode_tps"] *= 0.85
    cur.loc[sel, "tpot_ms"] /= 0.85
    rep = analyse(cur, run_id="c", previous=prev)
    (reg,) = rep.regressions
    assert (reg.module, reg.model_key, reg.metric) == ("b", "qwen35_fq", "decode_tps")
    assert reg.n >= 6 and reg.change is not None and reg.ci_low is not None and reg.ci_high is not None
    assert reg.ci_low <= reg.change <= reg.ci_high
    assert reg.ci_low <= -0.15 <= reg.ci_high
    assert reg.ci_high - reg.ci_low < 0.06


def test_a_module_regression_over_fewer_than_6_profiles_has_no_interval(reference):
    profiles = sorted(reference.loc[reference["model_key"] == "qwen35_fq", "profile"].unique())[:5]
    ref = reference[(reference["model_key"] != "qwen35_fq") | reference["profile"].isin(profiles)]
    prev = fleet(ref, modules=["a", "b"], seed=7, run_id="p")
    cur = fleet(ref, modules=["a", "b"], seed=8, run_id="c")
    sel = (cur["module"] == "b") & (cur["model_key"] == "qwen35_fq")
    cur.loc[sel, "decode_tps"] *= 0.70
    cur.loc[sel, "tpot_ms"] /= 0.70
    rep = analyse(cur, run_id="c", previous=prev, thresholds=Thresholds(alpha=0.05))  # 5 of 5: p = 1/32 < alpha
    (reg,) = rep.regressions
    assert (reg.module, reg.model_key, reg.metric, reg.n) == ("b", "qwen35_fq", "decode_tps", 5)
    assert (reg.ci_low, reg.ci_high) == (None, None)  # not invented


@pytest.mark.parametrize("seed", SEEDS)
def test_an_outlier_carries_the_interval_of_its_factor(reference, seed):
    """The factor is the median over all the module's primary figures (accept rates too): planted on them all,
    the interval holds it (planted on the speeds only, the factor is the median of a mixture, a little above)."""
    cur = fleet(reference, seed=seed)
    sel = cur["module"] == "m03"
    for m in PRIMARY_METRICS:
        cur.loc[sel, m] *= 0.88
    rep = analyse(cur, run_id="r", baseline=reference, baseline_id="b")
    (o,) = rep.outliers
    assert (o.module, o.model_key) == ("m03", FLEET)
    assert o.ci_low is not None and o.ci_high is not None
    assert o.ci_low <= o.factor <= o.ci_high
    assert o.ci_low <= 0.88 <= o.ci_high and o.ci_high - o.ci_low < 0.03


def test_a_key_outlier_carries_the_interval_of_its_factor(reference):
    cur = fleet(reference, seed=9)
    sel = (cur["module"] == "m05") & (cur["model_key"] == "qwen3vl")
    for m in ("prefill_tps", "decode_tps", "vision_fps"):
        cur.loc[sel, m] *= 0.8
    rep = analyse(cur, baseline=reference, baseline_id="b")
    (o,) = rep.outliers
    assert (o.module, o.model_key) == ("m05", "qwen3vl")
    assert o.ci_low is not None and o.ci_high is not None and o.ci_low <= 0.8 <= o.ci_high


def test_the_verdict_line_gives_each_named_finding_with_its_interval(reference):
    cur = fleet(reference, module_factor={"m03": 0.88}, regress={("qwen3", "decode_tps"): 0.08}, seed=1)
    rep = analyse(cur, run_id="r", release="1.4.2", baseline=reference, baseline_id="b")
    (reg,), (o,) = rep.regressions, rep.outliers
    assert verdict_line(rep) == (
        f"REGRESSED r (1.4.2 vs b): 1 regression(s): fleet: qwen3 decode_tps {reg.change:+.1%} "
        f"[{reg.ci_low:+.1%}, {reg.ci_high:+.1%}] vs baseline ({reg.related[0]}); "
        f"1 outlier(s): m03 {o.factor:.2f}x [{o.ci_low:.2f}, {o.ci_high:.2f}]")
    md = to_markdown(rep)
    assert f"| {o.ci_low:.2f}x to {o.ci_high:.2f}x |" in md


def test_json_carries_the_interval_of_every_regression_and_outlier(reference):
    cur = _one_profile_slower(fleet(reference, modules=8, module_factor={"m03": 0.88}, seed=2), 0.20)
    rep = analyse(cur, run_id="r", baseline=reference, baseline_id="b")
    doc = json.loads(to_json(rep))
    assert [(x["ci_low"], x["ci_high"]) for x in doc["regressions"]] == [(x.ci_low, x.ci_high)
                                                                         for x in rep.regressions]
    assert [(x["ci_low"], x["ci_high"]) for x in doc["outliers"]] == [(o.ci_low, o.ci_high) for o in rep.outliers]
    assert all(x["ci_low"] is not None for x in doc["regressions"] + doc["outliers"])
    assert json.loads(findings_json(rep)) == {"regressions": to_dict(rep)["regressions"],
                                              "outliers": to_dict(rep)["outliers"]}


@pytest.mark.slow  # over the fast tier's 2 s CPU budget with a neighbour on the other core
def test_html_shows_the_intervals(reference):
    from controller.report.render.html import to_html

    cur = _one_profile_slower(fleet(reference, modules=8, module_factor={"m03": 0.88}, seed=2), 0.20)
    rep = analyse(cur, run_id="r", baseline=reference, baseline_id="b")
    page = to_html(rep)
    (o,) = rep.outliers
    assert f"{o.ci_low:.2f}x to {o.ci_high:.2f}x" in page
    for reg in rep.regressions:
        assert reg.ci_low is not None and f"{reg.ci_low * 100:+.1f}" in page
