"""Two controllers, one broker, one module, one run id, two releases: no verdict on rows of the other release.

Controller A validates release 1.4.1 under run id ``same-1``; controller B (its own history and inventory, the same
redis-server and module) then validates 1.4.2 under the same id. B's controller refuses it (the run id's records are
on the broker); and when B's check is bypassed (a dispatch through ``Fleet`` as an older controller did, its check
looking at its own history only), the module refuses it: it answers a request from its record only when the record
is of the same request. B's history never holds PASS, nor a row of 1.4.1; A's run, files and history stay as they
were; A's genuine redelivery (``--resume``) is still answered from the record, not benchmarked again.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest

from agent.validate import stage_local_release
from contract.records import RunState
from controller import service
from controller.fleet import Fleet, FleetError
from controller.history import History
from controller.inventory import Module
from controller.service import Session
from tests.support.lab import Lab
from tests.support.reliability import Bench
from tests.support.wait import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.redis]

RUN = "same-1"
KEYS = ("qwen3",)
QUICK = 1000.0  # the releases' time scale: a key in about a second (no figure is checked here)


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory):
    """1.4.1 at time scale 1000 (the suite's is at 50): A's run only has to end done, its figures are not checked."""
    from simulator import build_release

    return build_release(tmp_path_factory.mktemp("release"), time_scale=QUICK, noise=0.0, seed=3)


@pytest.fixture(scope="module")
def release_142(tmp_path_factory: pytest.TempPathFactory):
    from simulator import build_release

    return build_release(tmp_path_factory.mktemp("release-142"), version="1.4.2", time_scale=QUICK, noise=0.0, seed=4)


class OlderFleet(Fleet):
    """The dispatch of a controller before this check: the run id looked up in its own history only."""

    def check_new_run_id(self, run_id: str, *, resume: bool = False, modules: Iterable[str] = ()) -> None:
        if not resume and self.history.run(run_id) is not None:
            raise FleetError(f"run id {run_id!r} is already in the history")


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _first_controller_run(bench_factory, redis_broker, release) -> tuple[Bench, Lab]:
    """A's run ``same-1`` of 1.4.1, finished on sim-01; and controller B: the same broker and module, its own
    history and inventory."""
    a = bench_factory(redis_broker)
    a.lab.start()
    assert a.validate(release, "sim-01", KEYS, "--run-id", RUN) == RUN
    view = a.check_run(RUN, 120)
    assert view.progress["sim-01"].state == RunState.DONE and view.progress["sim-01"].release == "1.4.1"
    base = a.lab.base.parent / "controller-b"
    base.mkdir()
    (base / "inventory.toml").write_text(a.lab.settings.inventory.read_text())
    settings = a.lab.settings.model_copy(update={"inventory": base / "inventory.toml",
                                                 "history": base / "history.sqlite"})
    return a, Lab(base, settings, [])


def _a_unchanged(a: Bench, rows_before: list, files_before: dict[str, bytes]) -> None:
    assert _files(a.workdir("sim-01") / "runs" / RUN) == files_before
    p, run = a.fleet.sync(RUN).progress["sim-01"], a.history.run(RUN)
    assert p is not None and p.state == RunState.DONE
    assert a.history.rows(RUN, source=None) == rows_before and run is not None and run.release == "1.4.1"


def test_second_controller_is_refused_by_the_run_ids_on_the_broker(bench_factory, redis_broker, release,
                                                                    release_142):
    a, b = _first_controller_run(bench_factory, redis_broker, release)
    # A's genuine redelivery: the same request, answered from the module's record, not benchmarked again
    attempts = (a.workdir("sim-01") / "runs" / RUN / "attempts").read_text()
    r = a.lab.fleetctl("validate", str(release.path), "--models", ",".join(KEYS), "--devices", "sim-01",
                       "--run-id", RUN, "--resume")
    assert r.returncode == 0, r.stderr
    assert (a.workdir("sim-01") / "runs" / RUN / "attempts").read_text() == attempts
    assert a.benchmark_starts("sim-01", RUN) == {"qwen3": 1}
    rows_before = a.history.rows(RUN, source=None)
    files_before = _files(a.workdir("sim-01") / "runs" / RUN)

    r = b.fleetctl("validate", str(release_142.path), "--models", ",".join(KEYS), "--devices", "sim-01",
                   "--run-id", RUN)
    assert r.returncode == 2, (r.stdout, r.stderr)
    line = r.stderr.strip()
    assert "\n" not in line, line
    assert f"run id '{RUN}' is already on the broker" in line and "sim-01 (done, release 1.4.1)" in line, line
    history = b.settings.history_path
    assert isinstance(history, Path)  # the lab's history is a SQLite file
    assert not history.exists() or History(history).run(RUN) is None
    _a_unchanged(a, rows_before, files_before)


def test_module_refuses_a_run_id_it_used_for_another_release(bench_factory, redis_broker, release, release_142) -> None:
    a, b = _first_controller_run(bench_factory, redis_broker, release)
    rows_before = a.history.rows(RUN, source=None)
    assert rows_before and all(x.release == "1.4.1" for x in rows_before)
    files_before = _files(a.workdir("sim-01") / "runs" / RUN)

    # controller B as an older controller dispatched: a fresh history, so its own check lets the run id through
    history = History(b.settings.history_path)
    fleet = OlderFleet(b.settings, history)
    mods: list[Module] = [m for m in Session(b.settings).inventory().modules if m.name == "sim-01"]
    staged = str(stage_local_release(release_142.path, release_142.sha256, b.settings.data_dir))
    out = fleet.dispatch(run_id=RUN, modules=mods, tarballs={"sim-01": staged}, sha256=release_142.sha256,
                         release="1.4.2", models=KEYS)
    assert out == {"sim-01": "queued"}
    # the module refuses it, in one line naming both releases, as its failed state of the run
    p = wait_for(lambda: (q := fleet.kv.progress(RUN, ["sim-01"])["sim-01"]) is not None and q.release == "1.4.2"
                 and q, 60, "the module's answer")
    assert p.state == RunState.FAILED and p.error is not None
    assert p.error.message == (f"run id {RUN} was used here for release sha256 {release.sha256[:12]}… (1.4.1); "
                               f"this request is for {release_142.sha256[:12]}… (1.4.2): refused")
    view = wait_for(lambda: (v := fleet.sync(RUN)).finished and v, 30, "B's run to end")
    fleet.close()
    mine = view.progress["sim-01"]
    assert mine is not None and mine.state == RunState.FAILED and mine.release == "1.4.2"
    assert history.rows(RUN, source=None) == []  # no row of 1.4.1, nor of any release
    j = service.judge(Session(b.settings), RUN)
    assert j.verdict != "pass" and j.state == "failed"
    recorded = History(b.settings.history_path).run(RUN)
    assert recorded is not None and recorded.verdict != "pass"
    assert a.benchmark_starts("sim-01", RUN) == {"qwen3": 1}
    _a_unchanged(a, rows_before, files_before)
