"""Priorities on a module's queue, on real workers and both brokers (a real redis-server, the embedded one).

A module runs one thing at a time: what waits behind a busy module starts by priority (highest first, then
the order it was sent in), and a run waiting past ``raise_after`` is raised a level by the controller.

The busy run validates ``busy_release`` (time scale 20: a key takes ~20 s, time to queue the others behind it and
list them with the slow tier's load beside); the runs queued behind it validate ``quick_release`` (the same release
at time scale 1000: one key in about a second), as their order, not their figures, is what is asserted.
"""

from __future__ import annotations

import json
import time

import pytest

from contract.records import RunState
from tests.support.lab import broker  # noqa: F401 - the fixture, registered by name
from tests.support.reliability import KEYS

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def busy_release(tmp_path_factory: pytest.TempPathFactory):
    """The suite's release at time scale 20 (its own version): at 50 a key took ~8 s, and beside the slow tier
    (2026-12-06) the busy run ended before four ``fleetctl validate`` and a listing were through, or its running key
    before a ``--preempt`` reached it; beside a neighbour's load too (2026-12-07) before the low run had waited its
    ``raise_after``."""
    from simulator import build_release

    return build_release(tmp_path_factory.mktemp("busy"), version="1.4.3", time_scale=20.0, noise=0.0, seed=3)


def _started(b, run_ids: list[str]) -> list[str]:
    """``run_ids`` in the order sim-01 started them (their progress's ``started_at``, the module's clock)."""
    views = {r: b.finished(r, 120) for r in run_ids}
    for r, v in views.items():
        assert v.progress["sim-01"].state == RunState.DONE, (r, v.progress["sim-01"])
    order = sorted(run_ids, key=lambda r: views[r].progress["sim-01"].started_at)
    b.check_run(order[-1], 60)  # the invariants: rows, benchmarks once, no process left, the module idle
    return order


def test_an_urgent_run_behind_three_low_ones_starts_next(bench_factory, broker, busy_release, quick_release):  # noqa: F811
    b = bench_factory(broker)
    b.lab.start()
    busy = b.validate(busy_release)
    b.on_key(busy, "sim-01", KEYS[0])  # the module is busy: what follows waits on its queue
    lows = [b.validate(quick_release, "sim-01", ("qwen3",), "--priority", "low") for _ in range(3)]
    urgent = b.validate(quick_release, "sim-01", ("qwen3",), "--priority", "urgent")
    depth = b.fleet.queue_depths(b.lab.state().inventory().modules)["module.sim-01"]
    assert depth == {"urgent": 1, "high": 0, "normal": 0, "low": 3}
    r = b.lab.fleetctl("queue", "-o", "json")  # what a person sees: the order the module takes them
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert [(q["run_id"], q["priority"], q["position"], q["behind"]) for q in doc["runs"]] == [
        (urgent, "urgent", 1, busy), *((low, "low", i + 2, busy) for i, low in enumerate(lows))]
    assert all(0 <= q["waited_s"] < 60 for q in doc["runs"])
    assert _started(b, [busy, *lows, urgent]) == [busy, urgent, *lows]
    assert b.history.find_run(urgent).priority == "urgent" and b.history.find_run(lows[0]).priority == "low"
    assert b.fleet.queue_depths(b.lab.state().inventory().modules)["module.sim-01"] == {
        "urgent": 0, "high": 0, "normal": 0, "low": 0}
    waits = {(r, m): (p, w) for r, m, p, w in b.history.waits()}  # what the wait histogram counts
    assert {r: waits[(r, "sim-01")][0] for r in (busy, urgent, *lows)} == {
        busy: "normal", urgent: "urgent", **dict.fromkeys(lows, "low")}
    assert waits[(urgent, "sim-01")][1] < min(waits[(low, "sim-01")][1] for low in lows)
    r = b.lab.fleetctl("status", urgent)  # the run's own wait, and what it waited behind
    assert "waited: sim-01 " in r.stdout and f"behind {busy!r}" in r.stdout, r.stdout
    doc = json.loads(b.lab.fleetctl("status", lows[0], "-o", "json").stdout)
    assert doc["waits"]["sim-01"]["behind"] == urgent and doc["waits"]["sim-01"]["priority"] == "low"
    r = b.lab.fleetctl("queue")
    assert r.returncode == 0 and "nothing waits on 1 module(s)" in r.stdout, r.stdout + r.stderr
    assert "urgent median" in r.stdout and "low median" in r.stdout and "(n=3)" in r.stdout


@pytest.mark.redis
def test_a_low_run_waiting_past_raise_after_goes_ahead_of_later_normal_ones(bench_factory, redis_broker,
                                                                            busy_release, quick_release):
    """On a real redis-server only: the raise on the embedded broker's message files (a rename that keeps the
    message's place in time, so it goes first of its new level) is tests/fleet/test_raise_starving.py's, and the
    embedded broker's workers taking messages by level is test_an_urgent_run_behind_three_low_ones_starts_next's."""
    b = bench_factory(redis_broker)
    b.lab.start()
    busy = b.validate(busy_release)
    b.on_key(busy, "sim-01", KEYS[0])
    t0 = time.time()
    low = b.validate(quick_release, "sim-01", ("qwen3",), "--priority", "low")
    t1 = time.time()  # the low run was sent in [t0, t1]
    # long enough that seen at t2 the low run waited at least one raise_after whichever moment of [t0, t1] it was
    # sent at: (t2 - t1) >= (t2 - t0) / 1.5 needs t2 - t1 >= 2 (t1 - t0) (a validate beside the slow tier took
    # over 1.5 s once, when this was a fixed 3 s)
    time.sleep(max(3.0, 2 * (t1 - t0) + 0.5))
    t2 = time.time()  # ... the normal ones after t2
    normals = [b.validate(quick_release, "sim-01", ("qwen3",)) for _ in range(2)]
    mods = b.lab.state().inventory().modules
    assert b.fleet.raise_waiting(mods, raise_after=3600) == []  # nothing waited that long
    # seen at t2: the low run waited one raise_after (between 1.5 (t2-t1)/(t2-t0) and 1.5 of them), no normal one
    wait = (t2 - t0) / 1.5
    assert (t2 - t1) / wait >= 1.0
    raised = b.fleet.raise_waiting(mods, raise_after=wait, now=t2)
    assert [(r.message.level, r.to) for r in raised] == [("low", "normal")]
    assert b.fleet.queue_depths(mods)["module.sim-01"] == {"urgent": 0, "high": 0, "normal": 3, "low": 0}
    # it waited longest, so it goes first of its new level
    assert _started(b, [busy, low, *normals]) == [busy, low, *normals]
    assert b.benchmark_starts("sim-01", low) == {"qwen3": 1}


def test_preempt_interrupts_the_running_run_which_resumes_after_the_urgent_one(bench_factory, broker,  # noqa: F811
                                                                               busy_release, quick_release):
    """``--preempt``: the module stops its running run at once (as for a clean shutdown), runs the urgent one, then
    resumes the stopped run from its passed keys: the key that passed before is not benchmarked again."""
    b = bench_factory(broker)
    b.lab.start()
    busy = b.validate(busy_release)
    b.on_key(busy, "sim-01", KEYS[1])  # the first key passed, the second is being benchmarked
    r = b.lab.fleetctl("validate", str(busy_release.path), "--models", "qwen3", "--devices", "sim-01", "--detach",
                       "--priority", "normal", "--preempt")
    assert r.returncode != 0 and "--preempt stops running runs for an urgent one: give --priority urgent" in r.stderr
    urgent = b.validate(quick_release, "sim-01", ("qwen3",), "--priority", "urgent", "--preempt")
    ends = {x: b.finished(x, 120).progress["sim-01"] for x in (urgent, busy)}
    b.check_run(busy, 60)
    # the urgent run ran while the stopped one waited: it started (again) after the urgent one ended
    assert ends[urgent].state == RunState.DONE and ends[busy].state == RunState.DONE and ends[busy].rows == 26
    assert ends[urgent].finished_at <= ends[busy].started_at
    assert b.benchmark_starts("sim-01", busy, "ok") == {KEYS[0]: 1, KEYS[1]: 1}  # each key measured once
    assert b.benchmark_starts("sim-01", busy)[KEYS[0]] == 1  # the passed key never started again
    assert json.loads((b.workdir("sim-01") / "runs" / busy / "preempted-by").read_text()) == [urgent]
