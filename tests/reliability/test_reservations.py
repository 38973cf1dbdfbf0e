"""Reservations on real workers and both brokers (a real redis-server, the embedded one), issue 32 item 2.

User alice reserves sim-01 of a two-module lab: bob's validation on every module runs on sim-02 only, sim-01
recorded refused with who holds it until when; bob's on sim-01 alone (every module it selects reserved) is queued
there and waits: the module holds it back (status and queue say for whom) while alice's own run goes ahead of it;
renewed for 3 s the reservation ends on time by itself (on Redis the key itself is gone), and bob's waiting run
then runs there, once.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from contract.kv import reservation_key
from contract.records import RunState
from controller.fleet.reservations import shown_until
from tests.support.lab import broker  # noqa: F401 - the fixture, registered by name

pytestmark = pytest.mark.slow

# seconds: the renewed reservation's, whose end the test waits for (3 s ran out before a `reservations` listing
# under a loaded slow tier)
FOR = 8.0


def _validate(b, release, devices: str, user: str) -> str:
    r = b.lab.fleetctl("validate", str(release.path), "--models", "qwen3", "--devices", devices, "--detach",
                       user=user)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().splitlines()[-1]


def test_a_reservation_keeps_other_users_off_its_module_and_expires_on_time(bench_factory, broker,  # noqa: F811
                                                                           quick_release):
    """Where each run goes and when is asserted, not its figures: quick_release (time scale 1000)."""
    b = bench_factory(broker, 2)
    b.lab.start()
    r = b.lab.fleetctl("reserve", "--devices", "sim-01", "--for", "1h", "--reason", "flashing fw", user="alice")
    assert r.returncode == 0, r.stderr
    r = b.lab.fleetctl("reservations", "-o", "json", user="bob")
    (held,) = json.loads(r.stdout)
    until = held["until"]
    assert (held["module"], held["user"], held["reason"]) == ("sim-01", "alice", "flashing fw")
    line = f"reserved by alice until {shown_until(until)} (flashing fw)"
    r = b.lab.fleetctl("reserve", "--devices", "sim-01,sim-02", "--for", "1h", user="bob")
    assert (r.returncode, r.stderr) == (2, f"fleetctl: error: sim-01 is {line}: not reserved\n")

    theirs = _validate(b, quick_release, "all", "bob")
    mine = _validate(b, quick_release, "sim-01", "alice")
    r = b.lab.fleetctl("validate", str(quick_release.path), "--models", "qwen3", "--devices", "sim-01", "--detach",
                       user="bob")
    assert r.returncode == 0, r.stderr
    assert f"sim-01: queued, waits until the reservation ends: {line}" in r.stderr
    waiting = r.stdout.strip().splitlines()[-1]
    r = b.lab.fleetctl("devices", "-o", "json", user="bob")
    assert {d["module"]: d["reserved"] for d in json.loads(r.stdout)} == {
        "sim-01": f"alice until {shown_until(until)}", "sim-02": ""}

    v = b.finished(theirs, 120)
    refused = v.progress["sim-01"]
    assert (refused.state, refused.attempt, refused.error.step, refused.error.message) == (
        RunState.FAILED, 0, "refused", line)
    assert v.progress["sim-02"].state == RunState.DONE
    assert b.benchmark_starts("sim-01", theirs) == {}
    v = b.finished(mine, 120)  # alice's run went ahead of bob's, queued on her module before it
    assert v.progress["sim-01"].state == RunState.DONE and b.benchmark_starts("sim-01", mine) == {"qwen3": 1}
    assert b.benchmark_starts("sim-01", waiting) == {}
    r = b.lab.fleetctl("status", waiting, "-o", "json", user="bob")
    assert json.loads(r.stdout)["reserved"] == {"sim-01": line}
    seen = []  # the module puts the held run back on its queue every few seconds: it is listed there meanwhile
    for _ in range(40):
        seen = [q for q in json.loads(b.lab.fleetctl("queue", "-o", "json").stdout)["runs"] if q["run_id"] == waiting]
        if seen:
            break
        time.sleep(0.3)
    assert [(q["module"], q["priority"], q["asked"], q["behind"]) for q in seen] == [("sim-01", "low", "normal", line)]

    # renewed by its user for a short while from now (its id kept), then it ends by itself
    r = b.lab.fleetctl("reserve", "--devices", "sim-01", "--for", f"{FOR:.0f}s", user="alice")
    assert r.returncode == 0, r.stderr
    (renewed,) = json.loads(b.lab.fleetctl("reservations", "-o", "json", user="bob").stdout)
    assert (renewed["id"], renewed["reason"]) == (held["id"], "flashing fw") and renewed["until"] < until
    until = renewed["until"]
    time.sleep(max(0.0, until - time.time()) + 0.2)
    r = b.lab.fleetctl("reservations", "-o", "json", user="bob")
    assert (r.returncode, json.loads(r.stdout)) == (0, [])
    if broker[1] is not None:  # Redis: the key itself expired (its controller could have been gone)
        time.sleep(1.0)  # its expiry: the time left, rounded up to a whole second
        assert b.fleet.kv.backend.client.exists(reservation_key("sim-01")) == 0
    v = b.finished(waiting, 120)  # held until the reservation ended, then run there once
    assert v.progress["sim-01"].state == RunState.DONE and v.progress["sim-01"].attempt == 1
    assert b.benchmark_starts("sim-01", waiting) == {"qwen3": 1}
    r = b.lab.fleetctl("describe", "module", "sim-01", "-o", "json")
    events = [e["message"] for e in json.loads(r.stdout)["reservation_events"]]
    assert events == [f"{line} [{held['id']}]", f"reserved by alice until {shown_until(until)} (flashing fw) "
                                                f"[{held['id']}]"]


@pytest.mark.skipif(shutil.which("faketime") is None,
                    reason="needs faketime (Debian: faketime) to run a controller whose clock is an hour behind")
def test_a_reservation_by_a_controller_an_hour_behind_keeps_others_off_its_module(bench_factory, shared_redis,
                                                                                  quick_release):
    """Issue 48: alice's controller, its clock an hour behind (libfaketime), reserves sim-01 for 30 minutes; bob's
    (right clock) sees it held for 30 minutes, not over, and his validation of every module leaves sim-01 out.
    Reservations end by the broker's clock (the key's expiry), not by each reader's; the skewed controller says so."""
    b = bench_factory((shared_redis.url, shared_redis), 2)
    b.lab.start()
    exe = Path(sys.executable).parent / "fleetctl"
    r = subprocess.run(["faketime", "-f", "-3600s", str(exe), "reserve", "--devices", "sim-01", "--for", "30m"],
                       env={**b.lab.env(), "FLEET_USER": "alice"}, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "warning: this controller's clock is 3600 s behind the broker's" in r.stderr, r.stderr
    (held,) = json.loads(b.lab.fleetctl("reservations", "-o", "json", user="bob").stdout)
    assert held["user"] == "alice" and 29 * 60 < held["until"] - time.time() <= 30 * 60 + 1, held
    theirs = _validate(b, quick_release, "all", "bob")
    v = b.finished(theirs, 120)
    refused = v.progress["sim-01"]
    assert (refused.state, refused.error.step) == (RunState.FAILED, "refused"), refused
    assert v.progress["sim-02"].state == RunState.DONE
    assert b.benchmark_starts("sim-01", theirs) == {}
