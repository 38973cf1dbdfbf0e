"""``fleetctl devices power MODULE on|off|cycle`` and its API route (role admin), through a real pdudaemon whose
local-command driver is the outlet of tests/support/outlet.py (a process stands in for the module): the outlet
really goes off and on; refused for a module another user reserved; recorded in the history."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import psutil
import pytest

from controller.history import History
from controller.serve.tokens import V2_HEADER
from controller.settings import ControllerSettings
from tests.support import outlet
from tests.support.wait import wait_for

pytestmark = pytest.mark.slow


def test_power_by_hand_cli_and_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys):
    from fastapi.testclient import TestClient

    from controller.serve.api import Tokens, create_app
    from tests.support.cli import run_main

    stand_in = subprocess.Popen(["sleep", "600"], start_new_session=True)
    threading.Thread(target=stand_in.wait, daemon=True).start()
    work = tmp_path / "m1" / "work"
    work.mkdir(parents=True)
    outlets = tmp_path / "outlets.json"
    entry = outlet.wire(outlets, "1", stand_in.pid, work)
    try:
        with outlet.running_pdudaemon(tmp_path / "pdu", outlets) as url:
            (tmp_path / "inv.toml").write_text(
                f'[[module]]\nname = "m1"\ntransport = "local"\npower = {{ pdudaemon = "{url}", pdu = "lab-pdu", '
                'port = "1" }\n\n[[module]]\nname = "m2"\ntransport = "local"\n')
            env = {"FLEET_BROKER_URL": "filesystem://", "FLEET_DATA_DIR": str(tmp_path / "fleet"),
                   "FLEET_INVENTORY": str(tmp_path / "inv.toml"), "FLEET_HISTORY": str(tmp_path / "h.sqlite"),
                   "FLEET_USER": "alice"}
            for k, v in env.items():
                monkeypatch.setenv(k, v)
            code, out, err = run_main(capsys, "devices", "power", "m1", "off")
            assert code == 0 and "m1: power off done (PDU lab-pdu port 1" in out, err
            wait_for(lambda: not psutil.pid_exists(stand_in.pid) or stand_in.poll() is not None, 10, "the outlet off")
            code, out, err = run_main(capsys, "devices", "power", "m1", "on")
            assert code == 0, err
            back = int(Path(entry["pidfile"]).read_text())
            assert back != stand_in.pid and psutil.Process(back).cmdline()[:1] == ["sleep"]
            code, _, err = run_main(capsys, "devices", "power", "m2", "cycle")
            assert code == 2 and "m2 has no power entry" in err
            code, _, err = run_main(capsys, "devices", "power", "m1", "reboot")
            assert code == 2 and "expected one of on, off, cycle" in err
            monkeypatch.setenv("FLEET_USER", "bob")
            assert run_main(capsys, "reserve", "--devices", "m1", "--for", "1h")[0] == 0
            monkeypatch.setenv("FLEET_USER", "alice")
            code, _, err = run_main(capsys, "devices", "power", "m1", "cycle")
            assert code == 2 and "m1 is reserved by bob until" in err and "not powered cycle" in err, err
            events = [msg for _, msg in History(tmp_path / "h.sqlite").module_events("m1")]
            assert [e.split(":")[0] for e in events if e.startswith("power")] == ["power off by alice",
                                                                                  "power on by alice"]
            tokens = tmp_path / "tokens"
            tokens.write_text(V2_HEADER + "\ntom trigger trigger-token-0123456789abcdef\n"
                                          "bob admin admin-token-0123456789abcdef\n")
            tokens.chmod(0o600)
            settings = ControllerSettings(broker_url="filesystem://", data_dir=tmp_path / "fleet",
                                          inventory=tmp_path / "inv.toml", history=tmp_path / "h.sqlite")
            with TestClient(create_app(settings, Tokens.load(tokens))) as c:
                path = "/api/v1/devices/m1/power/cycle"
                r = c.post(path, headers={"Authorization": "Bearer trigger-token-0123456789abcdef"})
                assert r.status_code == 403, r.text
                r = c.post(path, headers={"Authorization": "Bearer admin-token-0123456789abcdef"})
                assert r.status_code == 200 and r.json()["line"].startswith("m1: power cycle done"), r.text
                r = c.post("/api/v1/devices/m2/power/off",
                           headers={"Authorization": "Bearer admin-token-0123456789abcdef"})
                assert r.status_code == 400 and "no power entry" in r.json()["detail"], r.text
    finally:
        outlet.off(entry)
