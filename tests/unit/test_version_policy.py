"""The version policy (ADR 0051), pure: which contract versions run together, what is read tolerantly, what a
module too far apart gets. The records of the previous version are real: ``tests/fixtures/contract_v1`` was written
by this repository's code at the commit it names (a run's sealed final state, its rows, a heartbeat)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from contract.compat import CONTRACT, judge, refused_line, request_for, runs_request
from contract.records import Heartbeat, ResultRow, RunProgress, RunRequest
from contract.version import SCHEMA_VERSION, versions
from controller.fleet.collect import record_gap
from controller.fleet.states import ModuleStatus
from controller.service.lifecycle import check_contracts
from controller.service.session import Conflict

V1 = json.loads((Path(__file__).parents[1] / "fixtures" / "contract_v1" / "records.json").read_text(encoding="utf-8"))
REQUEST = {"run_id": "r1", "module": "sim-01", "tarball": "/r/x.tar.gz", "sha256": "ab" * 32, "models": ["qwen3"],
           "model_root": "/models"}


def test_the_contract_is_the_records_schema_version() -> None:
    assert CONTRACT == SCHEMA_VERSION == 2
    assert versions()["works_with_agents"] == "contract 1 to 3"


@pytest.mark.parametrize(("agent", "standing", "sent"), [
    (CONTRACT, "current", CONTRACT), (CONTRACT - 1, "behind", CONTRACT - 1), (CONTRACT + 1, "ahead", CONTRACT),
    (CONTRACT - 2, "refused", None), (CONTRACT + 2, "refused", None), (None, "unknown", CONTRACT)])
def test_a_controller_works_with_agents_one_version_either_side(agent, standing, sent) -> None:
    c = judge(agent)
    assert (c.standing, c.request, c.runs) == (standing, sent, sent is not None)
    if sent is not None and agent is not None:
        assert runs_request(sent, agent)  # what it is sent, the agent runs


def test_an_agent_runs_its_version_and_the_one_before() -> None:
    assert [v for v in range(CONTRACT - 3, CONTRACT + 3) if runs_request(v)] == [CONTRACT - 1, CONTRACT]


def test_devices_flags_a_module_not_at_the_controllers_version() -> None:
    assert judge(CONTRACT).shown() == str(CONTRACT) and judge(CONTRACT).note("m") == ""
    assert judge(CONTRACT - 1).shown() == f"{CONTRACT - 1} (behind)"
    assert "upgrade it with `fleetctl deploy --devices m`" in judge(CONTRACT - 1).note("m")
    assert "upgrade the controller" in judge(CONTRACT + 1).note("m")
    assert judge(None).shown() == ""


def test_the_refusal_names_the_modules_and_fleetctl_deploy() -> None:
    line = refused_line({"b": judge(CONTRACT - 2), "a": judge(CONTRACT - 3)})
    assert line.startswith(f"a (contract {CONTRACT - 3}), b (contract {CONTRACT - 2}): cannot run")
    assert "`fleetctl deploy --devices a,b`" in line and "no run was created" in line and "\n" not in line
    assert "upgrade the controller" in refused_line({"a": judge(CONTRACT + 2)})


def test_validate_refuses_before_the_run_is_created() -> None:
    def status(name: str, version: int | None) -> ModuleStatus:
        hb = None if version is None else Heartbeat(module=name, agent_version="x", ts=0.0, schema_version=version)
        return ModuleStatus(name, "idle", heartbeat=hb)

    from controller.inventory import Module

    mods = [Module(name=n, host="h", model_root="/m") for n in ("a", "b", "c", "d")]
    ok = {"a": status("a", CONTRACT), "b": status("b", CONTRACT - 1), "c": status("c", CONTRACT + 1),
          "d": status("d", None)}
    notes = check_contracts(mods, ok)  # no raise; what to upgrade where one version apart
    assert sorted(notes) == ["b", "c"] and "fleetctl deploy --devices b" in notes["b"]
    with pytest.raises(Conflict, match=r"^d \(contract 0\): cannot run .*fleetctl deploy --devices d`"):
        check_contracts(mods, {**ok, "d": status("d", CONTRACT - 2)})


def test_a_request_is_sent_in_the_version_its_agent_runs() -> None:
    full = RunRequest.model_validate(REQUEST).model_dump(mode="json")
    assert request_for(full, CONTRACT - 1)["schema_version"] == CONTRACT - 1
    added = {CONTRACT + 1: ("flavour",)}  # a field a later version adds: dropped when unset, refused when set
    later = {**full, "schema_version": CONTRACT + 1, "flavour": None}
    assert "flavour" not in request_for(later, CONTRACT, added)
    with pytest.raises(ValueError, match="request field flavour .* is set"):
        request_for({**later, "flavour": "x"}, CONTRACT, added)


def test_a_request_stays_strict_what_is_only_read_is_tolerant() -> None:
    with pytest.raises(ValidationError, match="flavour"):
        RunRequest.model_validate({**REQUEST, "flavour": "x"})
    p = V1["progress"]
    later = {**p, "schema_version": CONTRACT + 1, "new_field": 1, "telemetry": {**p["telemetry"], "new": 2},
             "outcomes": [{**o, "new": 3} for o in p["outcomes"]], "error": {**p["error"], "new": 4}}
    assert RunProgress.model_validate(later).model_dump(exclude={"schema_version"}) == \
        RunProgress.model_validate(p).model_dump(exclude={"schema_version"})
    row = {**V1["rows"][0], "new_column": 1.5, "energy": {"start": 1.0, "end": 2.0, "window_s": 1.0, "new": 1}}
    assert ResultRow.model_validate(row).energy is not None
    assert Heartbeat.model_validate({**V1["heartbeat"], "new": True}).module == "sim-01"


def test_records_of_the_previous_version_are_read_and_their_seal_holds() -> None:
    """A final state sealed by a contract 1 agent: its rows and telemetry, read by today's models, match its seal
    (nothing in the controller's history counted missing)."""
    p = RunProgress.model_validate(V1["progress"])
    rows = [ResultRow.model_validate(r) for r in V1["rows"]]
    assert p.schema_version == CONTRACT - 1 and p.rows_digest and p.telemetry is not None
    assert record_gap(p, rows, p.telemetry) is None
    assert record_gap(p, rows[:1], p.telemetry) is not None  # a row short: counted (the check can fail)
    assert Heartbeat.model_validate(V1["heartbeat"]).schema_version == CONTRACT - 1


def test_a_seal_holds_across_a_version_that_adds_fields(monkeypatch) -> None:
    """A later version adds a column to the rows and a field to the telemetry it holds: an agent of that version
    answering a request of today's version seals in today's version, and today's controller (which drops the fields
    it does not know) finds the seal holding; a seal of the later version would not (the rule can fail)."""
    from pydantic import create_model

    from contract import compat
    from contract.digest import seal, seal_version
    from contract.records import FieldStats, KeyTelemetry, TelemetrySummary

    later = CONTRACT + 1
    monkeypatch.setattr(compat, "RECORD_FIELDS_ADDED", {later: {"ResultRow": ("x",), "KeyTelemetry": ("y",)}})
    row_later = create_model("ResultRow", __base__=ResultRow, x=(int | None, None))
    key_later = create_model("KeyTelemetry", __base__=KeyTelemetry, y=(str, ""))
    rows = [row_later.model_validate({**r, "schema_version": later, "x": 7}) for r in V1["rows"]]
    tel = V1["progress"]["telemetry"]
    summary = TelemetrySummary.model_validate(tel).model_copy(update={"keys": (key_later.model_validate(
        {**tel["keys"][0], "fields": {"power_w": FieldStats(n=1, min=1, mean=1, max=1, p95=1)}, "y": "z"}),)})
    p = RunProgress.model_validate({k: v for k, v in V1["progress"].items() if k not in ("telemetry",)})
    p = p.model_copy(update={"schema_version": later, "telemetry": summary})

    sealed = seal(p, rows, CONTRACT)  # the request it answers was of today's version
    assert sealed.schema_version == CONTRACT and seal_version(sealed) == CONTRACT
    # today's controller: the rows and the summary as it parsed them (x and y dropped), checked at today's version
    read_rows = [ResultRow.model_validate(r.model_dump(mode="json")) for r in rows]
    read_summary = TelemetrySummary.model_validate(summary.model_dump(mode="json"))
    assert "x" not in read_rows[0].model_dump() and read_summary.keys[0].model_dump().get("y") is None
    assert record_gap(sealed, read_rows, read_summary) is None
    # the same agent answering a request of its own version: its seal covers x and y, which today's reader lacks
    assert record_gap(seal(p, rows, later), read_rows, read_summary) is not None
    # and a controller of the later version checks today's agent's seal without them
    assert record_gap(seal(p, read_rows, CONTRACT), rows, summary) is None


def test_contract_2_adds_no_field_a_contract_1_reader_would_refuse() -> None:
    """Contract 1 readers (controllers and agents before ADR 0051) refuse a field they do not know, so contract 2
    writes exactly contract 1's fields in every record the other side reads. A field added here waits for contract 3
    (then listed in RECORD_FIELDS_ADDED, and this fixture made again from contract 2's code: make.py beside it)."""
    from contract.energy import EnergyWindow
    from contract.fingerprint import EnvFingerprint
    from contract.kernel_store import KernelCacheUse
    from contract.records import DeviceInfo, FieldStats, KeyOutcome, KeyTelemetry, StepError, TelemetrySummary

    assert V1["schema_version"] == CONTRACT - 1 == 1, "contract 3: make the fixture from contract 2's code"
    p, tel = V1["progress"], V1["progress"]["telemetry"]
    written: dict[type[BaseModel], Any] = {
        RunProgress: p, ResultRow: V1["rows"][0], Heartbeat: V1["heartbeat"], StepError: p["error"],
        KeyOutcome: p["outcomes"][1], TelemetrySummary: tel, KeyTelemetry: tel["keys"][0],
        FieldStats: tel["keys"][0]["fields"]["power_w"], DeviceInfo: tel["devices"][0],
        EnergyWindow: V1["rows"][0]["energy"], EnvFingerprint: p["fingerprint"], KernelCacheUse: p["kernel_cache"]}
    for cls, v1 in written.items():
        assert set(cls.model_fields) == set(v1), f"{cls.__name__}: {set(cls.model_fields) ^ set(v1)}"
