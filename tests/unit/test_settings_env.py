"""Settings from arguments, ``FLEET_*`` variables and the TOML file, on plain pydantic (no pydantic-settings)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.settings import AgentSettings
from contract.settings import SettingsError, load_settings
from controller.settings import ControllerSettings


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    import os

    for k in list(os.environ):
        if k.upper().startswith("FLEET_"):
            monkeypatch.delenv(k)
    return monkeypatch


def test_arguments_beat_variables_beat_the_file_beat_defaults(tmp_path: Path, clean_env: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "agent.toml"
    cfg.write_text('[fleet]\nheartbeat_interval = 7\n[agent]\nmodule = "from-file"\nserver_port = 31000\n')
    s = load_settings(AgentSettings, cfg)
    assert (s.module, s.server_port, s.heartbeat_interval, s.metrics_port) == ("from-file", 31000, 7.0, 9400)
    clean_env.setenv("fleet_module", "from-env")  # any case, as before
    clean_env.setenv("FLEET_SERVER_PORT", "32000")
    s = load_settings(AgentSettings, cfg, server_port=33000)
    assert (s.module, s.server_port, s.heartbeat_interval) == ("from-env", 33000, 7.0)


def test_list_settings_are_json_and_a_bad_one_names_its_variable(tmp_path: Path,
                                                                 clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("FLEET_RELEASE_ROOTS", json.dumps([str(tmp_path / "a")]))
    clean_env.setenv("FLEET_WEBHOOK_URLS", '["https://ci.example/hook"]')
    clean_env.setenv("FLEET_PROBE", "false")
    a = AgentSettings(workdir=tmp_path)
    assert a.release_roots == [tmp_path / "a"] and a.probe is False
    assert ControllerSettings().webhook_urls == ("https://ci.example/hook",)
    clean_env.setenv("FLEET_RELEASE_ROOTS", str(tmp_path / "a"))
    with pytest.raises(SettingsError, match=r"^FLEET_RELEASE_ROOTS: not valid JSON"):
        AgentSettings(workdir=tmp_path)


def test_a_bad_value_is_a_validation_error_naming_the_setting(clean_env: pytest.MonkeyPatch) -> None:
    clean_env.setenv("FLEET_OFFLINE_AFTER", "soon")
    with pytest.raises(ValueError, match="offline_after"):
        AgentSettings()
    clean_env.delenv("FLEET_OFFLINE_AFTER")
    with pytest.raises(ValueError, match="frozen"):
        AgentSettings().module = "x"  # type: ignore[misc]
