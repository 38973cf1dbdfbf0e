"""The report's first screen (controller/report/render/glance.py) and the order of profiles: the summary under the
verdict says what regressed, which modules are out of line and what was not measured and why; profiles read in
numeric order (``128:128`` before ``1000:1000``); the probe's line says the figures agree, not "None"."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest

from controller.report import analyse
from controller.report.model import FailedPart, profile_key
from controller.report.render import to_json
from controller.report.render.glance import glance
from controller.report.render.markdown import to_markdown
from controller.report.render.numbers import in_profile_order
from controller.report.render.text import probe_text
from controller.report.synth import fleet


@pytest.fixture(scope="module")
def two_keys(reference):
    ref = reference[reference["model_key"].isin(["qwen3", "qwen35_mtp"])]
    cur = fleet(ref, modules=4, module_factor={"m03": 0.88}, regress={("qwen3", "decode_tps"): 0.08}, seed=5,
                run_id="run-g")
    return analyse(cur, run_id="run-g", release="1.4.2", baseline=ref, baseline_id="baseline:1.4.1:v1")


def test_the_first_screen_names_what_regressed_what_is_out_of_line_and_what_was_not_measured(two_keys):
    g = glance(two_keys, [])
    assert g.regressed and g.regressed[0].startswith("fleet: qwen3 decode_tps -")
    assert [x.split(":")[0] for x in g.out_of_line] == ["m03"]
    assert g.not_measured == (
        "qwen35_mtp: no context sweep (MTP: measured on GSM8K prompts), so no curve; its changes are under 'Every "
        "change per model key'",
        "energy per token: no device telemetry in this run",
        "release benchmark vs probe: no probe rows in this run")
    bare = glance(two_keys, ["qwen3 server ready 0.47 s (fleet median): no reference",
                             "precompile (compiled) 0.671 s (fleet median): no reference"])
    assert bare.not_measured[-1] == ("start-up costs: 2 figure(s) without a reference (the reference has no start-up "
                                     "costs; listed below)")


def test_keys_a_module_did_not_deliver_are_named_as_not_measured(reference):
    ref = reference[reference["model_key"].isin(["qwen3", "qwen3vl"])]
    cur = fleet(ref, modules=4, seed=8, run_id="run-p")
    cur = cur[~((cur["module"] == "m01") & (cur["model_key"] == "qwen3vl"))]
    rep = analyse(cur, run_id="run-p", baseline=ref, baseline_id="b", expected_modules=["m00", "m01", "m02", "m03"],
                  expected_keys=["qwen3", "qwen3vl"])
    found = [n for n in glance(rep, []).not_measured if "m01" in n]
    assert found == ["no results for 1 module/key pair(s): m01/qwen3vl"]
    # the logs kept of the failed part, right beside it (issue 49), in the Markdown and JSON reports too
    part = FailedPart(module="m01", why="lost", logs=("serial console kept", "kernel log and agent journal kept"),
                      command="fleetctl logs run-p --module m01 --kernel")
    rep = dataclasses.replace(rep, failed_parts=(part,))
    found = [n for n in glance(rep, []).not_measured if "m01" in n]
    assert found == ["no results for 1 module/key pair(s): m01/qwen3vl",
                     "m01 (lost): serial console kept; kernel log and agent journal kept: fleetctl logs run-p --module "
                     "m01 --kernel"]
    assert found[1] in to_markdown(rep)
    assert json.loads(to_json(rep))["failed_parts"] == [part.model_dump(mode="json")]


def test_a_calm_run_says_how_much_was_compared(reference):
    ref = reference[reference["model_key"] == "qwen3"]
    rep = analyse(fleet(ref, modules=4, seed=6, run_id="run-c"), run_id="run-c", baseline=ref, baseline_id="b")
    g = glance(rep, [])
    assert g.regressed == () and g.out_of_line == ()
    assert g.calm == f"nothing: {len(rep.changes)} of {len(rep.changes)} comparisons within the 5 % tolerance"


def test_profiles_in_numeric_order():
    names = ["1000:1000", "128:128", "250:16000", "250:2000", "gsm8k:10", "gsm8k:9", "vision:250:1000",
             "vision:250:250"]
    assert sorted(names, key=profile_key) == ["128:128", "250:2000", "250:16000", "1000:1000", "gsm8k:9", "gsm8k:10",
                                              "vision:250:250", "vision:250:1000"]
    x = [SimpleNamespace(module=m, model_key=k, profile=p) for m, k, p in
         [("b", "k", "1000:1000"), ("b", "k", "128:128"), ("a", "k", "500:500"), ("a", "k", "250:250")]]
    assert [(i.module, i.profile) for i in in_profile_order(x)] == [("b", "128:128"), ("b", "1000:1000"),
                                                                    ("a", "250:250"), ("a", "500:500")]


def test_markdown_summary_lists_profiles_in_numeric_order(two_keys):
    md = to_markdown(two_keys)
    head = md.split("## Regressions")[0]
    assert "- **regressed**: fleet: qwen3 decode_tps -" in head and "- **out of line**: m03: typically" in head
    assert "- **not measured**: qwen35_mtp: no context sweep" in head
    rows = [line.split(" | ")[1] for line in md.split("## Fleet summary")[1].splitlines()
            if line.startswith("| qwen3 | ") and " decode_tps " in line]
    assert rows[:3] == ["128:128", "250:250", "250:500"] and rows.index("500:500") < rows.index("1000:1000")


def test_the_probe_line_says_they_agree_not_none(two_keys):
    agreed = dataclasses.replace(two_keys, disagreements=(), probe_checked=4)
    line = probe_text(agreed)
    assert line.startswith("They agree: 4 release row(s) have a probe row beside them") and "None" not in line
