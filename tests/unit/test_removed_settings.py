"""Settings issue 50 removed (ADR 0058): a config file or a variable that still names one is told so in one line,
and the program goes on (a rolling upgrade renders one config for agents of two versions, ADR 0051)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from agent.config import PROBE_TOLERANCE, STOP_GRACE, AgentConfig
from agent.settings import AgentSettings
from contract import removed_settings
from contract.removed_settings import REMOVED
from contract.settings import BrokerSettings, SettingsError, load_settings
from controller.settings import ControllerSettings

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for k in list(os.environ):
        if k.upper().startswith("FLEET_"):
            monkeypatch.delenv(k)
    monkeypatch.setattr(removed_settings, "_said", set())
    return monkeypatch


def test_an_old_config_file_is_told_in_one_line_per_removed_setting_and_still_loads(
        tmp_path: Path, clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "fleet.toml"
    cfg.write_text('[fleet]\nresult_expires = 100\nheartbeat_interval = 7\n'
                   '[agent]\nprobe_tolerance = 0.05\nstop_grace = 3\nserver_port = 31000\n'
                   '[controller]\napi_header_timeout = 2\nkeep_releases = 1\n')
    agent = load_settings(AgentSettings, cfg)
    assert (agent.heartbeat_interval, agent.server_port) == (7.0, 31000)  # the rest is applied
    err = capsys.readouterr().err.splitlines()
    assert err == [f"{cfg}: [fleet] result_expires is gone (issue 50): now a constant, 7 days; see CHANGELOG",
                   f"{cfg}: [agent] probe_tolerance is gone (issue 50): now a constant, 0.02; see CHANGELOG",
                   f"{cfg}: [agent] stop_grace is gone (issue 50): now a constant, 15 s; see CHANGELOG"]
    assert AgentConfig.from_settings(agent).probe_tolerance == PROBE_TOLERANCE == 0.02  # not the file's 0.05
    assert AgentConfig.from_settings(agent).stop_grace == STOP_GRACE
    controller = load_settings(ControllerSettings, cfg)
    assert controller.api_timeout == 10.0  # api_header_timeout is not carried over: api_timeout is its own
    assert capsys.readouterr().err.splitlines() == [
        f"{cfg}: [controller] api_header_timeout is gone (issue 50): merged into api_timeout; see CHANGELOG",
        f"{cfg}: [controller] keep_releases is gone (issue 50): now a constant, 5; see CHANGELOG"]
    load_settings(AgentSettings, cfg)
    assert capsys.readouterr().err == ""  # once a process


def test_a_removed_fleet_setting_written_under_a_program_section_is_named_there(
        tmp_path: Path, clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "fleet.toml"
    cfg.write_text('[controller]\nrun_soft_time_limit = 100\nrun_time_limit = 1000\n')
    s = load_settings(ControllerSettings, cfg)
    assert (s.run_time_limit, s.run_soft_time_limit) == (1000.0, 800.0)
    assert capsys.readouterr().err.strip() == (
        f"{cfg}: [controller] run_soft_time_limit is gone (issue 50): derived from run_time_limit, a fifth of it "
        "earlier, 600 s at most; see CHANGELOG")
    cfg.write_text('[agent]\nprobe_tolerence = 0.05\n')  # a misspelled name is still refused, as before
    with pytest.raises(SettingsError, match="unknown setting 'probe_tolerence'"):
        load_settings(AgentSettings, cfg)


def test_an_old_variable_is_told_in_one_line_by_the_program_it_was_for(
        clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    clean_env.setenv("FLEET_FINAL_RESEND_INTERVAL", "2")
    clean_env.setenv("FLEET_CONTROLLER_KEEP_RELEASES", "1")
    clean_env.setenv("FLEET_START_TIMEOUT", "5")
    AgentSettings()
    assert capsys.readouterr().err.splitlines() == [
        "FLEET_START_TIMEOUT: [fleet] start_timeout is gone (issue 50): now a constant, 300 s; see CHANGELOG",
        "FLEET_FINAL_RESEND_INTERVAL: [agent] final_resend_interval is gone (issue 50): derived: every sixth "
        "heartbeat (30 s at heartbeat_interval 5); see CHANGELOG"]
    ControllerSettings()
    assert capsys.readouterr().err.splitlines() == [
        "FLEET_CONTROLLER_KEEP_RELEASES: [controller] keep_releases is gone (issue 50): now a constant, 5; "
        "see CHANGELOG"]


def test_a_program_started_with_a_removed_setting_says_one_line_and_runs(tmp_path: Path) -> None:
    cfg = tmp_path / "fleet.toml"
    cfg.write_text('[controller]\nframe_cache_mib = 64\napi_port = 0\n')
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("FLEET_")}
    out = subprocess.run([sys.executable, "-c", "from controller.settings import ControllerSettings as C; "
                          "print(C().api_port)"], cwd=ROOT, env={**env, "FLEET_CONFIG": str(cfg)},
                         capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stdout.strip()) == (0, "0"), out.stderr
    assert out.stderr.splitlines() == [
        f"{cfg}: [controller] frame_cache_mib is gone (issue 50): now a constant, 1024 MiB; see CHANGELOG"]


def test_no_removed_name_is_a_setting_again() -> None:
    """A name is either a setting or removed, never both (a removed one comes back under a new name)."""
    fields = {"fleet": set(BrokerSettings.model_fields), "agent": set(AgentSettings.model_fields),
              "controller": set(ControllerSettings.model_fields)}
    for section, names in REMOVED.items():
        assert not set(names) & fields[section], section


def test_the_agent_config_takes_the_settings_defaults_and_bounds() -> None:
    """AgentConfig's fields that are [agent] settings come from AgentSettings: one default, one bound."""
    from agent.config import MIRRORED

    for name in MIRRORED:
        ours, theirs = AgentConfig.model_fields[name], AgentSettings.model_fields[name]
        assert (ours.default, ours.metadata, ours.description) == (theirs.default, theirs.metadata,
                                                                   theirs.description), name
    with pytest.raises(ValueError, match="less than or equal to 65535"):
        AgentConfig(module="m", workdir=Path("/tmp"), server_port=70000)
    assert AgentConfig(module="m", workdir=Path("/tmp")).probe_profiles == ("128:128",)
