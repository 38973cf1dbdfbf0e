"""Dispatch end to end: real Celery workers per simulated module, on both brokers.

Each test builds a simulated release at a high time scale, starts real worker
processes, and drives the controller through ``fleetctl`` (a real process) or the
``Fleet`` seam, then checks the history, exit codes and leftover processes.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from agent.validate import stage_local_release
from contract.records import RunState
from controller.fleet import Fleet
from controller.history import History
from tests.support.procs import leftovers
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow

SCALE = 1000.0  # module seconds per wall second: a qwen3 sweep takes a fraction of a second
SLOW_SCALE = 20.0  # long enough to cancel or kill a module in the middle of a key


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory):
    from simulator import build_release

    return build_release(tmp_path_factory.mktemp("release"), time_scale=SCALE, noise=0.0, seed=3)


@pytest.fixture(scope="module")
def slow_release(tmp_path_factory: pytest.TempPathFactory):
    from simulator import build_release

    return build_release(tmp_path_factory.mktemp("slow-release"), time_scale=SLOW_SCALE, noise=0.0, seed=3)


def test_multi_module_run_end_to_end(shared_lab, release):
    lab = shared_lab
    r = lab.fleetctl("validate", str(release.path), "--models", "qwen3,qwen35_mtp", "--devices", "sim-01,sim-02")
    assert r.returncode in (0, 1), r.stderr
    h = History(lab.settings.history_path)
    run = h.find_run(r.stderr.split("run ", 1)[1].split(":", 1)[0])
    assert run.state == "done", r.stderr
    rows = h.rows(run.run_id)
    per_module = {m: [x for x in rows if x.module == m] for m in lab.names}
    assert {m: len(v) for m, v in per_module.items()} == {m: 26 for m in lab.names}
    assert all(x.release == "1.4.1" and x.run_id == run.run_id for x in rows)
    prog = h.progress(run.run_id)
    assert all(p.state == RunState.DONE and p.keys_done == 2 for p in prog.values())
    assert "verdict:" in r.stdout
    assert leftovers(lab) == []
    # the same run redelivered is answered from the module's record, never benchmarked twice
    fleet = Fleet(lab.settings, h)
    staged = str(stage_local_release(release.path, release.sha256, lab.settings.data_dir))
    before = (lab.base / "modules" / "sim-01" / "work" / "runs" / run.run_id / "attempts").read_text()
    fleet.dispatch(run_id=run.run_id, modules=[m for m in lab.state().inventory().modules if m.name == "sim-01"],
                   tarballs={"sim-01": staged}, sha256=release.sha256, release="1.4.1",
                   models=("qwen3", "qwen35_mtp"), resume=True)
    wait_for(lambda: fleet.sync(run.run_id).finished, 30, "the redelivered run to be answered")
    assert (lab.base / "modules" / "sim-01" / "work" / "runs" / run.run_id / "attempts").read_text() == before
    assert len(h.rows(run.run_id)) == 52


def test_module_offline_at_dispatch_fails_fast(shared_lab, release):
    lab = shared_lab
    t0 = time.monotonic()
    r = lab.fleetctl("validate", str(release.path), "--models", "qwen3", "--devices", "all")
    assert r.returncode == 1, r.stderr  # incomplete: judged on the two modules that ran
    assert "sim-03" in r.stderr and "offline" in r.stderr
    assert "verdict: incomplete" in r.stdout and "refused at dispatch: sim-03 module offline: " in r.stdout, r.stdout
    h = History(lab.settings.history_path)
    prog = h.progress(h.runs()[0].run_id)
    refused = prog["sim-03"].error
    assert prog["sim-03"].state == RunState.FAILED and refused is not None and refused.step == "refused"
    assert prog["sim-01"].state == RunState.DONE and prog["sim-02"].state == RunState.DONE
    assert time.monotonic() - t0 < 60


def test_cancel_mid_run_leaves_no_process(shared_lab, slow_release):
    lab = shared_lab
    r = lab.fleetctl("validate", str(slow_release.path), "--models", "qwen35_mtp,qwen3", "--devices", "sim-01,sim-02",
                     "--detach")
    assert r.returncode == 0, r.stderr
    run_id = r.stdout.strip().splitlines()[-1]
    h = History(lab.settings.history_path)
    fleet = Fleet(lab.settings, h)
    wait_for(lambda: all(p and p.state == RunState.BENCHMARKING for p in fleet.sync(run_id).progress.values()),
             60, "both modules benchmarking")
    c = lab.fleetctl("cancel", run_id)
    assert c.returncode == 0, c.stderr
    view = wait_for(lambda: (v := fleet.sync(run_id)).finished and v, 30, "the run to stop")
    assert {p.state for p in view.progress.values()} == {RunState.CANCELLED}
    assert view.state() == "cancelled"
    wait_for(lambda: leftovers(lab) == [], 10, "no process of the run left")
    s = lab.fleetctl("status", run_id)
    assert s.returncode == 1 and "cancelled" in s.stdout


def test_agent_killed_mid_run_is_failed_within_seconds(lab_factory, slow_release):
    lab = lab_factory(2, offline_after=3.0, lost_after=6.0)
    # sim-01, the module that is not killed, runs the same release at time scale 1000 (its module's setting): it
    # only has to end done with every row; the run's end waits on it, and at 20 its key took ~20 s
    lab.start(sim_env={"sim-01": {"M1000_SIM_TIME_SCALE": "1000"}})
    h = History(lab.settings.history_path)
    fleet = Fleet(lab.settings, h)
    r = lab.fleetctl("validate", str(slow_release.path), "--models", "qwen35_mtp", "--detach")
    run_id = r.stdout.strip().splitlines()[-1]
    wait_for(lambda: (p := fleet.sync(run_id).progress.get("sim-02")) and p.state == RunState.BENCHMARKING,
             60, "sim-02 benchmarking")
    killed_at = time.monotonic()
    lab.kill("sim-02")
    view = wait_for(lambda: (v := fleet.sync(run_id)).finished and v, 180, "the run to end")
    lost = view.progress["sim-02"]
    assert lost.state == RunState.LOST and "agent lost" in lost.error.message
    assert time.monotonic() - killed_at < 60
    assert view.progress["sim-01"].state == RunState.DONE and view.progress["sim-01"].rows == 15
    # the restarted agent stops the server the killed one left behind, does not rerun the lost run,
    # and reports it failed, which the controller accepts in place of its own "lost"
    lab.start(["sim-02"])
    assert wait_for(lambda: leftovers(lab) == [], 10, "orphans reaped")
    wait_for(lambda: (p := fleet.sync(run_id).progress["sim-02"]) is not None and p.state == RunState.FAILED, 10,
             "the late failed state")
    late = fleet.sync(run_id).progress["sim-02"]
    assert late is not None and late.error is not None and "agent lost" in late.error.message
    assert any("late failed state accepted" in e[2] for e in h.events(run_id))


def test_detach_then_watch_status_results(shared_lab, release):
    lab = shared_lab
    r = lab.fleetctl("validate", str(release.path), "--models", "qwen3", "--devices", "sim-01,sim-02",
                     "--detach")
    assert r.returncode == 0, r.stderr
    run_id = r.stdout.strip().splitlines()[-1]
    w = lab.fleetctl("watch", run_id)
    assert w.returncode in (0, 1) and "verdict:" in w.stdout, w.stderr
    s = lab.fleetctl("status", run_id)
    assert "done" in s.stdout
    j = lab.fleetctl("results", run_id, "--format", "json")
    rows = json.loads(j.stdout)
    # once in a clean clone's slow tier (5 workers) only sim-01's 11 rows came: say each module's state then
    assert len(rows) == 22 and {x["module"] for x in rows} == {"sim-01", "sim-02"}, (s.stdout, w.stdout[-2000:])
    c = lab.fleetctl("results", run_id, "--format", "csv")
    assert len(c.stdout.strip().splitlines()) == 23
    runs = lab.fleetctl("runs")
    assert run_id in runs.stdout


def test_results_reach_history_without_cli(shared_lab, release):
    lab = shared_lab
    r = lab.fleetctl("validate", str(release.path), "--models", "qwen3", "--devices", "sim-01", "--detach")
    run_id = r.stdout.strip().splitlines()[-1]
    time.sleep(1)
    # nobody attached: the controller's collector pass picks the results up from the broker
    wait_for(lambda: lab.fleetctl("serve", "--once").returncode == 0
             and History(lab.settings.history_path).row_count(run_id) == 11, 60, "serve to collect the rows")
    info = History(lab.settings.history_path).run(run_id)
    assert info is not None and info.state == "done"


def test_restart_mid_run_loses_nothing(shared_lab, slow_release, broker):
    """Redis restarted mid-run (redis broker), or the attached CLI killed mid-run (embedded broker, no server):
    either way the run goes on and every row reaches the history."""
    import signal
    import subprocess

    lab = shared_lab
    h = History(lab.settings.history_path)
    fleet = Fleet(lab.settings, h)
    exe = Path(sys.executable).parent / "fleetctl"
    cli = subprocess.Popen([str(exe), "validate", str(slow_release.path), "--models", "qwen35_mtp", "--devices",
                            "sim-01,sim-02"], env=lab.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run_id = wait_for(lambda: (runs := h.runs(limit=1)) and runs[0].models == ("qwen35_mtp",)
                      and runs[0].state == "running" and runs[0].run_id, 60, "the run to be created")
    wait_for(lambda: all(p and p.state == RunState.BENCHMARKING for p in fleet.sync(run_id).progress.values()),
             60, "benchmarking")
    if broker[1] is not None:
        broker[1].restart(down_for=1.5)
        out, err = cli.communicate(timeout=180)
        assert cli.returncode in (0, 1) and "verdict:" in out, err
    else:
        cli.send_signal(signal.SIGKILL)
        cli.wait(timeout=10)
        w = lab.fleetctl("watch", run_id)
        assert w.returncode in (0, 1) and "verdict:" in w.stdout, w.stderr
    view = wait_for(lambda: (v := fleet.sync(run_id)).finished and v, 120, "the run to end")
    assert view.state() == "done"
    assert h.row_count(run_id) == 30
