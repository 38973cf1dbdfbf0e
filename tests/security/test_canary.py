"""Slow tier (redis): a canary broker password appears nowhere but in the files meant to hold it.

A whole small validation (1 module, 1 key) against redis-server whose password is set in its
config file; the controller and the agent read it from ``broker_password_file``. While it
runs, every process's argument list and environment is sampled; afterwards every file under
the lab folders (logs, run records, the history database), the metric expositions, the
controller's output and every value on the broker are searched.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import threading
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from tests.support.secure import SecureRedis, fleetctl_path, make_secure_lab, secret_file

pytestmark = [pytest.mark.slow, pytest.mark.redis]


class ProcSampler(threading.Thread):
    """Reads every /proc/<pid>/cmdline and environ until stopped; records where the canary shows."""

    def __init__(self, canary: bytes) -> None:
        super().__init__(daemon=True)
        self.canary = canary
        self.found: list[str] = []
        self.samples = 0
        self.pids: set[int] = set()
        self.stopped = threading.Event()

    def sample(self) -> None:
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            self.pids.add(int(entry.name))
            for what in ("cmdline", "environ"):
                try:
                    data = Path(entry.path, what).read_bytes()
                except OSError:
                    continue
                if self.canary in data:
                    try:
                        cmd = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ")[:200]
                    except OSError:
                        cmd = b"?"
                    self.found.append(f"/proc/{entry.name}/{what} ({cmd!r})")
        self.samples += 1

    def run(self) -> None:
        while not self.stopped.is_set():
            self.sample()
            time.sleep(0.05)


def test_canary_password_is_nowhere(tmp_path):
    from simulator import build_release

    canary = "canary-" + secrets.token_hex(12)
    secrets_dir = tmp_path / "secrets"
    server = SecureRedis(tmp_path / "redis", password=canary)
    server.start()
    pw_file = secret_file(secrets_dir / "broker_password", canary)
    lab = make_secure_lab(tmp_path / "lab", server, 1, controller_password_file=pw_file)
    sampler = ProcSampler(canary.encode())
    sampler.start()
    try:
        lab.start()
        rel = build_release(tmp_path / "lab" / "release", time_scale=1000.0, noise=0.0, seed=3)
        proc = subprocess.run([fleetctl_path(), "validate", str(rel.path), "--models", "qwen3", "--devices", "sim-01"],
                              env=lab.env(), capture_output=True, text=True, timeout=180)
        assert proc.returncode in (0, 1), proc.stderr
        assert "done" in proc.stderr or "verdict" in proc.stdout, proc.stderr
        sampler.sample()
    finally:
        sampler.stopped.set()
        sampler.join(timeout=10)
        lab.stop()
    try:
        assert sampler.samples > 10 and len(sampler.pids) > 10
        assert sampler.found == [], f"canary in process arguments/environment: {sampler.found[:5]}"
        assert canary not in proc.stdout and canary not in proc.stderr

        # the metric expositions of the agent and the controller
        from agent.metrics import build_registry
        from controller.serve.metrics import ControllerCollector
        from controller.service import Session

        work = tmp_path / "lab" / "modules" / "sim-01" / "work"
        exposition = generate_latest(build_registry(work, "sim-01")).decode()
        st = Session(lab.settings)
        fleet = st.fleet()
        reg = CollectorRegistry()
        inv = list(st.inventory().modules)
        reg.register(ControllerCollector(st.history(), lambda: {k: v.state for k, v in fleet.statuses(inv).items()},
                                         lambda: fleet.queue_depths(inv)))
        exposition += generate_latest(reg).decode()
        assert "fleet_" in exposition or "m1000" in exposition
        assert canary not in exposition
        runs = st.history().runs()
        assert runs and runs[0].state == "done"
        st.close()

        # every file of the lab (logs, run records, history rows) and of the broker, but the two secret files
        meant = {pw_file.resolve(), server.conf.resolve()}
        seen = 0
        for root in (tmp_path / "lab", server.dir):
            for p in root.rglob("*"):
                if p.is_file() and not p.is_symlink() and p.resolve() not in meant:
                    seen += 1
                    assert canary.encode() not in p.read_bytes(), f"canary in {p}"
        assert seen > 20
        assert any(p.name == "history.sqlite" for p in (tmp_path / "lab").rglob("*"))
        assert list(work.glob("runs/*/request.json")) and list(work.glob("runs/*/logs/*.log"))
        assert (server.dir / "redis.log").is_file()

        # every value on the broker
        r = server.client()
        keys = r.keys("*")
        assert keys
        for k in keys:
            assert canary.encode() not in (r.dump(k) or b""), k
    finally:
        server.stop()
