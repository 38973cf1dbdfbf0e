"""``fleetctl runs`` (and the API's runs listing) show the state the broker holds of a run the history still
holds as running (issue 27: a run that ended minutes ago showed ``running`` until another verb synced it), read
without writing the history. Fast: an embedded broker's files written here, no worker."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from contract.celery_app import make_app
from contract.kv import KV
from contract.records import RunProgress, RunState
from contract.settings import BrokerSettings
from controller.history import History
from tests.support.cli import closed_port, run_main


def _progress(run_id: str, module: str, state: RunState, at: float) -> RunProgress:
    return RunProgress(run_id=run_id, module=module, release="1.4.1", state=state, step=state.value, keys_total=1,
                       keys_done=int(state.terminal), updated_at=at, started_at=at - 5,
                       finished_at=at if state.terminal else None)


@pytest.fixture
def history(env: Path) -> History:
    """r-ended (both modules ended on the broker), r-going (one still benchmarking there), r-old (ended, synced)."""
    h = History(env / "history.sqlite")
    now = time.time()
    for rid in ("r-old", "r-ended", "r-going"):
        h.create_run(rid, release="1.4.1", models=("qwen3",), modules=["m1", "m2"])
        h.upsert_progress_many([_progress(rid, m, RunState.BENCHMARKING, now - 60) for m in ("m1", "m2")])
        time.sleep(0.01)  # created_at orders the runs
    h.upsert_progress_many([_progress("r-old", m, RunState.DONE, now - 50) for m in ("m1", "m2")])
    h.set_run_state("r-old", "done")
    kv = KV(make_app(BrokerSettings(broker_url="filesystem://", data_dir=env / "fleet")))
    kv.put_progress(_progress("r-ended", "m1", RunState.DONE, now - 10))
    kv.put_progress(_progress("r-ended", "m2", RunState.FAILED, now - 5))
    kv.put_progress(_progress("r-going", "m1", RunState.DONE, now - 10))
    kv.put_progress(_progress("r-going", "m2", RunState.BENCHMARKING, now - 5))
    return h


def test_runs_shows_the_state_the_broker_holds_without_writing_the_history(history: History, env: Path, capsys):
    before = (env / "history.sqlite").stat().st_mtime_ns, (env / "history.sqlite-wal").stat().st_size
    code, out, err = run_main(capsys, "runs", "-o", "json")
    assert code == 0, err
    assert {r["run_id"]: r["state"] for r in json.loads(out)} == {"r-going": "running", "r-ended": "failed",
                                                                   "r-old": "done"}
    ended = history.run("r-ended")
    assert ended is not None and ended.state == "running"  # read, not written: `fleetctl status` records it
    assert ((env / "history.sqlite").stat().st_mtime_ns, (env / "history.sqlite-wal").stat().st_size) == before
    code, out, _ = run_main(capsys, "runs")
    assert code == 0 and "r-ended" in out and "failed" in out


def test_runs_with_the_broker_unreachable_shows_the_history_and_says_so(history: History, capsys, monkeypatch):
    port = closed_port()
    monkeypatch.setenv("FLEET_BROKER_URL", f"redis://127.0.0.1:{port}/0")
    code, out, err = run_main(capsys, "runs", "-o", "json")
    assert code == 0, err
    assert {r["run_id"]: r["state"] for r in json.loads(out)} == {"r-going": "running", "r-ended": "running",
                                                                   "r-old": "done"}
    assert len(err.splitlines()) == 1 and err.startswith(f"note: broker redis://127.0.0.1:{port}/0 unreachable: ")
    assert err.endswith(": the states of running runs are the history's\n"), err


def test_the_api_lists_runs_in_the_state_the_broker_holds(history: History, env: Path):
    from fastapi.testclient import TestClient

    from controller.serve.api import Tokens, create_app
    from controller.settings import ControllerSettings
    from tests.support.http_servers import TOKEN, write_tokens

    settings = ControllerSettings(broker_url="filesystem://", data_dir=env / "fleet", inventory=env / "inv.toml",
                                  history=env / "history.sqlite")
    tokens = Tokens.load(write_tokens(env / "tokens", TOKEN, "another-token-0123456789"))
    with TestClient(create_app(settings, tokens)) as c:
        r = c.get("/api/v1/runs", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200
    assert {x["run_id"]: x["state"] for x in r.json()} == {"r-going": "running", "r-ended": "failed", "r-old": "done"}


@pytest.mark.slow
def test_runs_reads_the_broker_in_one_round_trip_and_only_for_running_runs(tmp_path_factory, tmp_path: Path):
    """A long history: runs the history holds as ended cost no broker read; the running ones (20 runs of 10
    modules) one MGET, whatever their number."""
    import redis

    from controller.service import Session, runs
    from controller.settings import ControllerSettings
    from tests.support.redis_server import running_redis

    with running_redis(tmp_path_factory) as server:
        settings = ControllerSettings(broker_url=server.url, data_dir=tmp_path / "fleet",
                                      inventory=tmp_path / "inv.toml", history=tmp_path / "history.sqlite")
        h = History(settings.history_path)
        mods = [f"m{i:02d}" for i in range(10)]
        for i in range(300):
            h.create_run(f"r{i:03d}", release="1.4.1", models=("qwen3",), modules=mods)
            if i < 280:
                h.set_run_state(f"r{i:03d}", "done")
        kv = KV(make_app(settings))
        now = time.time()
        for i in range(290, 300):  # half of the running runs ended on the broker
            for m in mods:
                kv.put_progress(_progress(f"r{i:03d}", m, RunState.DONE, now))
        with redis.Redis(port=server.port) as r:
            r.config_resetstat()
            with Session(settings) as s:
                listed = runs(s, limit=300)
            stats = r.info("commandstats")
        assert [x.state for x in listed[:10]] == ["done"] * 10 and [x.state for x in listed[10:20]] == ["running"] * 10
        assert {x.state for x in listed[20:]} == {"done"}
        data = {k: v["calls"] for k, v in stats.items() if k not in ("cmdstat_info", "cmdstat_config|resetstat",
                                                                      "cmdstat_config")}
        connecting = ("cmdstat_client", "cmdstat_hello", "cmdstat_ping")  # redis-py's on a new connection
        assert {k: n for k, n in data.items() if not k.startswith(connecting)} == {"cmdstat_mget": 1}
