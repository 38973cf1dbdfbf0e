"""Controller collector over a real SQLite history, and the file_sd targets command (fast tier)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agent.tables import parse_seed
from contract.records import ResultRow
from controller.cli.targets import file_sd
from controller.history import History
from controller.inventory import InventoryError, parse_inventory
from controller.serve.metrics import ControllerCollector, deviation, performance_ratio
from tests.metrics.fleetfiles import seed_rows
from tests.support.cli import given_app


@pytest.fixture
def history(tmp_path: Path, seed_text: str) -> Iterator[History]:
    h = History(tmp_path / "history.sqlite")
    h.add_baseline("1.4.1", [r for rows in parse_seed(seed_text).values() for r in rows], source="seed")
    h.create_run("run-1", release="1.4.1", modules=["m-a", "m-b"])
    for module, scale in (("m-a", 1.0), ("m-b", 0.8)):
        h.upsert_rows(r for rows in seed_rows(seed_text, "run-1", module, "1.4.1", scale=scale).values()
                      for r in rows)
    h.set_run_state("run-1", "done", verdict="regression")
    h.create_run("run-2", release="1.4.1", modules=["m-a"])  # running, no rows yet
    yield h
    h.close()


def collector(h: History, **kw: Any) -> ControllerCollector:
    return ControllerCollector(h, lambda: {"m-a": "busy", "m-b": "idle", "m-c": "offline"},
                               lambda: {"module.m-a": {"urgent": 0, "low": 1}, "module.m-b": {"low": 0}}, **kw)


def sample(c: ControllerCollector, name: str, labels: dict[str, str]) -> float | None:
    for fam in c.collect():
        for s in fam.samples:
            if s.name == name and s.labels == labels:
                return s.value
    return None


def test_states_queues_and_verdicts(history: History) -> None:
    c = collector(history)
    assert sample(c, "m1000_fleet_modules", {"state": "busy"}) == 1
    assert sample(c, "m1000_fleet_modules", {"state": "bad"}) == 0
    assert sample(c, "m1000_fleet_module_state", {"module": "m-c", "state": "offline"}) == 1
    assert sample(c, "m1000_fleet_module_state", {"module": "m-c", "state": "idle"}) == 0
    assert sample(c, "m1000_fleet_queue_length", {"queue": "module.m-a", "priority": "low"}) == 1
    assert sample(c, "m1000_fleet_queue_length", {"queue": "module.m-a", "priority": "urgent"}) == 0
    assert sample(c, "m1000_fleet_runs", {"verdict": "regression"}) == 1
    assert sample(c, "m1000_fleet_runs", {"verdict": "none"}) == 1
    assert sample(c, "m1000_fleet_history_up", {}) == 1


def test_deviation_from_baseline_of_latest_run_with_rows(history: History) -> None:
    c = collector(history)
    on_par = {"module": "m-a", "release": "1.4.1", "model_key": "qwen3", "metric": "decode_tps"}
    assert sample(c, "m1000_fleet_baseline_ratio", on_par) == pytest.approx(1.0)
    slow = {**on_par, "module": "m-b"}
    assert sample(c, "m1000_fleet_baseline_ratio", slow) == pytest.approx(0.8)
    # lower-is-better figures are oriented the same way: 0.8 means 20 % worse
    assert sample(c, "m1000_fleet_baseline_ratio", {**slow, "metric": "ttft_ms"}) == pytest.approx(0.8)
    assert sample(c, "m1000_fleet_baseline_regressions", {"module": "m-a", "release": "1.4.1"}) == 0
    assert (sample(c, "m1000_fleet_baseline_regressions", {"module": "m-b", "release": "1.4.1"}) or 0) > 0
    base = sample(c, "m1000_baseline_ttft_seconds", {"baseline": "1.4.1", "model_key": "qwen3", "profile": "128:128"})
    assert base is not None and 0.1 < base < 10


def test_history_failure_keeps_the_scrape(history: History) -> None:
    c = collector(history)
    history.conn.close()
    assert sample(c, "m1000_fleet_history_up", {}) == 0
    assert sample(c, "m1000_fleet_modules", {"state": "busy"}) == 1


def test_broken_state_source_does_not_break_the_scrape(history: History) -> None:
    def boom() -> dict[str, str]:
        raise ConnectionError("broker down")

    c = ControllerCollector(history, boom, lambda: {})
    assert sample(c, "m1000_fleet_history_up", {}) == 1
    assert sample(c, "m1000_fleet_modules", {"state": "busy"}) is None


def test_performance_ratio_and_deviation_are_pure() -> None:
    assert performance_ratio("decode_tps", 90.0, 100.0) == pytest.approx(0.9)
    assert performance_ratio("ttft_ms", 110.0, 100.0) == pytest.approx(100 / 110)
    assert performance_ratio("ttft_ms", None, 100.0) is None
    assert performance_ratio("ttft_ms", 0.0, 100.0) is None
    assert performance_ratio("ttft_ms", math.inf, 1.0) is None
    assert deviation([], {}).ratios == {}


def test_energy_against_the_baseline_is_a_performance_ratio() -> None:
    """J/token is lower-better: 10 % more energy per token is a ratio of 1/1.1 and a cell worse than tolerance."""
    assert performance_ratio("j_per_token", 2.2, 2.0) == pytest.approx(2.0 / 2.2)
    assert performance_ratio("tokens_per_j", 0.45, 0.5) == pytest.approx(0.9)
    row = ResultRow(module="m-a", model_key="qwen3", table="sweep", profile="128:128", model="Qwen3",
                    j_per_token=2.2, tokens_per_j=1 / 2.2)
    dev = deviation([row], {("qwen3", "128:128"): {"j_per_token": 2.0, "tokens_per_j": 0.5}})
    assert dev.ratios == {("qwen3", "j_per_token"): pytest.approx(2.0 / 2.2),
                          ("qwen3", "tokens_per_j"): pytest.approx(1 / 1.1)}
    assert dev.regressions == 2


def test_a_slow_start_against_the_baseline_is_one_cell_past_its_own_tolerance() -> None:
    """A key's server ready time is on each of its rows: 40 % longer is one cell worse, not one per profile; 10 %
    longer is within the start-up tolerance (15 %)."""
    rows = [ResultRow(module="m-a", model_key=k, table="sweep", profile=p, model="M", server_ready_s=s)
            for k, s in (("qwen3", 280.0), ("qwen35", 220.0)) for p in ("128:128", "256:128")]
    base = {(k, p): {"server_ready_s": 200.0} for k in ("qwen3", "qwen35") for p in ("128:128", "256:128")}
    dev = deviation(rows, base)
    assert dev.ratios == {("qwen3", "server_ready_s"): pytest.approx(200 / 280),
                          ("qwen35", "server_ready_s"): pytest.approx(200 / 220)}
    assert dev.regressions == 1


INV = {
    "defaults": {"labels": {"rack": "a"}},
    "module": [
        {"name": "m-a", "host": "192.0.2.11", "labels": {"board": "evt2"}},
        {"name": "m-b", "host": "2001:db8::2", "metrics_port": 9500},
    ],
}


def test_file_sd_from_inventory() -> None:
    groups = file_sd(parse_inventory(INV))
    assert groups == [
        {"targets": ["192.0.2.11:9400"], "labels": {"module": "m-a", "board": "evt2", "rack": "a"}},
        {"targets": ["[2001:db8::2]:9500"], "labels": {"module": "m-b", "rack": "a"}},
    ]


def test_file_sd_refuses_reserved_labels() -> None:
    inv = parse_inventory({"module": [{"name": "m-a", "labels": {"instance": "x"}}]}, path="inv.toml")
    with pytest.raises(InventoryError, match=r"inv.toml: module 'm-a': field 'labels': label name 'instance'"):
        file_sd(inv)


def test_prometheus_targets_command_writes_atomically(tmp_path: Path) -> None:
    app = given_app(inventory=parse_inventory(INV))
    out = tmp_path / "targets" / "agents.json"
    res = CliRunner().invoke(app, ["prometheus-targets", "--out", str(out.parent)])  # --out is a folder
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())[0]["labels"]["module"] == "m-a"
    assert [p.name for p in out.parent.iterdir()] == ["agents.json"]  # no temporary left behind
    res = CliRunner().invoke(app, ["prometheus-targets"])
    assert json.loads(res.stdout)[1]["targets"] == ["[2001:db8::2]:9500"]


def test_change_points_in_force_per_key_metric_and_scope(tmp_path: Path, seed_text: str) -> None:
    from tests.support.frames import rows_frame
    from tests.support.trend import add_release, release_history

    reference = rows_frame([r for rows in parse_seed(seed_text).values() for r in rows])
    h = release_history(tmp_path / "history.sqlite", reference, releases=8, regress={("qwen3", "decode_tps"): 0.10})
    try:
        c = collector(h, trend_wait=60)  # each scrape after a change waits for the findings it starts computing
        labels = {"model_key": "qwen3", "metric": "decode_tps", "scope": "fleet"}
        assert sample(c, "m1000_trend_change_points", labels) == 0  # 2 releases after the change: none named yet
        assert sample(c, "m1000_trend_change_points", {**labels, "scope": "module"}) == 0
        add_release(h, reference, 8, regress={("qwen3", "decode_tps"): 0.10})  # the third names it
        profiles = len(set(reference.loc[reference["model_key"] == "qwen3", "profile"]))
        fleet = sample(c, "m1000_trend_change_points", labels)  # computed again: a run was added
        assert fleet is not None and profiles - 2 <= fleet <= profiles
        assert sample(c, "m1000_trend_change_points", {**labels, "metric": "prefill_tps"}) == 0
    finally:
        h.close()


def test_wait_histogram_is_the_waits_the_history_recorded(tmp_path: Path) -> None:
    """Each module's wait is its start minus the run's last dispatch; the histogram counts exactly those."""
    from contract.records import RunProgress, RunState

    h = History(tmp_path / "waits.sqlite")
    plan = {"r-low": ("low", 1000.0, {"m-a": 1030.0, "m-b": 4000.0}),  # 30 s and 50 min
            "r-urgent": ("urgent", 2000.0, {"m-a": 2000.5}),
            "r-old": ("normal", None, {"m-a": 500.0})}  # dispatched before priorities: from created_at
    for run_id, (priority, at, starts) in plan.items():
        h.create_run(run_id, release="1.4.1", modules=list(starts))
        if at is not None:
            h.set_dispatched(run_id, priority, at)
        for m, started in starts.items():
            h.upsert_progress(RunProgress(run_id=run_id, module=m, release="1.4.1", state=RunState.BENCHMARKING,
                                          started_at=started, updated_at=started))
    created = h.find_run("r-old").created_at
    h.upsert_progress(RunProgress(run_id="r-old", module="m-a", release="1.4.1", state=RunState.BENCHMARKING,
                                  started_at=created + 7.0, updated_at=created + 8.0))
    h.create_run("r-queued", modules=["m-a"])  # not started: no wait yet
    h.set_dispatched("r-queued", "low", 3000.0)
    h.upsert_progress(RunProgress(run_id="r-queued", module="m-a", release="", step="queued", updated_at=3000.0))
    waits = {(r, m): (p, round(w, 3)) for r, m, p, w in h.waits()}
    assert waits == {("r-low", "m-a"): ("low", 30.0), ("r-low", "m-b"): ("low", 3000.0),
                     ("r-urgent", "m-a"): ("urgent", 0.5), ("r-old", "m-a"): ("normal", 7.0)}
    assert h.waits("r-urgent") == [("r-urgent", "m-a", "urgent", 0.5)]
    c = ControllerCollector(h, lambda: {}, lambda: {})
    assert sample(c, "m1000_fleet_run_wait_seconds_count", {"priority": "low"}) == 2
    assert sample(c, "m1000_fleet_run_wait_seconds_sum", {"priority": "low"}) == 3030.0
    assert sample(c, "m1000_fleet_run_wait_seconds_bucket", {"priority": "low", "le": "60.0"}) == 1
    assert sample(c, "m1000_fleet_run_wait_seconds_bucket", {"priority": "low", "le": "3600.0"}) == 2
    assert sample(c, "m1000_fleet_run_wait_seconds_bucket", {"priority": "urgent", "le": "1.0"}) == 1
    assert sample(c, "m1000_fleet_run_wait_seconds_bucket", {"priority": "normal", "le": "1.0"}) == 0
    assert sample(c, "m1000_fleet_run_wait_seconds_bucket", {"priority": "normal", "le": "10.0"}) == 1
    h.close()


def test_a_reserved_module_is_1_with_its_user_and_a_broker_outage_leaves_it_out(history):
    c = collector(history, reserved=lambda: {"m-a": "ann", "m-b": "bob"})
    assert sample(c, "m1000_fleet_module_reserved", {"module": "m-a", "user": "ann"}) == 1
    assert sample(c, "m1000_fleet_module_reserved", {"module": "m-b", "user": "bob"}) == 1
    assert sample(c, "m1000_fleet_module_reserved", {"module": "m-c", "user": "ann"}) is None

    def boom() -> dict[str, str]:
        raise ConnectionError("broker down")

    c = collector(history, reserved=boom)
    assert sample(c, "m1000_fleet_module_reserved", {"module": "m-a", "user": "ann"}) is None
    assert sample(c, "m1000_fleet_module_state", {"module": "m-a", "state": "busy"}) == 1
