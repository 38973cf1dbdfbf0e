"""Reservations on real workers and both brokers (a real redis-server, the embedded one), issue 32 item 2.

User alice reserves sim-01 of a two-module lab: bob's validation on every module runs on sim-02 only, sim-01
recorded refused with who holds it until when; bob's on sim-01 alone is refused in one line; alice's own runs
there; renewed for 3 s it ends on time by itself (on Redis the key itself is gone), and bob's next run goes to
sim-01.
"""

from __future__ import annotations

import json
import time

import pytest

from contract.kv import reservation_key
from contract.records import RunState
from controller.fleet.reservations import shown_until
from tests.support.lab import broker  # noqa: F401 - the fixture, registered by name

pytestmark = pytest.mark.slow

FOR = 3.0  # seconds: the renewed reservation's, whose end the test waits for


def _validate(b, release, devices: str, user: str) -> str:
    r = b.lab.fleetctl("validate", str(release.path), "--models", "qwen3", "--devices", devices, "--detach",
                       user=user)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip().splitlines()[-1]


def test_a_reservation_keeps_other_users_off_its_module_and_expires_on_time(bench_factory, broker, release):  # noqa: F811
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

    theirs = _validate(b, release, "all", "bob")
    mine = _validate(b, release, "sim-01", "alice")
    r = b.lab.fleetctl("validate", str(release.path), "--models", "qwen3", "--devices", "sim-01", "--detach",
                       user="bob")
    assert (r.returncode, r.stderr) == (2, "fleetctl: error: every module selected is reserved by another user: "
                                           f"sim-01 {line} (see: fleetctl reservations)\n")
    r = b.lab.fleetctl("devices", "-o", "json", user="bob")
    assert {d["module"]: d["reserved"] for d in json.loads(r.stdout)} == {
        "sim-01": f"alice until {shown_until(until)}", "sim-02": ""}

    v = b.finished(theirs, 120)
    refused = v.progress["sim-01"]
    assert (refused.state, refused.attempt, refused.error.step, refused.error.message) == (
        RunState.FAILED, 0, "dispatch", line)
    assert v.progress["sim-02"].state == RunState.DONE
    assert b.benchmark_starts("sim-01", theirs) == {}
    v = b.finished(mine, 120)
    assert v.progress["sim-01"].state == RunState.DONE and b.benchmark_starts("sim-01", mine) == {"qwen3": 1}

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
    after = _validate(b, release, "all", "bob")
    v = b.finished(after, 120)
    assert {m: p.state for m, p in v.progress.items()} == {"sim-01": RunState.DONE, "sim-02": RunState.DONE}
    assert b.benchmark_starts("sim-01", after) == {"qwen3": 1}
    r = b.lab.fleetctl("describe", "module", "sim-01", "-o", "json")
    events = [e["message"] for e in json.loads(r.stdout)["reservation_events"]]
    assert events == [f"{line} [{held['id']}]", f"reserved by alice until {shown_until(until)} (flashing fw) "
                                                f"[{held['id']}]"]
