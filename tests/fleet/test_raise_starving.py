"""What a ``fleetctl serve`` pass does about starving runs (daemon.raise_starving), on the embedded broker's real
queue files: a low run waiting past ``raise_after`` is raised a level and said so; with 0 nothing moves."""

from __future__ import annotations

import time
from pathlib import Path

from contract.celery_app import RUN_TASK, task_id
from controller.cli.demo import inventory_toml
from controller.serve.daemon import raise_starving
from controller.service import Session
from controller.settings import ControllerSettings


def _session(tmp_path: Path, raise_after: float) -> Session:
    inv = tmp_path / "inv.toml"
    inv.write_text(inventory_toml(["sim-01"], tmp_path, None))
    return Session(ControllerSettings(broker_url="filesystem://", data_dir=tmp_path / "fleet", inventory=inv,
                                      history=tmp_path / "history.sqlite", raise_after=raise_after))


def test_a_serve_pass_raises_a_starving_run_and_says_so(tmp_path: Path) -> None:
    with _session(tmp_path, 0.3) as s:
        fleet = s.fleet()
        mods = list(s.inventory().modules)
        fleet.send("sim-01", RUN_TASK, [{}], task_id=task_id("sim-01", "nightly-1"), priority="low", user="ann")
        said: list[str] = []
        raise_starving(s, said.append)
        assert said == [] and [w.level for w in fleet.waiting(mods)] == ["low"]  # not waited long enough yet
        time.sleep(0.35)
        fleet.send("sim-01", RUN_TASK, [{}], task_id=task_id("sim-01", "later-1"), user="bob")  # normal, sent now
        raise_starving(s, said.append)
        assert said == ["a run waiting 0 min on module.sim-01 raised from low to normal"]
        # it keeps its place in time: first of its new level, ahead of the normal run sent after it
        w, later = fleet.waiting(mods)
        assert (w.level, w.asked, w.run_id, w.user) == ("normal", "low", "nightly-1", "ann")
        assert (later.level, later.asked, later.run_id) == ("normal", "normal", "later-1")


def test_raise_after_0_moves_nothing(tmp_path: Path) -> None:
    with _session(tmp_path, 0) as s:
        fleet = s.fleet()
        fleet.send("sim-01", RUN_TASK, [{}], task_id=task_id("sim-01", "nightly-1"), priority="low")
        time.sleep(0.05)
        said: list[str] = []
        raise_starving(s, said.append)
        assert said == [] and [w.level for w in fleet.waiting(list(s.inventory().modules))] == ["low"]


def test_a_run_held_for_a_reservation_stays_low_until_it_ends_then_goes_back_up(tmp_path: Path) -> None:
    from contract.celery_app import queue_name
    from contract.priority import ASKED, LEVELS, SENT_AT, USER
    from controller.service.reservations import release, reserve

    with _session(tmp_path, 3600) as s:
        fleet = s.fleet()
        mods = list(s.inventory().modules)
        reserve(s, "sim-01", 3600, user="ann")
        # what agent.hold does with bob's normal run on ann's module: back on the queue at low, its headers kept
        fleet.app.send_task(RUN_TASK, args=[{}], queue=queue_name("sim-01"), task_id=task_id("sim-01", "bobs"),
                            priority=LEVELS["low"], headers={SENT_AT: time.time(), ASKED: "normal", USER: "bob"})
        said: list[str] = []
        raise_starving(s, said.append)
        assert said == [] and [(w.level, w.asked) for w in fleet.waiting(mods)] == [("low", "normal")]
        release(s, "sim-01", user="ann")
        raise_starving(s, said.append)
        assert said == ["a run waiting 0 min on module.sim-01 raised from low to normal"]
        assert [(w.level, w.user) for w in fleet.waiting(mods)] == [("normal", "bob")]
