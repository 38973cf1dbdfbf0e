"""Reports identical to the bit to ones saved before the analysis was restructured for speed.

The JSON of three reports (every regression, outlier with its worst cases, change, note and the
whole summary) was saved from the analysis as it stood before ``Deviations`` / ``run_medians``
(and saved again when the key-level estimator became ADR 0016's: only the key-level figures (changes and the
one fleet-wide regression), their p-values, intervals and detail moved; every verdict, finding, outlier and
summary figure stayed; and again when every finding got its interval (docs/adr/0018-intervals-of-findings.md):
only ``ci_low``/``ci_high`` of regressions and outliers were added, and the verdict line's intervals; every
other value compared equal to the bit before the files were written; and when reports got the environments
(docs/adr/0021-environment-fingerprint.md): the keys ``environment`` and ``environment_changes``, empty, added
after ``outlier_telemetry``, nothing else touched; and again when energy came (docs/adr/0022-energy-per-token.md):
only an outlier's ``metric`` (""), ``energy_outliers`` ([]) and the thresholds' ``energy_tolerance`` were added
(and ``jit_compiled``, [], which docs/adr/0023 had added to the JSON), every other value compared equal; and when
start-up costs came (docs/adr/0029-start-up-costs-judged.md): only the thresholds' ``startup_tolerance`` and
``startup_floor_s``); when a run was judged on the modules that ran (issue 46 item 5): the key ``refused``, empty,
after ``capacities`` (taken out before the comparison, the files unchanged; so ``failed_parts``, empty, of issue
49); and when a metric gone became a finding
(issue 45, docs/adr/0038): only odd-both's, by one finding (m00/qwen35 decode_tps missing: its every figure is flagged
invalid), the note of the flagged rows and the verdict line naming that finding first; its changes and summary
compared equal to 1e-12 before it was written):
a 12-module fleet with two slow modules, a key slower on one module, invalid-flagged, missing
and zero figures, flipped answers and a module/key pair missing, against the baseline and a
previous run of 10 modules, rows shuffled; a 40-module fleet with a module/key outlier; and one
read back as the history gives it (categoricals) against its previous run. Every text, count,
flag and order is compared exactly; floats to 1e-12 (relative, or absolute for a change near 0:
a few units in the last place):
numpy's SIMD kernels (``exp``/``log``, ``partition``) differ in the last bit between instruction
sets, so a file saved on one CPU is not bit-equal on another. On one machine, before and after a
change, the reports are compared to the bit (``test_report_bits_stable_in_one_process``).
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from controller.report import analyse
from controller.report.analysis.frame import prepare, take_rows
from controller.report.analysis.groups import Groups
from controller.report.analysis.middles import Middles, included_middles
from controller.report.analysis.outliers import fleet_deviation
from controller.report.load import as_read
from controller.report.model import PRIMARY_METRICS, Thresholds
from controller.report.render import to_json
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
        return to_json(analyse(cur, baseline=reference, previous=prev,
                               expected_modules=[f"m{i:02d}" for i in range(13)],
                               expected_keys=sorted(set(reference["model_key"]))))
    if name == "keyout-base":
        k = fleet(reference, modules=40, module_factor={"m11": 0.9}, seed=12, run_id="b")
        sel = (k["module"] == "m05") & (k["model_key"] == "qwen35")
        for c in ("prefill_tps", "decode_tps"):
            k.loc[sel, c] = k.loc[sel, c] * 0.8
        return to_json(analyse(k, baseline=reference))
    cur = fleet(reference, modules=40, module_factor={"m03": 0.88}, regress={("qwen3", "decode_tps"): 0.08}, seed=1,
                run_id="b")
    prev = fleet(reference, modules=40, module_factor={"m03": 0.88}, seed=2, run_id="a")
    return to_json(analyse(as_read(cur), previous=as_read(prev)))


def _same(got: Any, want: Any, where: str = "") -> None:
    """Equal, floats to 1e-12 relative (see the module's docstring); the first difference named."""
    if isinstance(want, float) and isinstance(got, float):
        assert math.isclose(got, want, rel_tol=1e-12, abs_tol=1e-12), f"{where}: {got!r} != {want!r}"
    elif isinstance(want, dict) and isinstance(got, dict):
        assert list(got) == list(want), f"{where}: keys {list(got)} != {list(want)}"
        for k in want:
            _same(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list) and isinstance(got, list):
        assert len(got) == len(want), f"{where}: {len(got)} items != {len(want)}"
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            _same(a, b, f"{where}[{i}]")
    else:
        assert got == want and type(got) is type(want), f"{where}: {got!r} != {want!r}"


@pytest.mark.parametrize("name", ["odd-both", "keyout-base", "40-prev-read"])
def test_report_identical_to_saved(reference: pd.DataFrame, name: str) -> None:
    saved = json.loads(gzip.decompress((SAVED / f"{name}.json.gz").read_bytes()))
    got = json.loads(_report(name, reference))
    assert got.pop("refused") == {}  # no module refused at dispatch in these
    assert got.pop("failed_parts") == []  # no part failed in these (issue 49: the logs kept beside each failure)
    assert got["verdict_line"] == saved["verdict_line"]
    for part in ("regressions", "outliers", "changes", "notes", "summary"):
        _same(got[part], saved[part], part)
    _same(got, saved)


@pytest.mark.parametrize("name", ["odd-both", "40-prev-read"])
def test_report_bits_stable_in_one_process(reference: pd.DataFrame, name: str) -> None:
    """The same inputs give the same report to the bit, however often it is made (no hidden state)."""
    assert _report(name, reference) == _report(name, reference)


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
    reused = Middles(inc, gi, known=included_middles(cur, groups, known, out, gi))
    assert fresh.lo.to_numpy().tobytes() == reused.lo.to_numpy().tobytes()
    assert fresh.hi.to_numpy().tobytes() == reused.hi.to_numpy().tobytes()
