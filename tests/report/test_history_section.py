"""The HTML report's "History" section: one chart per series of the run's keys with a change point in force or at
the run's release, change points marked; one muted line when the history is too short."""

from __future__ import annotations

import re

import pytest

from controller.report.load import build_report, history_frames
from controller.report.render.html import to_html
from controller.report.trend import MIN_RELEASES, history_section
from tests.support.trend import release_history


@pytest.mark.slow  # HTML reports drawn by matplotlib: over the fast tier's 2 s budget
def test_history_section_draws_the_moved_series_with_its_change_point(reference, tmp_path):
    h = release_history(tmp_path / "history.sqlite", reference, regress={("qwen3", "decode_tps"): 0.10})
    try:
        rep = build_report(h, "run-11", with_history=True)
        sec = rep.history
        assert sec is not None and sec.releases == 12
        fleet = [s for s in sec.series if s.scope == "fleet"]
        assert fleet and {(s.model_key, s.metric) for s in fleet} <= {("qwen3", "decode_tps"), ("qwen3", "tpot_ms")}
        s = fleet[0]
        assert s.releases[s.marks[0]] == "1.6.0" and s.in_force == (True,) and len(s.values) == 12
        html = to_html(rep)
        body = html.split("<h2>History</h2>", 1)[1]
        assert body.count("<svg") == len(sec.series)
        assert f"qwen3 {s.profile} {s.metric} (fleet)" in body
        assert re.search(r"-(9|10|11)\.\d%", body)  # the change's size at its mark
        assert "<h2>History</h2>" not in to_html(build_report(h, "run-11"))  # only when asked for
    finally:
        h.close()


def test_history_section_says_when_the_history_is_too_short(reference, tmp_path):
    h = release_history(tmp_path / "history.sqlite", reference, releases=4)
    try:
        html = to_html(build_report(h, "run-3", with_history=True))
        body = html.split("<h2>History</h2>", 1)[1]
        assert f"4 releases in the\nhistory: no change point can be named under {MIN_RELEASES}" in body
        assert "<svg" not in body.split("</p>", 1)[0]
    finally:
        h.close()


def test_history_section_reads_only_the_runs_keys(reference, tmp_path):
    h = release_history(tmp_path / "history.sqlite", reference)
    try:
        rows, runs = history_frames(h, ["qwen3vl"])
        assert len(rows) == 0 and len(runs) == 12
        assert set(history_frames(h, ["qwen3"])[0]["model_key"]) == {"qwen3"}
        assert history_section(rows, runs, "1.11.0").series == ()
    finally:
        h.close()


def test_history_frames_of_some_metrics_are_those_columns_of_the_whole_read(reference, tmp_path):
    """``metrics``: the series' fields and those metrics only (default: every metric; column files and SQLite
    alike), the same values as the whole read's columns; the trend's records over them are the same records."""
    from contract.records import METRICS
    from controller.report.load import SERIES_FIELDS, read_rows
    from controller.report.trend import TrendQuery, trend_records

    h = release_history(tmp_path / "history.sqlite", reference, regress={("qwen3", "decode_tps"): 0.10})
    try:
        every, runs = history_frames(h, ["qwen3"])
        whole = read_rows(h, list(runs["run_id"]), model_keys=["qwen3"])
        some, runs2 = history_frames(h, ["qwen3"], metrics=["decode_tps"])
        assert list(every.columns) == [*SERIES_FIELDS, *METRICS] and len(whole.columns) > 40
        assert list(some.columns) == [*SERIES_FIELDS, "decode_tps"]
        assert every.equals(whole[list(every.columns)]) and some.equals(whole[list(some.columns)])
        assert runs2.equals(runs)
        for query in (TrendQuery(models=("qwen3",), metric="decode_tps"), TrendQuery(models=("qwen3",))):
            got, want = trend_records(some if query.metric else every, runs, query), trend_records(whole, runs, query)
            assert got == want and "1.6.0" in [r["release"] for r in got.records]
        assert list(history_frames(h, ["nokey"], metrics=["ttft_ms"])[0].columns) == [*SERIES_FIELDS, "ttft_ms"]
    finally:
        h.close()


@pytest.mark.slow  # HTML reports drawn by matplotlib
def test_history_section_draws_a_drift_as_one_span(reference, tmp_path):
    """decode_tps 1.5 % slower a release from 1.3.0 on: the fleet series' change is one drift, drawn as a span
    from its first release to its last with its whole size, not a staircase of dashed lines."""
    from tests.support.trend import add_release

    h = release_history(tmp_path / "history.sqlite", reference, releases=0)
    try:
        for i in range(16):
            add_release(h, reference, i, regress={("qwen3", "decode_tps"): 0.015 * max(0, i - 2)})
        rep = build_report(h, "run-15", with_history=True)
        assert rep.history is not None
        drifts = [s for s in rep.history.series if s.scope == "fleet" and s.metric == "decode_tps"
                  and any(end > at for at, end in zip(s.marks, s.ends, strict=True))]
        assert drifts, rep.history.series
        s = drifts[0]
        assert len(s.marks) == 1 and s.ends[0] - s.marks[0] >= 8
        body = to_html(rep).split("<h2>History</h2>", 1)[1]
        assert re.search(r"-1\d\.\d% drift", body)
    finally:
        h.close()
