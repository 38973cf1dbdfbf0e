"""Fleets where modules have arbitrary subsets of keys and profiles (issue 25, item 2).

One module failing one key (a bad server flag in its inventory ``env``) while another has it is an
everyday run, and ``completeness`` crashed on it (``IndexError``: a ``bincount`` without
``minlength`` when the module lacking rows held the last module/key code). Property-based: any
subset of (module, key, profile) rows, empty modules, one module, no rows at all; with and without
a baseline and a previous run that has subsets of its own. The report is made, rendered in every
format, and names every module/key pair that has no rows.
"""

from __future__ import annotations

import json

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from contract.records import RunProgress, RunState
from controller.history import History
from controller.report import analyse, build_report
from controller.report.render import to_json, to_markdown, verdict_line
from controller.report.render.html import to_html
from controller.report.synth import fleet
from tests.support.frames import frame_to_rows

MODULES = [f"m{i:02d}" for i in range(5)]


def _keep(df: pd.DataFrame, mask: list[bool]) -> pd.DataFrame:
    return df[pd.Series(mask, index=df.index)].reset_index(drop=True)


@st.composite
def subsets(draw: st.DrawFn, reference: pd.DataFrame) -> tuple[pd.DataFrame, list[str], list[str], pd.DataFrame | None,
                                                             bool]:
    """(rows of the run, expected modules, expected keys, rows of a previous run or None, with baseline)."""
    n = draw(st.integers(1, len(MODULES)))
    modules = MODULES[:n]
    keys = sorted(set(reference["model_key"]))
    expected_keys = draw(st.lists(st.sampled_from(keys), min_size=1, max_size=len(keys), unique=True))
    cur = fleet(reference, modules=modules, seed=draw(st.integers(0, 3)), run_id="b")
    cur = cur[cur["model_key"].isin(expected_keys)].reset_index(drop=True)
    # per (module, key): all its rows, none, or an arbitrary part of its profiles
    pairs = sorted(set(zip(cur["module"], cur["model_key"], strict=True)))
    choice = draw(st.lists(st.sampled_from(["all", "none", "some"]), min_size=len(pairs), max_size=len(pairs)))
    keep_pair = dict(zip(pairs, choice, strict=True))
    bits = draw(st.lists(st.booleans(), min_size=len(cur), max_size=len(cur)))
    mask = [keep_pair[(m, k)] == "all" or (keep_pair[(m, k)] == "some" and b)
            for m, k, b in zip(cur["module"], cur["model_key"], bits, strict=True)]
    cur = _keep(cur, mask)
    prev = None
    if draw(st.booleans()):
        prev = fleet(reference, modules=modules, seed=7, run_id="a")
        prev = _keep(prev, draw(st.lists(st.booleans(), min_size=len(prev), max_size=len(prev))))
    return cur, modules, expected_keys, prev, draw(st.booleans())


@pytest.mark.slow  # 30 reports rendered as HTML (matplotlib): ~17 s, over the fast tier's budget
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                                   HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_subset_of_keys_and_profiles_gives_a_report(reference: pd.DataFrame, data: st.DataObject) -> None:
    cur, modules, keys, prev, with_baseline = data.draw(subsets(reference))
    rep = analyse(cur, run_id="b", release="1.4.2", baseline=reference if with_baseline else None,
                  previous=prev, expected_modules=modules, expected_keys=keys)
    assert verdict_line(rep).split()[0] in ("PASS", "REGRESSED", "INCOMPLETE", "FAILED", "CANCELLED")
    have = set(zip(cur["module"], cur["model_key"], strict=True))
    missing = [(m, k) for m in modules for k in keys if (m, k) not in have]
    if missing:
        assert rep.verdict != "pass"
        note = next(n for n in rep.notes if n.startswith("no results for"))
        assert note.startswith(f"no results for {len(missing)} module/key pair(s): ")
        for m, k in missing[:8]:
            assert f"{m}/{k}" in note
    else:
        assert not any(n.startswith("no results for") for n in rep.notes)
    doc = json.loads(to_json(rep))
    assert doc["verdict"] == rep.verdict
    assert to_markdown(rep).startswith("# Fleet report")
    assert "<html" in to_html(rep)


def test_one_module_failing_the_last_key_is_named_not_a_crash(reference: pd.DataFrame) -> None:
    """The case found by hand: the last module lacks the last key (its code is the highest of all)."""
    keys = sorted(set(reference["model_key"]))
    cur = fleet(reference, modules=4, seed=1, run_id="b")
    cur = cur[~((cur["module"] == "m03") & (cur["model_key"] == keys[-1]))].reset_index(drop=True)
    rep = analyse(cur, baseline=reference, expected_modules=[f"m{i:02d}" for i in range(4)], expected_keys=keys)
    assert rep.verdict == "incomplete"
    assert f"no results for 1 module/key pair(s): m03/{keys[-1]}" in rep.notes


def test_no_rows_at_all_and_empty_modules(reference: pd.DataFrame) -> None:
    empty = fleet(reference, modules=2, seed=1).iloc[0:0]
    rep = analyse(empty, baseline=reference, expected_modules=["m00", "m01"], expected_keys=["qwen3"])
    assert rep.verdict == "failed"  # nothing measured anywhere
    assert any(n.startswith("no results for 2 module/key pair(s)") for n in rep.notes)
    one = fleet(reference, modules=1, seed=1)
    rep = analyse(one, baseline=reference, expected_modules=["m00", "m01", "m02"],
                  expected_keys=sorted(set(reference["model_key"])))
    assert rep.verdict == "incomplete" and any("m01/" in n and "m02/" in n for n in rep.notes)


@pytest.mark.parametrize("failed_key", ["qwen3", "qwen3vl"])
def test_report_from_history_when_one_module_misses_a_key(reference: pd.DataFrame, tmp_path, failed_key: str) -> None:
    """Through the run history, as ``fleetctl validate``, ``status`` and ``report`` read it."""
    keys = sorted(set(reference["model_key"]))
    h = History(tmp_path / "history.sqlite")
    try:
        h.create_run("r1", release="1.4.2", models=keys, modules=["m00", "m01", "m02"])
        df = fleet(reference, modules=3, seed=2, run_id="r1")
        df = df[~((df["module"] == "m02") & (df["model_key"] == failed_key))]
        h.upsert_rows(frame_to_rows(df))
        h.set_run_state("r1", "failed")
        rep = build_report(h, "r1")
        assert rep.verdict != "pass"
        assert any(f"m02/{failed_key}" in n for n in rep.notes)
    finally:
        h.close()


def test_a_retried_run_is_complete_with_the_keys_each_module_was_asked_for(reference: pd.DataFrame,
                                                                          tmp_path) -> None:
    """Issue 27: ``retry --failed-only`` asks each module for the keys that did not pass there (recorded as the
    run's ``module_models``): the pairs it was not asked for are not missing; one it was asked for still is."""
    keys = sorted(set(reference["model_key"]))[:2]
    h = History(tmp_path / "history.sqlite")
    try:
        h.create_run("r2", release="1.4.2", models=keys, modules=["m00", "m01", "m02"],
                     module_models={"m00": [keys[1]], "m01": [keys[0]]})
        assert h.find_run("r2").module_models == {"m00": (keys[1],), "m01": (keys[0],)}
        assert h.find_run("r2").models_of("m02") == tuple(keys)
        df = fleet(reference, modules=3, seed=2, run_id="r2")
        df = df[df["model_key"].isin(keys)]
        asked = ((df["module"] == "m00") & (df["model_key"] == keys[1])) | (
            (df["module"] == "m01") & (df["model_key"] == keys[0])) | (df["module"] == "m02")
        h.upsert_rows(frame_to_rows(df[asked]))
        h.set_run_state("r2", "done")
        rep = build_report(h, "r2")
        assert not any(n.startswith("no results for") for n in rep.notes), rep.notes
        h.replace_rows("r2", "m01", [])
        rep = build_report(h, "r2")
        assert f"no results for 1 module/key pair(s): m01/{keys[0]}" in rep.notes
    finally:
        h.close()


def test_modules_refused_at_dispatch_make_the_run_incomplete_and_are_named(reference: pd.DataFrame,
                                                                           tmp_path) -> None:
    """Issue 46 item 5, through the run history as ``validate`` records it: one module reserved by another user and
    one bad, refused at dispatch; the two that ran passed: INCOMPLETE (not FAILED), judged on those two, the line
    naming each refused module and why; every module refused: FAILED, with the same reasons."""
    from controller.fleet import REFUSED_STEP, RunView, failed_progress

    h = History(tmp_path / "history.sqlite")
    why = {"m01": "reserved by alice until 15:00 (flashing fw)", "m03": "module bad: agent reports itself unhealthy"}
    try:
        h.create_run("r1", release="1.4.2", models=["qwen3"], modules=["m00", "m01", "m02", "m03"])
        h.upsert_progress_many([failed_progress("r1", m, "1.4.2", REFUSED_STEP, w, 1, 1.0) for m, w in why.items()])
        df = fleet(reference, modules=["m00", "m02"], seed=2, run_id="r1")
        h.upsert_rows(frame_to_rows(df[df["model_key"] == "qwen3"]))
        done = {m: RunProgress(run_id="r1", module=m, state=RunState.DONE) for m in ("m00", "m02")}
        h.upsert_progress_many(done.values())
        state = RunView("r1", ("m00", "m01", "m02", "m03"), h.progress("r1")).state()
        assert state == "done"
        h.set_run_state("r1", state)
        rep = build_report(h, "r1")
        line = verdict_line(rep)
        assert (rep.verdict, rep.modules) == ("incomplete", ("m00", "m02")), line
        assert line.startswith("INCOMPLETE r1 (1.4.2 vs no baseline): no regression; refused"), line
        assert line.endswith(": no regression; refused at dispatch: m01 reserved by alice until 15:00 (flashing fw); "
                             "m03 module bad: agent reports itself unhealthy; judged on the 2 module(s) that ran"), line
        assert not any(n.startswith("no results for") for n in rep.notes), rep.notes
        assert json.loads(to_json(rep))["refused"] == why

        h.create_run("r2", release="1.4.2", models=["qwen3"], modules=["m01", "m03"])
        h.upsert_progress_many([failed_progress("r2", m, "1.4.2", REFUSED_STEP, w, 1, 1.0) for m, w in why.items()])
        state = RunView("r2", ("m01", "m03"), h.progress("r2")).state()
        assert state == "failed"
        h.set_run_state("r2", state)
        rep = build_report(h, "r2")
        assert rep.verdict == "failed"
        assert verdict_line(rep).endswith("refused at dispatch: m01 reserved by alice until 15:00 (flashing fw); "
                                          "m03 module bad: agent reports itself unhealthy; no module ran")
    finally:
        h.close()
