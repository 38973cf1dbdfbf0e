"""Reports identical to the bit to ones saved before the analysis was restructured for speed.

The JSON of three reports (every regression, outlier with its worst cases, change, note and the
whole summary) was saved from the analysis as it stood before ``Deviations`` / ``run_medians``:
a 12-module fleet with two slow modules, a key slower on one module, invalid-flagged, missing
and zero figures, flipped answers and a module/key pair missing, against the baseline and a
previous run of 10 modules, rows shuffled; a 40-module fleet with a module/key outlier; and one
read back as the history gives it (categoricals) against its previous run. Floats are compared
exactly (JSON keeps every bit of a double).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from controller.report import analyse
from controller.report.analysis import Middles, _included_middles, fleet_deviation, prepare, take_rows
from controller.report.groups import Groups
from controller.report.load import as_read
from controller.report.model import PRIMARY_METRICS, Thresholds
from controller.report.synth import fleet

SAVED = Path(__file__).parent / "data" / "saved"


def _odd(reference: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    cur = fleet(reference, modules=12, module_factor={"m03": 0.85, "m07": 1.2}, seed=5, run_id="b")
    m05 = cur["module"] == "m05"
    cur.loc[m05, "decode_tps"] = cur.loc[m05, "decode_tps"] * np.where(cur.loc[m05, "model_key"] == "qwen35", 0.8, 1.0)
    cur.loc[5:30, "flags"] = "['decode_tps_invalid']"
    cur.loc[40:45, "prefill_tps"] = np.nan
    cur.loc[50:52, "prefill_tps"] = 0.0
    cur.loc[cur["correct"].notna() & (cur.index % 7 == 0), "correct"] = False
    cur = cur[~((cur["module"] == "m09") & (cur["model_key"] == "qwen3"))].reset_index(drop=True)
    return cur, fleet(reference, modules=10, seed=6, run_id="a")


def _report(name: str, reference: pd.DataFrame) -> str:
    if name == "odd-both":
        cur, prev = _odd(reference)
        return analyse(cur, baseline=reference, previous=prev, expected_modules=[f"m{i:02d}" for i in range(13)],
                       expected_keys=sorted(set(reference["model_key"]))).to_json()
    if name == "keyout-base":
        k = fleet(reference, modules=40, module_factor={"m11": 0.9}, seed=12, run_id="b")
        sel = (k["module"] == "m05") & (k["model_key"] == "qwen35")
        for c in ("prefill_tps", "decode_tps"):
            k.loc[sel, c] = k.loc[sel, c] * 0.8
        return analyse(k, baseline=reference).to_json()
    cur = fleet(reference, modules=40, module_factor={"m03": 0.88}, regress={("qwen3", "decode_tps"): 0.08}, seed=1,
                run_id="b")
    prev = fleet(reference, modules=40, module_factor={"m03": 0.88}, seed=2, run_id="a")
    return analyse(as_read(cur), previous=as_read(prev)).to_json()


@pytest.mark.parametrize("name", ["odd-both", "keyout-base", "40-prev-read"])
def test_report_identical_to_saved(reference: pd.DataFrame, name: str) -> None:
    saved = json.loads(gzip.decompress((SAVED / f"{name}.json.gz").read_bytes()))
    got = json.loads(_report(name, reference))
    assert got["verdict_line"] == saved["verdict_line"]
    for part in ("regressions", "outliers", "changes", "notes", "summary"):
        assert got[part] == saved[part], part
    assert got == saved


def test_fleet_middles_stand_in_when_no_row_is_left_out(reference: pd.DataFrame) -> None:
    """With no outlier the included rows are all rows: the fleet's middles of the primary metrics
    (taken for the deviations) stand in for a second partition, to the bit, with invalid, missing
    and zero figures among them; and a report over a fleet without outliers takes that path."""
    cur = prepare(_odd(reference)[0])
    groups = Groups(cur["cell"].to_numpy())
    known = fleet_deviation(cur, Thresholds(), groups)[2]
    assert sorted(known) == sorted(m for m in PRIMARY_METRICS if cur[m].notna().any())
    fresh, reused = Middles(cur, groups), Middles(cur, groups, known=known)
    assert fresh.lo.to_numpy().tobytes() == reused.lo.to_numpy().tobytes()
    assert fresh.hi.to_numpy().tobytes() == reused.hi.to_numpy().tobytes()
    rep = analyse(fleet(reference, modules=8, seed=3), baseline=reference)
    assert rep.outliers == () and len(rep.summary)


@pytest.mark.parametrize("leave_out", ["one module", "two modules", "module/key", "random 40 %"])
def test_included_middles_from_the_fleets_to_the_bit(reference: pd.DataFrame, leave_out: str) -> None:
    """The included rows' middles taken from the fleet's (few rows left out: the figures between
    the fleet's two middles; many: a partition per cell) equal a partition of the included rows,
    with invalid, missing and zero figures among them."""
    cur = prepare(_odd(reference)[0])
    groups = Groups(cur["cell"].to_numpy())
    known = fleet_deviation(cur, Thresholds(), groups)[2]
    mods = cur["module"].to_numpy().astype(str)
    out = {"one module": mods == "m03", "two modules": np.isin(mods, ["m03", "m07"]),
           "module/key": (mods == "m05") & (cur["model_key"].to_numpy().astype(str) == "qwen35"),
           "random 40 %": np.random.default_rng(1).random(len(cur)) < 0.4}[leave_out]
    inc = take_rows(cur, ~out)
    gi = Groups(inc["cell"].to_numpy())
    fresh = Middles(inc, gi)
    reused = Middles(inc, gi, known=_included_middles(cur, groups, known, out, gi))
    assert fresh.lo.to_numpy().tobytes() == reused.lo.to_numpy().tobytes()
    assert fresh.hi.to_numpy().tobytes() == reused.hi.to_numpy().tobytes()
