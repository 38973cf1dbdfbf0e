"""A rolling upgrade across one contract version (ADR 0051), with real agents of both versions on a real redis-server.

The earlier version is this repository's agent and controller at the last commit of the previous contract version,
unpacked from git (:mod:`tests.support.earlier_contract`) and run with ``PYTHONPATH`` on it. The upgrade order the
operations page gives: the controller first, then the agents one at a time, while a validation runs; and the reverse
(agents first, an earlier controller) works as well for one version.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.store import RunStore
from contract.records import RunState
from contract.version import SCHEMA_VERSION
from tests.support.earlier_contract import earlier_tree
from tests.support.reliability import KEYS, QUICK_ENV, Bench
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow
STOP = {"FLEET_STOP_GRACE": "3"}  # the earlier agents' setting (a constant, 15 s, since issue 50)


@pytest.fixture(scope="module")
def earlier(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return earlier_tree(tmp_path_factory.mktemp("earlier"))[0]


def earlier_prefix(tree: Path) -> tuple[str, ...]:
    """What runs an agent of the earlier tree: its packages first on the path, the venv's dependencies shared."""
    return ("env", f"PYTHONPATH={tree}")


def earlier_fleetctl(b: Bench, tree: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """The earlier controller (``python -m controller`` of the earlier tree; run outside this checkout, whose
    packages would come first on the path)."""
    return subprocess.run([sys.executable, "-m", "controller", *args], env={**b.lab.env(), "PYTHONPATH": str(tree)},
                          cwd=b.lab.base, capture_output=True, text=True, timeout=timeout)


def devices(b: Bench) -> dict[str, dict[str, object]]:
    r = b.lab.fleetctl("devices", "-o", "json")
    assert r.returncode == 0, r.stderr
    return {d["module"]: d for d in json.loads(r.stdout)}


def upgrade(b: Bench, name: str) -> None:
    """Stop the module's agent as a deploy does (SIGTERM: its run is interrupted and re-queued) and start this
    checkout's agent in its place."""
    w = b.lab.workers.pop(name)
    os.kill(w.proc.pid, signal.SIGTERM)
    w.proc.wait(timeout=20)
    b.lab.start([name], sim_env={name: QUICK_ENV})
    wait_for(lambda: (hb := b.fleet.heartbeats([name])[name]) is not None and hb.schema_version == SCHEMA_VERSION, 30,
             f"{name}'s heartbeat of contract {SCHEMA_VERSION}")


def no_refusal(b: Bench, run_id: str, modules: tuple[str, ...]) -> None:
    view = b.fleet.sync(run_id)
    for m in modules:
        p = view.progress[m]
        assert p is not None, f"{run_id} on {m}: no progress"
        assert p.state == RunState.DONE, f"{run_id} on {m}: {p.state.value} ({p.error.one_line() if p.error else ''})"
        assert all(o.status == "passed" for o in p.outcomes), f"{run_id} on {m}: {p.outcomes}"
    events = " ".join(msg for _, m, msg in b.history.events(run_id))
    assert "refused request" not in events and "failed" not in events, events


def test_controller_first_then_agents_one_at_a_time_with_a_run_in_flight(bench_factory, redis_broker, release,
                                                                          quick_release, earlier):
    """A lab of the previous version starts a validation; the controller is upgraded (today's follows the run and
    starts a second, sent to the old agents in their version), then the agents one at a time while the first runs.
    Both runs end with every key passed once and no refusal; ``devices`` flags the agents behind until upgraded."""
    b = bench_factory(redis_broker, 2)
    names = ("sim-01", "sim-02")
    b.lab.start(sim_env={n: STOP for n in names}, argv_prefix=earlier_prefix(earlier))
    before = devices(b)  # today's controller beside the old lab: every agent behind, and what to run
    assert {d["contract"] for d in before.values()} == {SCHEMA_VERSION - 1}
    assert all(d["contract_standing"] == "behind" and f"fleetctl deploy --devices {m}" in str(d["reason"])
               for m, d in before.items()), before
    table = b.lab.fleetctl("devices").stdout
    assert f"{SCHEMA_VERSION - 1} (behind)" in table, table
    r = earlier_fleetctl(b, earlier, "validate", str(release.path), "--models", ",".join(KEYS), "--devices",
                         ",".join(names), "--detach")
    assert r.returncode == 0, r.stderr
    run_id = r.stdout.strip().splitlines()[-1]

    # the controller upgraded: today's from here on; it follows the run the earlier one started
    b.on_key(run_id, "sim-01", KEYS[1])  # in flight: the first key passed, the second benchmarking
    upgrade(b, "sim-01")
    mixed = devices(b)
    assert (mixed["sim-01"]["contract"], mixed["sim-02"]["contract"]) == (SCHEMA_VERSION, SCHEMA_VERSION - 1)
    assert mixed["sim-01"]["contract_standing"] == "current" and "fleetctl deploy" not in str(mixed["sim-01"]["reason"])
    r = b.lab.fleetctl("validate", str(quick_release.path), "--models", "qwen3", "--devices", ",".join(names),
                       "--detach")  # waits behind the first on each module
    assert r.returncode == 0, r.stderr
    second = r.stdout.strip().splitlines()[-1]
    assert f"sim-02: queued; agent contract {SCHEMA_VERSION - 1}, one behind" in r.stderr, r.stderr
    assert "sim-01: queued;" not in r.stderr, r.stderr
    # sim-02's old agent runs today's controller's request, sent in its version
    wait_for(lambda: b.fleet.sync(second).progress["sim-02"].state == RunState.DONE, 90, "sim-02's old agent done")
    upgrade(b, "sim-02")

    b.check_run(run_id, 90, modules=names)
    b.check_run(second, 60, modules=names)
    for r_id in (run_id, second):
        no_refusal(b, r_id, names)
    # the key the upgrade interrupted ran again under today's agent, from the earlier controller's request
    assert b.benchmark_starts("sim-01", run_id) == {KEYS[0]: 1, KEYS[1]: 2}
    assert {d["contract"] for d in devices(b).values()} == {SCHEMA_VERSION}


def test_agents_first_under_an_earlier_controller(bench_factory, redis_broker, quick_release, earlier):
    """The reverse order for one version: today's agents under the earlier controller run its requests and it
    reads their records (the run ends done on both modules, every row in its history)."""
    b = bench_factory(redis_broker, 2)
    names = ("sim-01", "sim-02")
    b.lab.start(sim_env={n: QUICK_ENV for n in names})
    r = earlier_fleetctl(b, earlier, "validate", str(quick_release.path), "--models", ",".join(KEYS), "--devices",
                         ",".join(names), "--detach")
    assert r.returncode == 0, r.stderr
    run_id = r.stdout.strip().splitlines()[-1]

    def ended() -> dict[str, dict[str, object]] | None:
        s = earlier_fleetctl(b, earlier, "status", run_id, "-o", "json")  # exit code: the verdict's (no baseline)
        states: dict[str, dict[str, object]] = json.loads(s.stdout)["module_states"] if s.stdout.strip() else {}
        return states if states and all(st["state"] in ("done", "failed", "cancelled", "lost")
                                        for st in states.values()) else None

    states = wait_for(ended, 60, "the earlier controller to see the run end", interval=1.0)
    assert {m: st["state"] for m, st in states.items()} == {n: "done" for n in names}, states
    for n in names:  # the earlier controller's history holds every row the module keeps
        local = len(RunStore(b.workdir(n)).rows(run_id))
        assert local and len(b.history.rows(run_id, n, source=None)) == local
    no_refusal(b, run_id, names)


@pytest.mark.parametrize(("apart", "todo", "reason"), [
    (-2, "upgrade them with `fleetctl deploy --devices sim-01`", "upgrade it with `fleetctl deploy --devices sim-01`"),
    (2, "upgrade the controller", "upgrade the controller")])
def test_validate_refuses_a_module_too_far_apart_before_the_run_is_created(bench_factory, redis_broker,
                                                                             quick_release, apart, todo, reason):
    """A module whose heartbeat says a contract two versions apart (written on the broker as its agent would: no
    agent of such a version exists) is refused by ``validate`` in one line naming what to do; no run is created
    (the history holds none: dispatch records a run before it sends anything), and ``devices`` flags it."""
    from contract.celery_app import make_app
    from contract.kv import KV
    from contract.records import Heartbeat

    b = bench_factory(redis_broker, 2)
    b.lab.start(["sim-02"])
    app = make_app(b.lab.settings)
    try:
        KV(app).put_heartbeat(Heartbeat(module="sim-01", agent_version="0.1.0", ts=time.time(),
                                        schema_version=SCHEMA_VERSION + apart))
    finally:
        app.close()
    r = b.lab.fleetctl("validate", str(quick_release.path), "--models", "qwen3", "--devices", "sim-01,sim-02",
                       "--detach")
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert f"sim-01 (contract {SCHEMA_VERSION + apart})" in r.stderr and todo in r.stderr, r.stderr
    assert "no run was created" in r.stderr and "sim-02" not in r.stderr.split(": cannot run")[0], r.stderr
    assert b.history.runs() == []
    d = devices(b)["sim-01"]
    assert d["contract_standing"] == "refused" and reason in str(d["reason"]), d
