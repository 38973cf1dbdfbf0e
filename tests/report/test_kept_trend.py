"""The change points the history keeps of itself (ADR 0043): the same records as a search of the rows, computed once
per history version; and the path that ends a run searches only the run's own series, and nothing at all while
the history holds too few releases for a change point."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import controller.report.trend as trend
from controller.history import History
from controller.report import kept
from controller.report.load import trend_frames
from controller.report.trend import TrendQuery, changes, release_values, trend_records
from controller.service.lifecycle import queue_change_points
from tests.support.frames import reference  # noqa: F401 - the fixture, registered by name
from tests.support.trend import MODULES, add_release, release_history

SLOWER = {("qwen3", "decode_tps"): 0.10}


@pytest.fixture()
def history(tmp_path: Path, reference):  # noqa: F811
    h = release_history(tmp_path / "history.sqlite", reference, releases=9, regress=SLOWER)  # the change at 1.6.0
    yield h
    h.close()


def _no_search(*_: Any, **__: Any) -> Any:
    raise AssertionError("the change-point search ran")


def test_kept_findings_give_the_records_a_search_of_the_rows_gives(history, monkeypatch) -> None:
    profile = sorted(history.row_frame(["run-0"])["profile"].astype(str).unique())[0]
    queries = [TrendQuery(), TrendQuery(metric="decode_tps"), TrendQuery(models=("qwen3",), profile=profile),
               TrendQuery(devices=frozenset({"m01"})), TrendQuery(models=("nope",))]
    searched = [trend_records(*trend_frames(history, q), q) for q in queries]
    assert searched[0].records and searched[0].records[0]["release"] == "1.6.0"  # there is something to find
    assert [kept.trend_of(history, q) for q in queries] == searched  # computed once, kept
    monkeypatch.setattr(kept, "changes", _no_search)
    assert [kept.trend_of(history, q) for q in queries[:4]] == searched[:4]  # read, not searched again
    with pytest.raises(Exception, match="profile 'nope': no rows of it in the history"):
        kept.trend_of(history, TrendQuery(profile="nope"))


def test_a_run_stored_makes_the_kept_findings_stale(history, reference) -> None:  # noqa: F811
    first = kept.keep_findings(history)
    assert kept.read_kept(history) == first
    rows, runs = trend_frames(history, TrendQuery())
    vals = release_values(rows, runs, ["decode_tps", "tpot_ms"])
    assert {("qwen3", m) for m in vals["metric"]} <= first.series  # /metrics' zeros: every series with a value
    assert kept.in_force_counts(first)[("qwen3", "decode_tps", "fleet")] == sum(
        c.change.in_force and c.module == "*" and c.metric == "decode_tps" for c in changes(rows, runs))
    add_release(history, reference, 9, regress=SLOWER)
    assert kept.read_kept(history) is None  # another version: computed again by the next reader
    assert kept.read_kept(history, current=False) == first  # what /metrics answers meanwhile
    assert kept.current_findings(history).version == history.trend_version() != first.version


def test_judging_a_run_of_the_only_release_searches_nothing(tmp_path: Path, reference, monkeypatch) -> None:  # noqa: F811
    h = History(tmp_path / "history.sqlite")
    try:
        for i in range(3):  # three runs, one release: no series can have a change point
            add_release(h, reference, 4)  # run-4, release 1.4.0, stored again (its rows the same)
            h.create_run(f"again-{i}", release="1.4.0", models=["qwen3"], modules=MODULES)
        import controller.report.load as load

        monkeypatch.setattr(load, "history_frames", _no_search)
        monkeypatch.setattr(trend, "new_changes", _no_search)
        assert queue_change_points(h, h.find_run("run-4"), "pass", "done") == 0
    finally:
        h.close()


def test_judging_a_run_searches_its_own_series_only(history, reference, monkeypatch) -> None:  # noqa: F811
    ref = reference[reference["model_key"] == "qwen3"]
    profile = str(ref["profile"].iloc[0])
    built: list[int] = []
    analyse = trend.analyse_many

    def counted(series: Sequence[Any], settings: Any = None) -> Any:
        built.append(len(series))
        return analyse(series, settings)

    monkeypatch.setattr(trend, "analyse_many", counted)
    from controller.report.synth import fleet
    from tests.support.frames import frame_to_rows

    df = fleet(ref[ref["profile"] == profile], modules=["m01"], noise=0.01, seed=99, run_id="one", release="1.9.0",
               regress=SLOWER)  # one module, one profile
    history.create_run("one", release="1.9.0", models=["qwen3"], modules=["m01"])
    history.upsert_rows(frame_to_rows(df))
    history.set_run_state("one", "done")
    queue_change_points(history, history.find_run("one"), "pass", "done")
    metrics = [m for m in trend.METRICS if df[m].notna().any()]
    assert built and built[0] == 2 * len(metrics)  # (qwen3, its profile, each metric): the fleet's and m01's
    whole = len(trend._release_series(*trend_frames(history, TrendQuery()), metrics,
                                      trend.release_order(trend_frames(history, TrendQuery())[1]), modules=True))
    assert whole > 10 * built[0]  # what a search of every series of its key would have built


def test_a_scrape_does_not_wait_for_the_search_it_starts(history, monkeypatch) -> None:
    import threading
    import time

    from controller.serve.metrics import ControllerCollector

    go = threading.Event()
    keep = kept.keep_findings

    def slow(h: History) -> kept.KeptFindings:
        go.wait(30)  # a search that takes as long as the test wants
        return keep(h)

    monkeypatch.setattr(kept, "keep_findings", slow)
    c = ControllerCollector(history, dict, dict, trend_wait=0.05)

    def trend_samples() -> int:
        return sum(len(f.samples) for f in c.collect() if f.name == "m1000_trend_change_points")

    t = time.perf_counter()
    assert trend_samples() == 0 and c.trend_computing()  # none kept yet: answered without them
    assert time.perf_counter() - t < 5
    go.set()
    while c.trend_computing():
        time.sleep(0.01)
    assert trend_samples() > 0  # kept by the search it started
