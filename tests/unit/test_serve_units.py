"""The shipped ways to run ``fleetctl serve`` (issue 48, item 1): the systemd user unit beside the agent's and the
exporter's, and the compose service; both read their settings from a config file, never a password."""

from __future__ import annotations

import configparser
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
UNIT = ROOT / "deploy" / "systemd" / "m1000-fleet-serve.service"


def test_the_serve_unit_runs_serve_from_a_config_file_and_spaces_its_restarts() -> None:
    unit = configparser.ConfigParser(interpolation=None, strict=False)
    unit.read(UNIT)
    svc = unit["Service"]
    assert svc["ExecStart"].endswith("/bin/fleetctl serve") and "FLEET_CONFIG=" in svc["Environment"]
    assert "password" not in svc["Environment"].lower() and "--history" not in svc["ExecStart"]
    assert svc["Restart"] == "on-failure" and int(svc["RestartSec"]) >= 5 and int(svc["RestartMaxDelaySec"]) >= 60
    assert unit["Unit"]["StartLimitIntervalSec"] == "0"  # never given up on


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_the_serve_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    exe = tmp_path / "venv" / "bin" / "fleetctl"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    unit = tmp_path / "m1000-fleet-serve.service"
    unit.write_text(UNIT.read_text().replace("%h/m1000-fleet", str(tmp_path)))
    r = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    # systemd older than 254 ignores the growing restart delay, saying so; nothing else
    assert [ln for ln in r.stderr.splitlines() if "RestartSteps" not in ln and "RestartMaxDelaySec" not in ln] == []


def test_the_compose_serve_service_mounts_its_settings_read_only_and_holds_no_secret() -> None:
    serve = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())["services"]["serve"]
    assert serve["build"]["dockerfile"] == "deploy/serve/Dockerfile"
    assert "./serve:/etc/m1000-fleet:ro" in serve["volumes"] and "environment" not in serve
    assert serve["restart"] == "unless-stopped" and serve["network_mode"] == "host"
    docker = (ROOT / "deploy" / "serve" / "Dockerfile").read_text()
    assert "--require-hashes -r requirements.lock" in docker and "USER fleet" in docker
    assert 'ENTRYPOINT ["fleetctl", "serve"]' in docker and "FLEET_CONFIG=/etc/m1000-fleet/fleet.toml" in docker
