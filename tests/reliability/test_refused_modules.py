"""A run judged on the modules that ran (issue 46 item 5): real workers, a real redis-server, the real CLI.

Alice reserves sim-02: bob's validation over sim-01..03 (``--on-reserved skip``, the default) runs on sim-01 and
sim-03, both pass, and it ends INCOMPLETE, not FAILED, its verdict line naming sim-02 and its holder. Then sim-01
fails a golden check (``bad``): a validation of sim-01 and sim-02 (every selected module refused) is FAILED with
both reasons; one of sim-01 and sim-04 runs on sim-04 alone and is INCOMPLETE, naming sim-01. Exit 1 each time:
only a pass exits 0.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from contract.records import RunState
from controller.fleet.reservations import shown_until
from controller.history import GOLDEN_DRIFT_EVENT, History
from tests.support.lab import Lab, make_lab
from tests.support.redis_server import RedisServer

pytestmark = [pytest.mark.slow, pytest.mark.redis]


@pytest.fixture
def lab(tmp_path: Path, shared_redis: RedisServer) -> Iterator[Lab]:
    lab = make_lab(tmp_path / "lab", (shared_redis.url, shared_redis), 4)
    lab.start()
    try:
        yield lab
    finally:
        lab.stop()


def _verdict(lab: Lab, release, devices: str) -> tuple[int, str, str]:
    """(exit code, the verdict line, the run id) of bob's validation, followed to its end."""
    r = lab.fleetctl("validate", str(release.path), "--models", "qwen3", "--devices", devices, user="bob")
    lines = [x for x in r.stdout.splitlines() if x.startswith("verdict: ")]
    assert len(lines) == 1, (r.stdout, r.stderr)
    run_id = History(lab.settings.history_path).find_run("latest").run_id
    return r.returncode, lines[0], run_id


def test_refused_modules_make_the_run_incomplete_and_every_module_refused_fails_it(lab: Lab, quick_release) -> None:
    """Each run with rows is its modules' first (no previous run to compare with: at time scale 1000 one profile of
    one module against its previous run can be 50 % off, which is the figures', not this test's, business)."""
    r = lab.fleetctl("reserve", "--devices", "sim-02", "--for", "1h", "--reason", "flashing fw", user="alice")
    assert r.returncode == 0, r.stderr
    until = json.loads(lab.fleetctl("reservations", "-o", "json").stdout)[0]["until"]
    held = f"sim-02 reserved by alice until {shown_until(until)} (flashing fw)"

    code, line, run_id = _verdict(lab, quick_release, "sim-01,sim-02,sim-03")
    assert code == 1
    assert line.startswith(f"verdict: incomplete - INCOMPLETE {run_id} "), line
    assert ": no regression; " in line, line  # the probe's disagreements at time scale 1000 are named after it
    assert line.endswith(f"; refused at dispatch: {held}; judged on the 2 module(s) that ran"), line
    h = History(lab.settings.history_path)
    info = h.find_run(run_id)
    assert (info.state, info.verdict) == ("done", "incomplete")
    assert {m: p.state for m, p in h.progress(run_id).items()} == {
        "sim-01": RunState.DONE, "sim-02": RunState.FAILED, "sim-03": RunState.DONE}
    r = lab.fleetctl("report", run_id, "-o", "json", "--check")
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert (doc["verdict"], doc["modules"], list(doc["refused"])) == ("incomplete", ["sim-01", "sim-03"], ["sim-02"])

    h.add_module_event("sim-01", f"{GOLDEN_DRIFT_EVENT}: qwen3 decode_tps -9.0% vs its own history (run g1)")
    bad = "sim-01 module bad: golden check: qwen3 decode_tps -9.0% vs its own history (run g1); takes work again " \
          "after `fleetctl devices reset sim-01`"
    code, line, run_id = _verdict(lab, quick_release, "sim-01,sim-02")
    assert code == 1
    assert line.startswith(f"verdict: failed - FAILED {run_id} "), line
    assert line.endswith(f"; refused at dispatch: {bad}; {held}; no module ran"), line
    assert h.find_run(run_id).state == "failed"

    code, line, run_id = _verdict(lab, quick_release, "sim-01,sim-04")
    assert code == 1
    assert line.startswith(f"verdict: incomplete - INCOMPLETE {run_id} "), line
    assert line.endswith(f"; refused at dispatch: {bad}; judged on the 1 module(s) that ran"), line
