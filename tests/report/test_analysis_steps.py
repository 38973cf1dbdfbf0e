"""Fast tier: the steps of :func:`controller.report.analysis.build.analyse`, each called on its own over a small
simulated fleet (:func:`controller.report.synth.fleet`, the seed's reference tables)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from controller.report.analysis.build import (
    against_baseline,
    against_previous,
    included_rows,
    prepare_frames,
    reference_notes,
    run_noise,
    set_outliers_apart,
)
from controller.report.analysis.groups import Groups
from controller.report.analysis.outliers import fleet_deviation
from controller.report.model import FLEET, Thresholds
from controller.report.synth import fleet

TH = Thresholds()
SLOW = {"m03": 0.85}


def _fleet_regs(regs):
    return {(r.model_key, r.metric) for r in regs if r.module == FLEET and r.profile == FLEET}


def test_prepare_frames_splits_the_probes_rows_and_prepares_each_frame(reference):
    cur = fleet(reference, modules=3, seed=1)
    probe_row = cur.iloc[[0]].assign(source="probe")
    f = prepare_frames(pd.concat([cur.assign(source="release"), probe_row], ignore_index=True),
                       reference.iloc[:0], fleet(reference, modules=3, seed=2, run_id="r0"), TH)
    assert len(f.rows) == len(cur) and f.probe is not None and len(f.probe) == 1
    assert f.probe_checked == 1  # the release row of the probe row's module, key and profile
    assert len(f.cur) == len(cur) and "cell" in f.cur.columns
    assert f.base is None and f.ref is None  # an empty baseline is none
    assert f.prev is not None and f.previous_ids == ("r0",)


def test_reference_notes_say_what_is_missing(reference):
    some = pd.DataFrame()
    assert reference_notes(None, None, "previous") == [
        "no baseline and no previous run: only the modules are compared with each other"]
    assert reference_notes(None, some, "previous") == [
        "no baseline: only each module's previous run and the fleet itself are compared"]
    assert reference_notes(None, some, "release 1.4.1") == []  # a comparison of two releases names its own
    assert reference_notes(some, None, "previous") == []


def test_set_outliers_apart_leaves_the_slow_modules_rows_out(reference):
    f = prepare_frames(fleet(reference, module_factor=SLOW, seed=3), reference, None, TH)
    inc = set_outliers_apart(f.cur, f.ref, TH)
    assert [(o.module, o.model_key) for o in inc.outliers] == [("m03", FLEET)]
    assert inc.outliers[0].factor == pytest.approx(0.85, abs=0.02)  # refined: against the fleet without it
    assert inc.some_excluded
    np.testing.assert_array_equal(inc.excluded, (f.cur["module"] == "m03").to_numpy())
    assert len(inc.inc) == int((~inc.excluded).sum()) and inc.mid is not None
    assert "m03" in inc.deviation.index


def test_set_outliers_apart_without_an_outlier_keeps_every_row(reference):
    f = prepare_frames(fleet(reference, seed=4), None, None, TH)
    inc = set_outliers_apart(f.cur, f.ref, TH)
    assert inc.outliers == () and not inc.excluded.any() and not inc.some_excluded
    assert inc.inc is f.cur and inc.cells_inc is inc.cells_all and inc.mid is not None


def test_included_rows_with_every_row_left_out_have_no_middles(reference):
    cur = prepare_frames(fleet(reference, modules=2, seed=5), None, None, TH).cur
    cells = Groups(cur["cell"].to_numpy())
    _, _, fleet_mid = fleet_deviation(cur, TH, cells)
    cells_inc, inc, mid = included_rows(cur, None, np.ones(len(cur), dtype=bool), cells, fleet_mid)
    assert mid is None and inc is cur and cells_inc is cells
    half = (cur["module"] == "m00").to_numpy()
    cells_inc, inc, mid = included_rows(cur, None, half, cells, fleet_mid)
    assert len(inc) == int((~half).sum()) and mid is not None and len(cells_inc.codes) == len(inc)


@pytest.mark.parametrize("modules, few", [(5, True), (6, False)])
def test_run_noise_weighs_findings_below_six_modules(reference, modules, few):
    f = prepare_frames(fleet(reference, modules=modules, seed=6), reference, None, TH)
    noise = run_noise(f.cur, set_outliers_apart(f.cur, f.ref, TH))
    assert noise.few is few and noise.out_of_line == set() and noise.judged is f.cur


def test_against_baseline_finds_the_planted_regression(reference):
    f = prepare_frames(fleet(reference, regress={("qwen3", "decode_tps"): 0.08}, seed=7), reference, None, TH)
    inc = set_outliers_apart(f.cur, f.ref, TH)
    changes, regs = against_baseline(f, inc, run_noise(f.cur, inc), "baseline", TH)
    assert ("qwen3", "decode_tps") in _fleet_regs(regs) and {r.against for r in regs} == {"baseline"}
    assert any(c.model_key == "qwen3" and c.metric == "decode_tps" for c in changes)
    none = prepare_frames(f.rows, None, None, TH)
    assert against_baseline(none, inc, run_noise(none.cur, inc), "baseline", TH) == ([], [])


def test_against_previous_finds_the_planted_regression_once_per_cause(reference):
    prev = fleet(reference, seed=8, run_id="r0")
    f = prepare_frames(fleet(reference, regress={("qwen35_mtp", "decode_tps"): 0.08}, seed=9), None, prev, TH)
    inc = set_outliers_apart(f.cur, f.ref, TH)
    changes, regs = against_previous(f, inc, run_noise(f.cur, inc), "previous", TH, [])
    assert ("qwen35_mtp", "decode_tps") in _fleet_regs(regs) and {r.against for r in regs} == {"previous"}
    assert not [r for r in regs if r.module != FLEET and r.metric == "decode_tps"]  # the fleet's, not per module
    assert changes
    alone = prepare_frames(f.rows, None, None, TH)
    assert against_previous(alone, inc, run_noise(alone.cur, inc), "previous", TH, []) == ([], [])
