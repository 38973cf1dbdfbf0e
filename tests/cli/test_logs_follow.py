"""``fleetctl logs RUN -f`` as a real process: it prints what the module's step logs hold, then
what is appended and new log files as they come, and exits 0 once the run ends (the module's
progress on the embedded broker says so), not before. Slow tier: a real fleetctl process (~5 s idle,
more on a loaded machine: start-up, and -f polls every second)."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from contract.celery_app import make_app
from contract.kv import KV
from contract.records import RunProgress, RunState
from contract.settings import BrokerSettings
from controller.history import History


def progress(state: RunState, step: str) -> RunProgress:
    now = time.time()
    return RunProgress(run_id="r1", module="m1", release="1.4.1", state=state, step=step, keys_total=1,
                       keys_done=int(state.terminal), updated_at=now, started_at=now - 5,
                       finished_at=now if state.terminal else None)


@pytest.mark.slow
def test_logs_follow_prints_what_comes_until_the_run_ends(env: Path) -> None:
    logs = env / "work" / "runs" / "r1" / "logs"
    logs.mkdir(parents=True)
    (logs / "01-unpack.log").write_text("unpacked\n")
    (env / "inv.toml").write_text(f'[[module]]\nname = "m1"\ntransport = "local"\nworkdir = "{env / "work"}"\n')
    h = History(env / "history.sqlite")
    h.create_run("r1", release="1.4.1", models=("qwen3",), modules=["m1"])
    h.upsert_progress(progress(RunState.UNPACKING, "unpack"))
    h.close()
    app = make_app(BrokerSettings(broker_url="filesystem://", data_dir=env / "fleet"))
    kv = KV(app)
    kv.put_progress(progress(RunState.CONFIGURING, "configure"))

    exe = Path(sys.executable).with_name("fleetctl")
    proc = subprocess.Popen([str(exe), "logs", "r1", "-f"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=dict(os.environ))
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        for ln in proc.stdout or ():
            lines.put(ln)

    threading.Thread(target=pump, daemon=True).start()

    def expect(text: str, timeout: float = 30.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            try:
                if text in lines.get(timeout=0.2):
                    return
            except queue.Empty:
                if proc.poll() is not None:
                    err = proc.stderr.read() if proc.stderr else ""
                    raise AssertionError(f"fleetctl logs -f exited {proc.returncode} early: {err}") from None
        raise AssertionError(f"{text!r} not printed in {timeout} s")

    try:
        expect("unpacked")
        with (logs / "01-unpack.log").open("a") as fh:
            fh.write("appended while following\n")
        expect("appended while following")
        (logs / "02-configure.log").write_text("model_paths set\n")
        expect("==> 02-configure.log <==")
        expect("model_paths set")
        time.sleep(1.5)
        assert proc.poll() is None  # the run goes on: so does -f
        kv.put_progress(progress(RunState.DONE, "done"))
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        app.close()
