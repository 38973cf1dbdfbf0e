"""A run's hard time limit (issue 18: the agent is one process): the kernel's alarm ends the worker
wherever the run hangs, and the agent that starts again ends a delivery past its deadline.

The alarm is checked in fresh interpreters (real signals, real hangs); the recovery with the
embedded broker's backend and real files (no worker)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.recovery import recover
from agent.settings import AgentSettings
from agent.store import RunStore
from contract.celery_app import embedded_folders, make_app, queue_name
from contract.records import RunProgress, RunRequest, RunState

ROOT = Path(__file__).resolve().parents[2]

HANG = """
import os, re, signal, sys, time
from agent.limits import hard_limit
signal.signal(signal.SIGALRM, signal.SIG_DFL)  # as run_worker sets it
with hard_limit(0.3):
    how = sys.argv[1]
    if how == "blocked":
        time.sleep(30)
    elif how == "gil":  # backtracking in C with the GIL held: no Python signal handler could run
        re.match(r"(a+)+$", "a" * 64 + "b")
    elif how == "stopped":
        os.kill(os.getpid(), signal.SIGSTOP)
time.sleep(0.6)  # past the limit: the alarm was disarmed when the run ended
print("alive")
"""


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


@pytest.mark.parametrize("how", ["blocked", "gil", "stopped"])
def test_the_kernel_ends_a_run_hung_past_its_hard_limit(how: str) -> None:
    proc = subprocess.Popen([sys.executable, "-c", HANG, how], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if how == "stopped":
        end = time.monotonic() + 30
        while _state(proc.pid) != "T":
            assert time.monotonic() < end, "the process never stopped"
            time.sleep(0.05)
        time.sleep(0.5)  # past the limit while stopped: the signal waits
        proc.send_signal(signal.SIGCONT)
    assert proc.wait(timeout=30) == -signal.SIGALRM
    assert proc.stdout is not None and proc.stdout.read() == ""


def test_a_run_that_ends_in_time_disarms_the_alarm() -> None:
    out = subprocess.run([sys.executable, "-c", HANG, "done"], cwd=ROOT, capture_output=True, text=True, timeout=30)
    assert (out.returncode, out.stdout.strip()) == (0, "alive"), out.stderr


@pytest.fixture
def agent(tmp_path: Path):
    settings = AgentSettings(module="m1", workdir=tmp_path / "work", data_dir=tmp_path / "fleet",
                             broker_url="filesystem://", metrics_port=0, run_time_limit=90)
    app = make_app(settings)
    yield settings, app
    app.close()


def _left(settings: AgentSettings, state: RunState, deadline: float) -> RunStore:
    """A run an earlier agent left: request, progress in ``state``, its delivery's deadline."""
    store = RunStore(settings.workdir)
    req = RunRequest(run_id="r1", module="m1", tarball="/releases/x.tar.gz", sha256="0" * 64, models=("qwen3",),
                     model_root="/models")
    store.write_request(req)
    store.write_progress(RunProgress(run_id="r1", module="m1", state=state, step="benchmark", model_key="qwen3",
                                     keys_total=1, updated_at=time.time()))
    (store.run_dir("r1") / "attempts").write_text("1\n")
    (store.run_dir("r1") / "deadline").write_text(f"{deadline:.3f}\n")
    store.set_state(current_run="r1", last_run="r1")
    return store


def _queued(settings: AgentSettings) -> int:
    """Messages waiting on the module's queue (the embedded broker's files)."""
    return len(list(embedded_folders(settings.data_dir)["queue"].glob(f"*.{queue_name('m1')}.msg")))


def test_a_killed_run_past_its_deadline_is_ended_not_resumed(agent) -> None:
    settings, app = agent
    store = _left(settings, RunState.BENCHMARKING, time.time() - 1)
    assert recover(app, settings) == ["r1"]
    p = store.progress("r1")
    assert p is not None and p.state == RunState.FAILED and p.error is not None
    assert p.error.message.startswith("hard time limit of 90 s exceeded: the agent was restarted during step benchmark")
    assert store.current_run() is None and _queued(settings) == 0


@pytest.mark.parametrize(("state", "past"), [(RunState.BENCHMARKING, False), (RunState.INTERRUPTED, True)])
def test_a_killed_run_in_time_or_a_run_stopped_cleanly_resumes(agent, state: RunState, past: bool) -> None:
    settings, app = agent
    store = _left(settings, state, time.time() + (-1 if past else 60))
    assert recover(app, settings) == ["r1"]
    p = store.progress("r1")
    assert p is not None and p.state == RunState.INTERRUPTED  # reported, and re-queued to resume
    assert _queued(settings) == 1
