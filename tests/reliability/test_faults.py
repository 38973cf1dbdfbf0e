"""One test per fault, real processes and real faults (signals, a killed redis-server), on both brokers
where the fault applies. Each ends with the suite's invariants (``Bench.check_run``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from agent.store import RunStore
from contract.records import RunState
from tests.support.reliability import KEYS, QUICK_ENV
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("down_for", ["within", "after"])
def test_worker_sigkill_and_restart(bench_factory, broker, release, down_for):
    """The whole agent is SIGKILLed and comes back (before and after offline_after, before lost_after):
    it reports the dead run at once, re-queues it, and the run resumes from its passed keys."""
    b = bench_factory(broker, offline_after=2.0, lost_after=60.0)
    b.lab.start()
    run_id = b.validate(release)
    b.on_key(run_id, "sim-01", KEYS[1])
    b.lab.kill("sim-01")
    if down_for == "after":
        wait_for(lambda: b.fleet.statuses(b.lab.state().inventory().modules)["sim-01"].state == "unreachable",
                 10, "the module unreachable")
        assert b.fleet.sync(run_id).progress["sim-01"].state == RunState.BENCHMARKING  # not lost: its run goes on
    b.lab.start(["sim-01"], sim_env={"sim-01": QUICK_ENV})  # the resumed run at time scale 1000
    wait_for(lambda: b.fleet.sync(run_id).progress["sim-01"].state in (RunState.INTERRUPTED, RunState.FETCHING,
                                                                      RunState.BENCHMARKING, RunState.DONE)
             and b.fleet.sync(run_id).progress["sim-01"].attempt == 2, 30, "the run resumed")
    view = b.check_run(run_id, 120)
    assert view.progress["sim-01"].state == RunState.DONE
    assert b.benchmark_starts("sim-01", run_id) == {KEYS[0]: 1, KEYS[1]: 2}
    assert view.state() == "done"


def test_sigterm_mid_run_interrupts_cleanly_and_resumes(bench_factory, broker, release):
    """SIGTERM (systemctl stop, a deploy's restart): the run stops cleanly within seconds (the release's processes end
    on SIGTERM, before the 15 s grace to SIGKILL), publishes `interrupted`, and resumes from its passed keys when the
    agent is back."""
    b = bench_factory(broker)
    b.lab.start()
    run_id = b.validate(release)
    b.on_key(run_id, "sim-01", KEYS[1])
    w = b.lab.workers["sim-01"]
    t0 = time.monotonic()
    os.kill(w.proc.pid, signal.SIGTERM)
    w.proc.wait(timeout=3 + 10)
    stopped_in = time.monotonic() - t0
    assert stopped_in < 3 + 10
    del b.lab.workers["sim-01"]
    p = wait_for(lambda: (p := b.fleet.sync(run_id).progress["sim-01"]).state == RunState.INTERRUPTED and p, 10,
                 "the interrupted state")
    assert "interrupted" in p.error.message and [o.status for o in p.outcomes][0] == "passed"
    from tests.support.procs import leftovers
    assert leftovers(b.lab) == []  # nothing of the run outlives the agent
    b.lab.start(sim_env={"sim-01": QUICK_ENV})  # the resumed run at time scale 1000
    view = b.check_run(run_id, 120)
    assert view.progress["sim-01"].state == RunState.DONE
    assert view.progress["sim-01"].attempt == 1  # a clean interrupt is not a failed delivery
    assert b.benchmark_starts("sim-01", run_id) == {KEYS[0]: 1, KEYS[1]: 2}


def test_redis_sigkill_mid_run(bench_factory, redis_broker, release):
    """redis-server SIGKILLed mid-run and restarted on its AOF (appendfsync everysec): the run goes on
    and nothing measured is lost."""
    b = bench_factory(redis_broker)
    b.lab.start()
    run_id = b.validate(release)
    b.on_key(run_id, "sim-01", KEYS[1])
    redis_broker[1].kill()
    time.sleep(2)
    redis_broker[1].start()
    view = b.check_run(run_id, 120)
    assert view.progress["sim-01"].state == RunState.DONE and view.progress["sim-01"].rows == 26
    assert b.history.row_count(run_id) == 26


def test_backend_down_at_final_publish(bench_factory, redis_broker, release):
    """The result backend is down when the run ends: the terminal state and the rows wait in the module's
    outbox and reach the history once the backend is back."""
    b = bench_factory(redis_broker)
    b.lab.start()
    run_id = b.validate(release)
    b.on_key(run_id, "sim-01", KEYS[1])
    redis_broker[1].stop()
    try:
        store = RunStore(b.workdir("sim-01"))
        wait_for(lambda: (p := store.progress(run_id)) is not None and p.state.terminal, 90, "the run to end")
        wait_for(lambda: (b.workdir("sim-01") / "outbox" / f"{run_id}.json").exists(), 10, "the outbox entry")
    finally:
        redis_broker[1].start()
    view = b.check_run(run_id, 60)
    assert view.progress["sim-01"].state == RunState.DONE and b.history.row_count(run_id) == 26
    wait_for(lambda: not (b.workdir("sim-01") / "outbox" / f"{run_id}.json").exists(), 10, "the outbox emptied")


def test_run_outlives_visibility_timeout(bench_factory, redis_broker, release):
    """Redis hands a message out again once its visibility timeout passes, here while the run still runs:
    the second delivery is answered from the module's record, never benchmarked again."""
    b = bench_factory(redis_broker, broker_visibility_timeout=3.0)
    b.lab.start()
    run_id = b.validate(release)
    view = b.check_run(run_id, 120)
    assert view.progress["sim-01"].state == RunState.DONE
    time.sleep(5)  # the restored message reaches the idle worker, which answers from the record
    assert b.benchmark_starts("sim-01", run_id) == {KEYS[0]: 1, KEYS[1]: 1}
    assert (b.workdir("sim-01") / "runs" / run_id / "attempts").read_text().strip() == "1"
    assert b.fleet.sync(run_id).progress["sim-01"].state == RunState.DONE


def test_cancel_while_offline_then_back(bench_factory, redis_broker, release):
    """Cancelled while the module is down: the module, back, ends the run as cancelled and runs nothing."""
    b = bench_factory(redis_broker, offline_after=2.0, lost_after=60.0)
    b.lab.start()
    run_id = b.validate(release)
    b.on_key(run_id, "sim-01", KEYS[1])
    b.lab.kill("sim-01")
    assert b.lab.fleetctl("cancel", run_id).returncode == 0
    b.lab.start(["sim-01"])
    view = b.check_run(run_id, 60)
    assert view.progress["sim-01"].state == RunState.CANCELLED and view.state() == "cancelled"
    assert b.benchmark_starts("sim-01", run_id) == {KEYS[0]: 1, KEYS[1]: 1}


def test_hard_time_limit(bench_factory, redis_broker, release):
    """A run that cannot stop itself at its soft limit (its whole worker stopped: no thread of it can act) is
    ended at the hard limit by the kernel's alarm; the agent, started again as systemd does, stops the
    processes the run left and ends the run as failed, with the reason."""
    b = bench_factory(redis_broker, run_time_limit=10.0)  # its soft limit: 8 s
    b.lab.start()
    run_id = b.validate(release)
    b.on_key(run_id, "sim-01", KEYS[0], timeout=30)
    worker = b.lab.workers["sim-01"].proc
    os.kill(worker.pid, signal.SIGSTOP)
    deadline = float((b.workdir("sim-01") / "runs" / run_id / "deadline").read_text())
    time.sleep(max(0.0, deadline - time.time()) + 1.0)
    os.kill(worker.pid, signal.SIGCONT)  # the alarm, pending since the limit, ends it before it runs a line
    assert worker.wait(timeout=10) == -signal.SIGALRM
    b.lab.workers.pop("sim-01")
    b.lab.start(["sim-01"])
    view = b.check_run(run_id, 30)
    p = view.progress["sim-01"]
    assert p.state == RunState.FAILED and "hard time limit of 10 s exceeded" in p.error.message, p.error
    assert b.benchmark_starts("sim-01", run_id) == {KEYS[0]: 1}  # ended, not resumed


def test_lost_after_then_late_result(bench_factory, redis_broker, release):
    """No heartbeat for lost_after: the controller gives the module up (lost) with the reason; the agent,
    back, reports the run failed (it must not run it again), which replaces "lost" in the history."""
    b = bench_factory(redis_broker, offline_after=2.0, lost_after=4.0)
    b.lab.start()
    run_id = b.validate(release)
    b.on_key(run_id, "sim-01", KEYS[1])
    b.lab.kill("sim-01")
    view = b.finished(run_id, 30)
    assert view.progress["sim-01"].state == RunState.LOST and "no heartbeat" in view.progress["sim-01"].error.message
    b.lab.start(["sim-01"])
    view = b.check_run(run_id, 30)
    wait_for(lambda: b.fleet.sync(run_id).progress["sim-01"].state == RunState.FAILED, 20, "the late state")
    assert any("accepted after the module was marked lost" in e[2] for e in b.history.events(run_id))
    assert b.benchmark_starts("sim-01", run_id) == {KEYS[0]: 1, KEYS[1]: 1}


@pytest.mark.parametrize("run_id", ["a b", "../../escape", "x" * 200, "-rf", ".hidden", "ok/../../x"])
def test_hostile_run_ids_are_refused_by_the_controller(bench_factory, redis_broker, release, run_id):
    b = bench_factory(redis_broker)
    r = b.lab.fleetctl("validate", str(release.path), "--models", "qwen3", "--devices", "sim-01",
                       "--run-id", run_id, "--detach")
    assert r.returncode == 2 and "run id" in r.stderr, r.stderr
    assert b.history.runs() == []


def test_second_agent_with_a_name_in_use(bench_factory, redis_broker, quick_release, tmp_path):
    """A second agent started with a module name a live agent holds refuses to start; `fleetctl devices`
    shows the conflict; the first agent goes on serving."""
    from controller.cli.demo import start_worker

    b = bench_factory(redis_broker)
    b.lab.start()
    twin = start_worker("sim-01", tmp_path / "twin", b.lab.settings, sim_env=b.lab.worker_env())
    assert twin.proc.wait(timeout=30) == 2
    assert "held by a live agent" in twin.log.read_text()
    d = b.lab.fleetctl("devices")
    assert "name conflict" in d.stdout + d.stderr, d.stdout
    run_id = b.validate(quick_release, models=("qwen3",))  # the live agent still takes work
    view = b.check_run(run_id, 60)
    assert view.progress["sim-01"].state == RunState.DONE


def test_reused_run_id_is_refused(bench_factory, redis_broker, quick_release):
    b = bench_factory(redis_broker)
    b.lab.start()
    run_id = b.validate(quick_release, "sim-01", ("qwen3",))
    b.check_run(run_id, 60)
    again = b.lab.fleetctl("validate", str(quick_release.path), "--models", "qwen3", "--devices", "sim-01",
                           "--run-id", run_id, "--detach")
    assert again.returncode == 2 and "already" in again.stderr


def test_concurrent_serve_and_watch_on_one_history(bench_factory, redis_broker, release):
    """`fleetctl serve` and `fleetctl watch` sync one run into one history at once: no error, no duplicate."""
    b = bench_factory(redis_broker)
    b.lab.start()
    run_id = b.validate(release, models=("qwen3",))
    exe = os.path.join(os.path.dirname(sys.executable), "fleetctl")
    serve = subprocess.Popen([exe, "serve", "--interval", "0.05"], env=b.lab.env(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    try:
        w = b.lab.fleetctl("watch", run_id)
        assert w.returncode in (0, 1) and "verdict:" in w.stdout, w.stderr
    finally:
        serve.terminate()
        _, err = serve.communicate(timeout=20)
    assert "Traceback" not in err and "locked" not in err, err
    b.check_run(run_id, 30)
    assert b.history.row_count(run_id) == 11


def test_a_run_sent_to_an_unreachable_module_waits_for_it(bench_factory, broker, quick_release):
    """A module without a heartbeat for offline_after (not yet lost_after) gets the run queued, not failed at
    dispatch: it takes it when its agent is back."""
    b = bench_factory(broker, offline_after=2.0, lost_after=60.0)
    b.lab.start()
    b.lab.kill("sim-01")
    wait_for(lambda: b.fleet.statuses(b.lab.state().inventory().modules)["sim-01"].state == "unreachable",
             10, "the module unreachable")
    r = b.lab.fleetctl("validate", str(quick_release.path), "--models", KEYS[0], "--devices", "sim-01", "--detach")
    assert r.returncode == 0 and "1/1 modules queued" in r.stderr, r.stderr
    run_id = r.stdout.strip().splitlines()[-1]
    time.sleep(3)
    p = b.fleet.sync(run_id).progress["sim-01"]
    assert p is not None and p.state == RunState.PENDING and p.step == "queued", p
    b.lab.start(["sim-01"])
    view = b.check_run(run_id, 120)
    assert view.progress["sim-01"].state == RunState.DONE and b.benchmark_starts("sim-01", run_id) == {KEYS[0]: 1}
