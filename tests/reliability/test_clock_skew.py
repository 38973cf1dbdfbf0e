"""Agents whose clocks are off the controller's (edge modules without NTP), on real processes and both brokers.

Each agent runs with its wall clock shifted (``skewed_clock/sitecustomize.py``: ``time.time`` of the agent
and of the Python processes of its release; the kernel's clock, and so the broker's and the files' times,
are not). Liveness is the broker's clock: a module 300 s behind stays idle and takes work, one 120 s
ahead goes unreachable as soon as its agent dies, and ``fleetctl devices`` shows each one's measured skew.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from contract.records import RunState
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow

SHIM = Path(__file__).parent / "skewed_clock"
BEHIND, AHEAD = -300, 120  # sim-01's clock, sim-02's, against the real one (s)


def shifted(offset: int) -> dict[str, str]:
    return {"PYTHONPATH": str(SHIM), "M1000_TEST_CLOCK_OFFSET": str(offset)}


def test_skewed_agents_stay_live_take_work_and_go_unreachable_when_killed(bench_factory, broker, quick_release):
    b = bench_factory(broker, 2)
    b.lab.start(["sim-01", "sim-02"], sim_env={"sim-01": shifted(BEHIND), "sim-02": shifted(AHEAD)})
    mods = b.lab.state().inventory().modules
    offline_after = b.lab.settings.offline_after

    # both idle, and they stay so for longer than offline_after (the one behind is not taken for silent)
    end = time.monotonic() + offline_after + 2
    while time.monotonic() < end:
        st = b.fleet.statuses(mods)
        assert {n: s.state for n, s in st.items()} == {"sim-01": "idle", "sim-02": "idle"}, \
            {n: (s.state, s.reason) for n, s in st.items()}
        time.sleep(0.5)

    # the measured skew: in `fleetctl devices -o json` and its table, warned past clock_skew_warn (30 s)
    r = b.lab.fleetctl("devices", "-o", "json")
    assert r.returncode == 0, r.stderr
    devs = {d["module"]: d for d in json.loads(r.stdout)}
    assert abs(devs["sim-01"]["clock_skew_s"] - BEHIND) < 3, devs["sim-01"]
    assert abs(devs["sim-02"]["clock_skew_s"] - AHEAD) < 3, devs["sim-02"]
    assert devs["sim-01"]["state"] == devs["sim-02"]["state"] == "idle"
    assert "clock 300 s behind the controller's" in devs["sim-01"]["reason"], devs["sim-01"]
    assert "clock 120 s ahead of the controller's" in devs["sim-02"]["reason"], devs["sim-02"]
    table = b.lab.fleetctl("devices")
    assert "-300 s" in table.stdout and "+120 s" in table.stdout, table.stdout

    # both take work and finish it
    run_id = b.validate(quick_release, "sim-01,sim-02", ("qwen3",))  # time scale 1000: its figures do not matter
    view = b.check_run(run_id, 120, modules=("sim-01", "sim-02"))
    assert {m: p.state for m, p in view.progress.items()} == {"sim-01": RunState.DONE, "sim-02": RunState.DONE}
    assert view.state() == "done"

    # a killed agent goes unreachable within offline_after of its last beat, however its clock was off
    for name in ("sim-02", "sim-01"):
        b.lab.kill(name)
        t0 = time.monotonic()
        wait_for(lambda n=name: b.fleet.statuses(mods)[n].state == "unreachable", offline_after + 10,
                 f"{name} unreachable")
        took = time.monotonic() - t0
        assert took <= offline_after + b.lab.settings.heartbeat_interval + 2, (name, took)
