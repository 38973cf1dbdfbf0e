"""A sync pass over the embedded broker's real files (fast tier, no worker): it writes only what changed, and takes
at most FINALS_PER_PASS final states (and parses at most PARSES_PER_PASS changed records) a pass, the others the
next, none of them given up meanwhile."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from contract.digest import seal
from contract.records import Heartbeat, KeyOutcome, KeyStatus, ResultRow, RunProgress, RunState
from controller.fleet import Fleet, collect
from controller.history import History
from controller.settings import ControllerSettings

MODULES = [f"m{i}" for i in range(5)]


@pytest.fixture
def ctl(tmp_path: Path):
    settings = ControllerSettings(broker_url="filesystem://", data_dir=tmp_path / "fleet",
                                  history=tmp_path / "history.sqlite")
    history = History(tmp_path / "history.sqlite")
    fleet = Fleet(settings, history)
    history.create_run("r1", release="1.4.1", models=["qwen3"], modules=MODULES)
    yield fleet, history
    fleet.close()
    history.close()


def _running(m: str, progress: float) -> RunProgress:
    now = time.time()
    return RunProgress(run_id="r1", module=m, release="1.4.1", state=RunState.BENCHMARKING, step="benchmark",
                       keys_total=1, started_at=now - 5, updated_at=now, progress=progress)


def _rows(m: str) -> list[ResultRow]:
    return [ResultRow(run_id="r1", module=m, release="1.4.1", model_key="qwen3", table="sweep", profile=f"128:{i}",
                      model="Qwen3", ttft_ms=10.0 + i) for i in range(2)]


def test_a_pass_writes_only_what_changed(ctl):
    fleet, history = ctl
    for m in MODULES:
        fleet.kv.put_heartbeat(Heartbeat(module=m, agent_version="t", ts=time.time(), run_id="r1"))
        fleet.kv.put_progress(_running(m, 0.1))
    fleet.sync("r1")
    fleet.sync("r1")  # reads the history's records written by the first pass
    before = history.conn.total_changes
    fleet.sync("r1")
    assert history.conn.total_changes == before  # nothing changed: nothing written
    fleet.kv.put_progress(_running("m3", 0.5))
    view = fleet.sync("r1")
    assert history.conn.total_changes == before + 1 and view.progress["m3"].progress == 0.5
    assert history.progress("r1")["m3"].progress == 0.5 and history.progress("r1")["m2"].progress == 0.1


@pytest.mark.parametrize("bound", ["FINALS_PER_PASS", "PARSES_PER_PASS"])
def test_final_states_beyond_a_pass_bound_wait_for_the_next_pass_unjudged_and_are_not_lost(ctl, monkeypatch, bound):
    """Beyond the final states a pass takes, or the changed records it parses, the others wait for the next pass."""
    fleet, history = ctl
    monkeypatch.setattr(collect, bound, 2)
    now = time.time()
    for m in MODULES:
        fleet.kv.put_heartbeat(Heartbeat(module=m, agent_version="t", ts=now))  # idle: the run ended there
        fleet.kv.put_rows("r1", m, _rows(m))
        fleet.kv.put_progress(seal(RunProgress(
            run_id="r1", module=m, release="1.4.1", state=RunState.DONE, step="done", keys_total=1, keys_done=1,
            rows=2, started_at=now - 5, updated_at=now, finished_at=now,
            outcomes=(KeyOutcome(model_key="qwen3", status="passed", rows=2),)), _rows(m)))
    # an hour on: every module idle since, a state not taken (or not parsed) yet would be given up if judged ("end
    # lost" after START_TIMEOUT, "never started" for one idle since dispatch)
    later = now + 3600
    states = [sorted(p.state.value for p in fleet.sync("r1", now=later).progress.values() if p) for _ in range(3)]
    assert states == [["done", "done"], ["done"] * 4, ["done"] * 5]
    assert history.run("r1").state == "done" and history.row_count("r1") == 10
    assert not [msg for _, _, msg in history.events("r1") if "lost" in msg]


def test_states_count_a_done_run_with_a_failed_key_and_end_the_streak_at_a_pass(ctl):
    from controller.inventory import Module

    fleet, history = ctl
    now = time.time()

    def part(run_id: str, m: str, key: KeyStatus, at: float) -> None:
        history.create_run(run_id, release="1.4.1", models=["qwen3"], modules=[m])
        history.upsert_progress(RunProgress(run_id=run_id, module=m, release="1.4.1", state=RunState.DONE,
                                            keys_total=1, started_at=at - 5, updated_at=at, finished_at=at,
                                            outcomes=(KeyOutcome(model_key="qwen3", status=key),)))

    for i in range(3):  # m0: three runs in a row with a failed key; m1: the same, then one that passed
        part(f"f{i}", "m0", "failed", now - 100 + i)
        part(f"g{i}", "m1", "failed", now - 100 + i)
    part("p", "m1", "passed", now - 50)
    for m in ("m0", "m1"):
        fleet.kv.put_heartbeat(Heartbeat(module=m, agent_version="t", ts=time.time()))
    st = fleet.statuses([Module(name="m0", transport="local"), Module(name="m1", transport="local")])
    assert st["m0"].state == "bad" and st["m0"].reason.startswith("3 failed runs in a row")
    assert (st["m1"].state, st["m1"].reason) == ("idle", "")
    assert history.passed_last() == {"m1"}
