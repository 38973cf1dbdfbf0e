"""A run recorded and never sent (ADR 0060): the controller that dispatched it is SIGKILLed between its record and
its first message. Real parts: a redis-server of its own whose writes are paused (``CLIENT PAUSE ... WRITE``), which
holds the controller inside its first send (the statuses and the run id's check before it only read), simulated
modules as real worker processes, and ``fleetctl`` as real processes. The follower (``fleetctl watch``) sends what
was recorded, and the run ends as any other."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from contract.records import RunState
from controller.fleet.dispatch import RESEND_AFTER
from controller.history import History
from tests.support.lab import make_lab
from tests.support.redis_server import running_redis
from tests.support.wait import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.redis]


def test_a_run_whose_dispatcher_died_before_sending_is_sent_by_whoever_follows_it(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    from simulator import build_release

    release = build_release(tmp_path / "release", time_scale=1000.0, noise=0.0, seed=3)
    with running_redis(tmp_path_factory) as server:
        # offline_after: the modules' heartbeats wait too while writes are paused
        lab = make_lab(tmp_path / "lab", (server.url, server), 2, offline_after=60.0)
        lab.start()
        client = redis.Redis(port=server.port)
        try:
            h = History(lab.settings.history_path)
            client.execute_command("CLIENT", "PAUSE", "60000", "WRITE")
            try:
                cli = subprocess.Popen(
                    [str(Path(sys.executable).parent / "fleetctl"), "validate", str(release.path), "--models",
                     "qwen3", "--devices", "sim-01,sim-02", "--detach"],
                    env=lab.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                run_id = wait_for(lambda: (runs := h.runs(limit=1)) and len(h.unsent(runs[0].run_id)) == 2
                                  and runs[0].run_id, 60, "the run and its two requests recorded", interval=0.05)
                time.sleep(0.3)
                assert cli.poll() is None, cli.communicate()
                cli.kill()
                cli.communicate(timeout=10)
            finally:
                client.execute_command("CLIENT", "UNPAUSE")
            progress = h.progress(run_id)
            assert {m: p.step for m, p in progress.items()} == {"sim-01": "queued", "sim-02": "queued"}
            # the dead controller's record is RESEND_AFTER old (not waited for here: its clock moved back)
            with h.tx() as c:
                c.execute("UPDATE unsent_requests SET created_at = created_at - ?", (RESEND_AFTER + 1,))
            started = time.monotonic()
            w = lab.fleetctl("watch", run_id)
            assert w.returncode in (0, 1) and "verdict:" in w.stdout, (w.stdout[-2000:], w.stderr[-2000:])
            assert time.monotonic() - started < 60  # not the 300 s a never-started part waits to be given up
            assert {m: p.state for m, p in h.progress(run_id).items()} == {"sim-01": RunState.DONE,
                                                                            "sim-02": RunState.DONE}
            assert h.unsent(run_id) == []
            events = [msg for _, _, msg in h.events(run_id)]
            assert sum("recorded but never sent" in msg for msg in events) == 2, events
            assert h.row_count(run_id) == 22
        finally:
            client.close()
            lab.stop()
