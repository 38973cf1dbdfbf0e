"""The analysis' shortcuts over a million rows equal, to the bit, the plain computation they stand for.

Outlier statistics over (module, key) runs against the same statistics of the long (row, metric) entries; the
fleet's comparison with a previous run of a few modules over those rows against that over every row;
per-row flag counts read as words against a product with ones; the rows' cell order by a transposed copy
against a gather; the included rows' extremes from every row's against those of the included rows taken
apart; medians of runs with zeros of both signs against pandas.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from controller.report.analysis.compare import diff_to_previous, fleet_compare, previous_match
from controller.report.analysis.frame import Names, _reordering, positions_taker, prepare
from controller.report.analysis.groups import Groups, medians_of_runs, row_counts
from controller.report.analysis.outliers import _frame_stats, fleet_deviation
from controller.report.analysis.summary import included_extremes
from controller.report.model import Thresholds
from controller.report.synth import fleet


@pytest.mark.parametrize("width", [1, 2, 3, 4, 5, 8])
def test_row_counts_read_each_row_as_a_word(width: int) -> None:
    mask = np.random.default_rng(width).random((1001, width)) < 0.5
    want = (mask.view(np.uint8) @ np.ones(width, np.uint8)).astype(np.float64)
    assert row_counts(mask).tobytes() == want.tobytes()
    assert row_counts(mask[::3]).tobytes() == want[::3].tobytes()  # rows not contiguous: the product
    assert row_counts(np.array([[True, False, True, True]])).tolist() == [3.0]
    assert row_counts(np.ones((2, 8), dtype=bool)).tolist() == [8.0, 8.0]


def test_medians_of_runs_with_zeros_of_both_signs_equal_pandas() -> None:
    """A run of even length whose middles are 0.0 and -0.0: +0.0, whichever zero the partition lands on."""
    values = np.array([-0.0, 0.0, 1.0, -1.0, 0.0, -0.0, -0.0, 0.0, 2.0, -2.0, 5.0, -0.0, 3.0])
    starts, ids = np.array([0, 4, 8]), np.array([2, 5, 9])
    got = medians_of_runs(values, starts, ids)
    assert got is not None
    want = pd.Series(values).groupby(np.repeat(ids, [4, 4, 5])).median() + 0.0
    assert got[0].tolist() == [2, 5, 9]
    assert got[1].tobytes() == want.to_numpy().tobytes()
    assert got[1].tolist() == [0.0, 0.0, 2.0] and not np.signbit(got[1]).any()
    assert medians_of_runs(values, starts, ids, max_sizes=1) is None  # lengths 4 and 5


@pytest.mark.parametrize("rows", ["by module and key", "one row fewer", "shuffled"])
def test_outlier_stats_over_runs_equal_those_of_the_entries(reference: pd.DataFrame, rows: str) -> None:
    """Counts and medians per module/key and per module, from (module, key) runs, equal those of the long
    entries (one bincount and a groupby median each). Rows by module and key give cells in key order, every cell
    with every module (put in module order by a transposed copy); one row fewer, not every module in every cell (a
    sort by module); shuffled rows give cells out of key order (a sort by module/key code)."""
    frame = fleet(reference, modules=7, module_factor={"m02": 0.85}, seed=4, run_id="b")
    frame.loc[frame.index % 11 == 0, "decode_tps"] = np.nan
    frame = (frame.sample(frac=1.0, random_state=3) if rows == "shuffled" else
             frame.sort_values(["module", "model_key", "profile"]).iloc[:len(frame) - int(rows == "one row fewer")]
             ).reset_index(drop=True)
    cur = prepare(frame)
    dv = fleet_deviation(cur, Thresholds(), Groups(cur["cell"].to_numpy()))[0]
    keys = dv.modkey[Groups(dv.cell).starts] % dv.nk
    assert bool((np.diff(keys) >= 0).all()) == (rows != "shuffled")
    by_key, by_mod = dv.stats()
    long = dv.entries(np.arange(len(dv.dev)))
    for got, want in ((by_key, _frame_stats(long, "modkey")), (by_mod, _frame_stats(long, "mod"))):
        assert got is not None
        pd.testing.assert_frame_equal(got, want, check_exact=True)
        assert got.to_numpy().tobytes() == want.to_numpy().tobytes()
    assert by_mod is not None and by_mod["cells"].sum() == np.count_nonzero(~np.isnan(dv.dev))


@pytest.mark.parametrize("cells,per,grid", [(5, 4, True), (5, 4, False), (1, 6, True)])
def test_cell_order_by_a_transposed_copy_equals_the_gather(cells: int, per: int, grid: bool) -> None:
    """Rows module by module, every cell in each: the transpose; any other order: the gather."""
    n = cells * per
    order = np.arange(n).reshape(per, cells).T.reshape(-1)
    if not grid:
        order = order[::-1].copy()
    sizes = np.full(cells, per)
    v = np.random.default_rng(0).random(n)
    codes = pd.Categorical.from_codes(np.arange(n) % 3, categories=["a", "b", "c"])
    reorder = _reordering(order, sizes)
    assert reorder(v).tobytes() == v[order].tobytes()
    assert reorder(codes).codes.tolist() == codes.codes[order].tolist()
    assert _reordering(None, sizes)(v) is v


@pytest.mark.parametrize("case", ["slow module", "zero figure", "whole cell left out", "none left out"])
def test_included_extremes_from_every_rows_equal_those_of_the_included_rows(reference: pd.DataFrame,
                                                                              case: str) -> None:
    """A slow module left out holds most cells' minimum throughput (those cells are taken again); a zero
    figure (0.0 and -0.0 are equal) and a cell whose every row is left out take the included rows apart."""
    frame = fleet(reference, modules=80, module_factor={"m04": 0.8}, seed=6, run_id="b")  # 1 of 80 left out
    if case == "zero figure":
        frame.loc[frame.index[:3], "prefill_tps"] = [0.0, -0.0, 0.0]
    cur = prepare(frame)
    mods = cur["module"].to_numpy().astype(str)
    out = {"slow module": mods == "m04", "zero figure": mods == "m04", "none left out": np.zeros(len(cur), bool),
           "whole cell left out": (mods == "m04") | (cur["cell"].to_numpy() == 0)}[case]
    g, gi = Groups(cur["cell"].to_numpy()), Groups(cur["cell"].to_numpy()[~out])
    vals = [cur[m].to_numpy(dtype=float) for m in ("prefill_tps", "decode_tps", "ttft_ms", "vision_fps")]
    lo, hi = included_extremes(g, gi, vals, g.extremes(vals), ~out, rows_per_cell=0)  # a small fleet: taken anyway
    assert [x.tobytes() for x in included_extremes(g, gi, vals, g.extremes(vals), ~out)] == [lo.tobytes(), hi.tobytes()]
    want_lo, want_hi = gi.extremes([v[~out] for v in vals])
    assert lo.tobytes() == want_lo.tobytes() and hi.tobytes() == want_hi.tobytes()
    if case == "slow module":
        assert (lo[:, 1] > g.extremes(vals)[0][:, 1]).sum() > len(gi) // 2  # the minimum moved: taken again


@pytest.mark.parametrize("missing", ["none", "first and last", "one in 100", "most", "every row"])
def test_positions_taker_equals_the_gather(missing: str) -> None:
    """The kept runs copied as slices (few rows missing) or gathered (many) give ``v[rows]``; None gives v."""
    n = 1000
    v = np.random.default_rng(2).random(n)
    gone = {"none": [], "first and last": [0, n - 1], "one in 100": list(range(5, n, 100)),
            "most": list(range(0, n, 2)), "every row": list(range(n))}[missing]
    rows = np.setdiff1d(np.arange(n), gone)
    got = positions_taker(rows, n)(v)
    assert got.tobytes() == v[rows].tobytes() and len(got) == n - len(gone)
    assert not np.shares_memory(got, v)
    assert positions_taker(None, n)(v) is v


@pytest.mark.parametrize("previous", [["m01"], ["m01", "m06"], ["m00", "m01", "m03", "m06"]])
def test_fleet_comparison_over_the_rows_with_a_previous_figure_equals_that_over_every_row(
        reference: pd.DataFrame, previous: list[str]) -> None:
    """A previous run of a few modules: the fleet's comparison over those rows only (the others counted as rows
    of their cells, and as zeros in the references' sums) equals the comparison over every row, to the bit:
    cells (a cell of 14 rows, 2 or 4 of them with a difference, takes the median, not a small fleet's lower
    median), changes and regressions."""
    cur = prepare(fleet(reference, modules=14, seed=4, run_id="b"))  # 14 rows a cell: its median (12 or more)
    prev_rows = fleet(reference, modules=previous, module_factor={"m01": 1.25}, seed=5, run_id="a")
    prev_rows.loc[prev_rows.index % 5 == 0, "decode_tps"] = np.nan  # some previous figures missing
    prev = prepare(prev_rows)
    match = previous_match(cur, prev)
    names, th = Names(cur), Thresholds()
    groups = Groups(cur["cell"].to_numpy())
    live = np.flatnonzero(match[0] >= 0)
    dense = fleet_compare(diff_to_previous(cur, prev, None, match), names, "previous", th, groups=groups)
    sparse = fleet_compare(diff_to_previous(cur, prev, live, match), names, "previous", th, among=(groups, live))
    assert sparse[0] == dense[0] and sparse[1] == dense[1] and len(dense[0])
    pd.testing.assert_frame_equal(sparse[2], dense[2], check_exact=True)
    assert sparse[2]["ref"].to_numpy().tobytes() == dense[2]["ref"].to_numpy().tobytes()
