"""A heartbeat's age is the broker's, never the agent's clock; the agent's skew is measured and shown.

On the embedded broker the age is the file's mtime (the kernel's clock), on Redis what is left of the
key's fixed expiry (PTTL, the broker's clock). Both are read from a real backend here (Redis: slow tier).
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from contract.celery_app import make_app
from contract.kv import CONFLICT_TTL, HEARTBEAT_TTL, KV, Beat, _key
from contract.records import Heartbeat, RunProgress, RunState
from contract.settings import BrokerSettings
from controller.fleet import Fleet, conflict_note, derive_state, liveness, skew_warning
from controller.fleet.collect import START_TIMEOUT
from controller.history import History
from controller.inventory import Module
from controller.serve.metrics import ControllerCollector, ModuleReading
from tests.support.redis_server import running_redis


@pytest.fixture(params=["embedded", pytest.param("redis", marks=[pytest.mark.slow, pytest.mark.redis])])
def settings(request: pytest.FixtureRequest, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory):
    if request.param == "embedded":
        yield BrokerSettings(broker_url="filesystem://", data_dir=tmp_path, offline_after=30.0)
        return
    with running_redis(tmp_path_factory) as server:
        yield BrokerSettings(broker_url=server.url, data_dir=tmp_path, offline_after=30.0)


@pytest.fixture
def kv(settings: BrokerSettings):
    app = make_app(settings)
    yield KV(app)
    app.close()


def age_back(kv: KV, key: str, seconds: float, ttl: int) -> None:
    """Make ``key`` look written ``seconds`` ago to the broker (file: its mtime; Redis: less expiry left)."""
    from celery.backends.filesystem import FilesystemBackend

    if isinstance(kv.backend, FilesystemBackend):
        path = os.fsdecode(kv.backend._filename(key.encode()))
        t = time.time() - seconds
        os.utime(path, (t, t))
    else:
        kv.backend.client.pexpire(key, int((ttl - seconds) * 1000))


def beat(module: str, offset: float, **kw: Any) -> Heartbeat:
    return Heartbeat(module=module, agent_version="t", ts=time.time() + offset, **kw)


@pytest.mark.parametrize("offset", [-300.0, 120.0, 0.0])
def test_the_age_of_a_beat_is_the_brokers_and_the_skew_is_measured(kv: KV, offset: float) -> None:
    kv.put_heartbeat(beat("m1", offset))
    b = kv.beats(["m1", "never"])
    assert b["never"] is None
    got = b["m1"]
    assert got is not None and got.measured
    assert abs(got.at - time.time()) < 1.0  # when the broker took it, not hb.ts
    assert got.skew is not None and abs(got.skew - offset) < 1.0
    age_back(kv, _key("hb", "m1"), 100.0, HEARTBEAT_TTL)
    aged = kv.beats(["m1"])["m1"]
    assert aged is not None and abs(time.time() - aged.at - 100.0) < 1.5


def test_a_beat_without_the_fixed_expiry_is_not_measured(kv: KV) -> None:
    """A writer that set another expiry (an older agent): its ts is all there is, and the skew is unknown."""
    from celery.backends.filesystem import FilesystemBackend

    if isinstance(kv.backend, FilesystemBackend):
        pytest.skip("the embedded broker's files always carry their mtime")
    hb = beat("m1", -300.0)
    kv.put(_key("hb", "m1"), hb.model_dump(mode="json"), ex=HEARTBEAT_TTL * 2)
    got = kv.beats(["m1"])["m1"]
    assert got == Beat(hb, hb.ts, False) and got.skew is None


def modules(*names: str) -> list[Module]:
    return [Module(name=n, transport="local") for n in names]


def test_statuses_by_the_brokers_clock_with_the_skew_warned(settings: BrokerSettings, kv: KV) -> None:
    kv.put_heartbeat(beat("behind", -300.0))
    kv.put_heartbeat(beat("ahead", 120.0))
    kv.put_heartbeat(beat("fine", 5.0))
    kv.put_heartbeat(beat("dead-ahead", 120.0))
    age_back(kv, _key("hb", "dead-ahead"), 45.0, HEARTBEAT_TTL)  # its agent died 45 s ago, its clock is ahead
    fleet = Fleet(settings, History(":memory:"), clock_skew_warn=30.0)
    try:
        st = fleet.statuses(modules("behind", "ahead", "fine", "dead-ahead"))
    finally:
        fleet.close()
    assert {n: s.state for n, s in st.items()} == {"behind": "idle", "ahead": "idle", "fine": "idle",
                                                   "dead-ahead": "unreachable"}
    assert "clock 300 s behind the controller's (warning past 30 s" in st["behind"].reason
    assert st["ahead"].reason.startswith("clock 120 s ahead of the controller's")
    assert st["fine"].reason == ""
    assert re.match(r"no heartbeat for 4[5-9] s", st["dead-ahead"].reason), st["dead-ahead"].reason  # 45 s, + load
    assert abs((st["behind"].skew or 0) + 300) < 1 and abs((st["ahead"].age or 99) - 0) < 1

    reg = CollectorRegistry()
    reg.register(ControllerCollector(History(":memory:"), lambda: {n: ModuleReading(s.state, s.skew)
                                                                   for n, s in st.items()}, dict))
    got = reg.get_sample_value("m1000_fleet_module_clock_skew_seconds", {"module": "behind"})
    assert got is not None and abs(got + 300) < 1


def test_the_conflict_note_is_shown_for_a_short_while_by_the_brokers_clock(settings: BrokerSettings, kv: KV) -> None:
    kv.put_heartbeat(beat("m1", 0.0))
    kv.put_conflict("m1", {"host": "twin", "pid": 4242, "ts": time.time() - 86400,  # its own clock: not read
                           "held_by": {"host": "first", "pid": 7}})
    fleet = Fleet(settings, History(":memory:"))
    try:
        reason = fleet.statuses(modules("m1"))["m1"].reason
        assert reason.startswith("name conflict: a second agent on twin (pid 4242) was refused and exited 0 s ago; "
                                 "the name is held by first (pid 7)"), reason
        age_back(kv, _key("conflict", "m1"), CONFLICT_TTL + 1, CONFLICT_TTL)
        assert fleet.statuses(modules("m1"))["m1"].reason == ""
    finally:
        fleet.close()


def test_conflict_note_pure() -> None:
    rec = {"host": "h2", "pid": 9, "held_by": {"host": "h1", "pid": 1}}
    assert conflict_note(None, 100.0) == ""
    assert conflict_note((rec, None), 100.0) == ""
    assert "exited 10 s ago" in conflict_note((rec, 90.0), 100.0)
    assert conflict_note((rec, 100.0 - CONFLICT_TTL), 100.0) == ""


def b(ts: float, at: float, **kw: Any) -> Beat:
    return Beat(Heartbeat(module="m", agent_version="1", ts=ts, **kw), at)


def test_derive_state_reads_the_brokers_time_not_the_agents() -> None:
    assert derive_state(b(ts=-200.0, at=99.0), 100.0, offline_after=30.0)[0] == "idle"  # agent 300 s behind
    dead = b(ts=240.0, at=60.0, run_id="r1")  # its clock 180 s ahead; the broker took its last beat 40 s ago
    assert derive_state(dead, 100.0, offline_after=30.0, lost_after=600.0) == (
        "unreachable", "no heartbeat for 40 s, run r1 goes on")


def test_liveness_reads_the_agents_run_times_through_its_skew() -> None:
    s = BrokerSettings(lost_after=600.0, run_time_limit=4000.0)
    now = 10_000.0
    # 399 s behind, idle and beating: its run's end was lost on the way; it last reported 10 s ago (not 409 s)
    p = RunProgress(run_id="r", module="m", state=RunState.BENCHMARKING, started_at=now - 420.0,
                    updated_at=now - 409.0)

    def idle_at(t: float) -> str | None:
        return liveness(p, b(ts=t - 400.0, at=t - 1.0), t, dispatched_at=now - 30.0, settings=s)

    assert idle_at(now) is None
    assert idle_at(now + START_TIMEOUT - 20.0) is None
    assert (idle_at(now + START_TIMEOUT) or "").startswith(
        f"end lost: the module is idle and its run last reported {START_TIMEOUT + 10.0:.0f} s ago")
    # one 600 s ahead: its run started 100 s ago though its clock wrote "in 500 s"; the deadline counts from then
    p2 = RunProgress(run_id="r", module="m", state=RunState.BENCHMARKING, started_at=now + 500.0, updated_at=now)

    def at(t: float) -> str | None:  # the module still beating at t
        return liveness(p2, b(ts=t + 600.0, at=t, run_id="r"), t, dispatched_at=now - 100.0, settings=s)

    assert at(now - 100.0 + s.module_deadline - 50.0) is None
    assert (at(now - 100.0 + s.module_deadline + 50.0) or "").startswith(
        f"deadline passed: running for {s.module_deadline + 50.0:.0f} s")


def test_skew_warning() -> None:
    assert skew_warning(None, 30.0) == "" and skew_warning(-29.0, 30.0) == ""
    assert skew_warning(-31.4, 30.0).startswith("clock 31 s behind the controller's")
    assert skew_warning(45.0, 30.0).startswith("clock 45 s ahead of the controller's")
