"""The report's frames hold one all-NaN column for every column without a figure, and the comparison with each
module's previous run is taken of the rows asked for: the same values as the whole frame's, less memory (issue 33:
a 1 M-row report's peak RSS)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from controller.report.analysis.build import analyse
from controller.report.analysis.compare import diff_to_previous, diff_to_reference, module_compare, previous_match
from controller.report.analysis.compare import reference as reference_cells
from controller.report.analysis.frame import Names, prepare, take_rows
from controller.report.model import Thresholds
from controller.report.synth import fleet


def test_columns_without_a_figure_share_one_read_only_array(reference: pd.DataFrame) -> None:
    cur = prepare(fleet(reference, modules=4, seed=1, run_id="b"))  # no energy figures
    blank = cur["j_per_token"].to_numpy()
    assert np.isnan(blank).all() and not blank.flags.writeable
    for c in ("b_j_per_token", "tokens_per_j", "b_tokens_per_j", "warmup_s", "b_precompile_fetch_s"):
        assert np.shares_memory(cur[c].to_numpy(), blank), c
    assert not np.shares_memory(cur["b_decode_tps"].to_numpy(), blank)

    keep = np.ones(len(cur), dtype=bool)
    keep[[0, 5, 6]] = False
    inc = take_rows(cur, keep)
    assert len(inc) == len(cur) - 3
    assert np.shares_memory(inc["j_per_token"].to_numpy(), inc["b_warmup_s"].to_numpy())
    assert np.isnan(inc["j_per_token"].to_numpy()).all()
    pd.testing.assert_frame_equal(inc, cur[keep])


def test_differences_to_the_previous_run_of_some_rows_are_those_of_every_row(reference: pd.DataFrame) -> None:
    cur = prepare(fleet(reference, modules=6, module_factor={"m02": 0.9}, seed=2, run_id="b"))
    prev = prepare(fleet(reference, modules=["m00", "m02"], seed=3, run_id="a"))  # a previous run of 2 modules
    match = previous_match(cur, prev)
    every = diff_to_previous(cur, prev)
    rows = np.array([1, 4, 7, len(cur) - 1])
    some = diff_to_previous(cur, prev, rows, match)
    pd.testing.assert_frame_equal(some, every.iloc[rows])
    found = np.flatnonzero(match[0] >= 0)
    assert len(found) == 2 * len(reference)  # the rows of m00 and m02
    names = Names(cur)
    th = Thresholds()
    assert module_compare(diff_to_previous(cur, prev, found, match), names, th) == module_compare(every, names, th)
    regs = module_compare(every, names, th)
    assert {r.module for r in regs} == {"m02"} and len(regs) == 29  # m02, 10 % slower: each key's speed figures


def test_a_report_against_a_previous_run_of_some_modules(reference: pd.DataFrame) -> None:
    cur = fleet(reference, modules=8, module_factor={"m05": 0.7}, seed=4, run_id="b")
    prev = fleet(reference, modules=["m01", "m05"], module_factor={"m01": 1.25}, seed=5, run_id="a")
    rep = analyse(cur, run_id="b", previous=prev)
    assert [o.module for o in rep.outliers] == ["m05"]
    # m01 25 % faster in its previous run, the only included module with one: the fleet's speed regressed on every
    # key (m01's own findings are those, not repeated per module), vision on the one vision key
    keys = ["qwen3", "qwen35", "qwen35_fq", "qwen35_fq_mtp", "qwen35_mtp", "qwen36_fq", "qwen3vl"]
    assert sorted({(r.module, r.model_key, r.metric) for r in rep.regressions}) == sorted(
        [("*", k, m) for k in keys for m in ("decode_tps", "prefill_tps")] + [("*", "qwen3vl", "vision_fps")])
    assert len(rep.changes) == 33


def test_differences_to_the_baseline_without_a_figure_share_one_array(reference: pd.DataFrame) -> None:
    cur = prepare(fleet(reference, modules=3, seed=6, run_id="b"))
    d, ref = diff_to_reference(cur, reference_cells(prepare(reference)))
    assert np.shares_memory(d["d_j_per_token"].to_numpy(), d["d_warmup_s"].to_numpy())
    assert np.isnan(d["d_j_per_token"].to_numpy()).all()
    expected = cur["b_decode_tps"].to_numpy() - ref["r_decode_tps"].reindex(cur["cell"].to_numpy()).to_numpy()
    np.testing.assert_array_equal(d["d_decode_tps"].to_numpy(), expected)
    assert not np.isnan(expected).all()
