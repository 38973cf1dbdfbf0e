"""The recovery policy's pure parts: when a module is power-cycled, its bounds, the lines the report shows, the
inventory's power entry and the pdudaemon request it makes (controller.fleet.power, controller.remote.pdu)."""

from __future__ import annotations

from typing import Any

import pytest

from controller.fleet.power import (
    Action,
    PartPower,
    PowerPolicy,
    attention_of,
    cycle_lines,
    cycled_text,
    plan_power,
)
from controller.inventory import InventoryError, PowerEntry, parse_inventory
from controller.remote.pdu import request_url

POLICY = PowerPolicy(cycle_after=240.0, per_run=1, per_hour=3)
ENTRY = PowerEntry(pdudaemon="http://pdu:16421", pdu="rack-a", port="3")


def part(**kw: Any) -> PartPower:
    return PartPower(**{"module": "sim-03", "ended": False, "silent": 250.0, "beat_at": 1000.0, **kw})


def test_silent_past_cycle_after_is_cycled_once_then_waits_for_its_heartbeat():
    assert plan_power([part(silent=239.0)], POLICY) == []
    assert plan_power([part()], POLICY) == [Action("sim-03", "cycle", "no heartbeat for 250 s", 250.0)]
    waiting = part(silent=400.0, cycles=(1250.0,))
    assert plan_power([waiting], PowerPolicy(240.0, per_run=5)) == []  # never twice while it waits
    back = part(silent=1.0, beat_at=1262.0, cycles=(1250.0,))
    assert plan_power([back], POLICY) == [Action("sim-03", "back", seconds=12.0)]


def test_bounds_per_run_and_per_hour_are_said_once():
    done = part(cycles=(1250.0,), settled=(1262.0,))
    (a,) = plan_power([done], POLICY)
    assert a.kind == "bound" and "1 cycle(s) in this run (bound 1)" in a.why
    assert plan_power([part(cycles=(1250.0,), settled=(1262.0,), bounded=True)], POLICY) == []
    (h,) = plan_power([part(hour=3)], POLICY)
    assert h.kind == "bound" and "3 in the last hour (bound 3)" in h.why


def test_a_pdu_that_failed_or_a_module_needing_attention_is_never_cycled_again():
    assert plan_power([part(failed=True)], POLICY) == []
    assert plan_power([part(attention=True)], POLICY) == []
    assert plan_power([part(ended=True)], POLICY) == []
    assert plan_power([part(silent=None, beat_at=None)], POLICY) == []


def test_attention_holds_until_a_heartbeat_or_a_reset():
    events = [(100.0, "needs attention: no heartbeat for 250 s, and its power cycle failed: ...")]
    assert attention_of(events, beat_at=90.0) is not None
    assert attention_of(events, beat_at=101.0) is None
    assert attention_of([*events, (120.0, "failures reset: 0 failed run(s) in a row cleared")], 90.0) is None
    assert attention_of([], 90.0) is None


def test_report_lines_say_what_happened():
    cycled = cycled_text(36720.0, 240.4, 4, 7, "the controller", ENTRY)
    assert cycled.startswith("power-cycled at ") and "4/7 keys passed" in cycled
    hhmm = cycled.split()[2]
    ev = [("sim-03", 1.0, cycled), ("sim-03", 2.0, "power-cycle back: its heartbeat 12 s after the cycle")]
    assert cycle_lines(ev) == [f"sim-03 power-cycled at {hhmm} after no heartbeat for 240 s; resumed from 4/7 keys"]
    assert cycle_lines(ev[:1])[0].endswith("waiting for its heartbeat")
    lost = [ev[0], ("sim-03", 3.0, "marked lost: agent lost: no heartbeat for 600 s")]
    assert cycle_lines(lost)[0].endswith("did not come back (marked lost: agent lost: no heartbeat for 600 s)")
    failed = [("sim-04", 1.0, "power-cycle failed: no heartbeat for 250 s: PDU ...; the module needs attention")]
    assert cycle_lines(failed) == [f"sim-04 {failed[0][2]}"]


def test_power_entry_in_the_inventory():
    inv = parse_inventory({"module": [{"name": "a", "power": {"pdudaemon": "http://pdu:16421/", "pdu": "rack-a",
                                                               "port": 3}}]})
    assert inv.modules[0].power == ENTRY
    for bad, field in ((
            {"pdudaemon": "http://pdu:16421/x", "pdu": "p", "port": "1"}, "power.pdudaemon"),
            ({"pdudaemon": "http://pdu", "pdu": "p; reboot", "port": "1"}, "power.pdu"),
            ({"pdudaemon": "http://pdu", "pdu": "p", "port": "1", "user": "x"}, "power.user")):
        with pytest.raises(InventoryError, match=f"field '{field}'"):
            parse_inventory({"module": [{"name": "a", "power": bad}]})


def test_pdudaemon_requests():
    assert request_url(ENTRY, "cycle") == "http://pdu:16421/power/control/reboot?hostname=rack-a&port=3"
    assert request_url(ENTRY, "off") == "http://pdu:16421/power/control/off?hostname=rack-a&port=3"
    with pytest.raises(ValueError, match="expected one of on, off, cycle"):
        request_url(ENTRY, "reset")


def test_power_cycles_metric_from_the_history(tmp_path):
    from prometheus_client import CollectorRegistry

    from controller.history import History
    from controller.serve.metrics import ControllerCollector

    h = History(tmp_path / "h.sqlite")
    h.add_module_event("sim-03", "power-cycled: run r1: at 10:12 after no heartbeat for 240 s; ...")
    h.add_module_event("sim-03", "power-cycled: run r2: at 11:40 after no heartbeat for 250 s; ...")
    h.add_module_event("sim-04", "needs attention: no heartbeat for 250 s, and its power cycle failed: ...")
    h.add_module_event("sim-04", "failures reset: 0 failed run(s) in a row cleared")
    assert h.power_cycle_counts() == {("sim-03", "done"): 2, ("sim-04", "failed"): 1}
    reg = CollectorRegistry()
    reg.register(ControllerCollector(h, states=dict, queue_depths=dict))
    assert reg.get_sample_value("m1000_fleet_power_cycles", {"module": "sim-03", "result": "done"}) == 2
    assert reg.get_sample_value("m1000_fleet_power_cycles", {"module": "sim-04", "result": "failed"}) == 1


def test_kernel_logs_kept_when_lost_failed_or_restarted():
    from contract.records import KeyOutcome, RunProgress, RunState
    from controller.fleet.kernel_logs import failed_parts, reason

    now = 10_000.0
    base = RunProgress(run_id="r1", module="sim-03", release="1.4.1", keys_total=2, updated_at=now - 5)
    assert reason(base, now) is None  # running, first delivery
    assert reason(base.model_copy(update={"state": RunState.LOST}), now) == "lost"
    failed_key = base.model_copy(update={"state": RunState.DONE, "outcomes": (
        KeyOutcome(model_key="qwen3", status="failed"),)})
    assert reason(failed_key, now) == "a key failed"
    assert reason(base.model_copy(update={"attempt": 2}), now) == "its agent started again mid-run"
    assert reason(base.model_copy(update={"state": RunState.LOST}), now + 7200) is None  # an old run synced again
    ev = [("sim-03", 1.0, "serial console kept (lost): /data/module-logs/r1/sim-03/console.log"),
          ("sim-03", 1.5, "kernel log kept (lost): /data/module-logs/r1/sim-03"),
          ("sim-04", 2.0, "kernel log not kept (a key failed): sim-04: unreachable\nmore"),
          ("sim-04", 3.0, "power-cycled: ...")]
    assert failed_parts(ev, "r1") == [
        ("sim-03", "lost", ("serial console kept", "kernel log and agent journal kept"),
         "fleetctl logs r1 --module sim-03 --kernel"),
        ("sim-04", "a key failed", ("kernel log not kept (sim-04: unreachable)",), "")]


def test_unreachable_past_its_hard_time_limit_is_cycled_before_power_cycle_after():
    policy = PowerPolicy(cycle_after=240.0, offline_after=30.0, run_time_limit=15000.0)
    assert plan_power([part(silent=60.0, running_for=14000.0)], policy) == []
    (a,) = plan_power([part(silent=60.0, running_for=15100.0)], policy)
    assert a.kind == "cycle" and a.why == ("no heartbeat for 60 s, and running for 15100 s, past its hard time "
                                           "limit (15000 s)")
    assert plan_power([part(silent=20.0, running_for=15100.0)], policy) == []  # its heartbeat is fresh: alive


def test_a_part_that_ended_after_its_cycle_was_back_even_unseen_beating():
    ended = part(ended=True, silent=300.0, beat_at=1000.0, cycles=(1250.0,), reported_at=1290.0)
    assert plan_power([ended], POLICY) == [Action("sim-03", "back", seconds=40.0)]
    assert plan_power([part(ended=True, lost=True, silent=700.0, cycles=(1250.0,), reported_at=1700.0)], POLICY) == []
