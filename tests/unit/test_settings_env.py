"""Settings from arguments, ``FLEET_*`` variables and the TOML file, on plain pydantic (no pydantic-settings)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.settings import AgentSettings
from contract.settings import BrokerSettings, SettingsError, load_settings
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
        AgentSettings().module = "x"


SHARED = '[fleet]\nheartbeat_interval = 7\n[agent]\nmodule = "m-a01"\n[controller]\nhistory = "/srv/h.sqlite"\n'


def test_a_file_shared_by_both_programs_serves_each(tmp_path: Path, clean_env: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "fleet.toml"
    cfg.write_text(SHARED)
    a, c = load_settings(AgentSettings, cfg), load_settings(ControllerSettings, cfg)
    assert (a.module, a.heartbeat_interval) == ("m-a01", 7.0)
    assert (c.history_path, c.heartbeat_interval) == (Path("/srv/h.sqlite"), 7.0)


def test_a_postgresql_url_names_a_shared_history_shown_without_its_credentials(clean_env: pytest.MonkeyPatch) -> None:
    c = ControllerSettings(history="postgresql://fleet:s3cret@db.lab:5432/runs")
    assert c.history_location == "postgresql://fleet:s3cret@db.lab:5432/runs"  # what the history is opened from
    assert c.history_path == "postgresql://***@db.lab:5432/runs"  # what messages name
    assert ControllerSettings(history=Path("~/h.sqlite")).history_location == Path.home() / "h.sqlite"
    assert ControllerSettings(data_dir=Path("/srv/fleet")).history_location == Path("/srv/fleet/history.sqlite")
    # model_copy(update=...) runs no validator: a Path given so is still the file (as code and tests copy settings)
    copied = ControllerSettings().model_copy(update={"history": Path("/srv/b.sqlite")})
    assert (copied.history_location, copied.history_path) == (Path("/srv/b.sqlite"), Path("/srv/b.sqlite"))


@pytest.mark.parametrize(("text", "says"), [
    ('[controler]\nhistory = "/srv/h.sqlite"\n',
     "unknown section [controler] (did you mean [controller]?); the sections are [fleet], [agent], [controller]"),
    ('[agnet]\nmodule = "x"\n',
     "unknown section [agnet] (did you mean [agent]?); the sections are [fleet], [agent], [controller]"),
    (SHARED + '[prometheus]\nport = 1\n',
     "unknown section [prometheus]; the sections are [fleet], [agent], [controller]"),
    ('broker_url = "redis://r:6379/0"\n',
     "setting 'broker_url' is outside any section (settings go under [fleet], [agent], [controller])"),
    ('[fleet]\nmodule = "x"\n', None),  # per program, below
    ('[agent]\nmodul = "x"\n', "[agent]: unknown setting 'modul' (did you mean 'module'?)"),
])
@pytest.mark.parametrize("cls", [AgentSettings, ControllerSettings])
def test_a_section_or_setting_no_program_knows_is_refused_naming_the_file(
        tmp_path: Path, clean_env: pytest.MonkeyPatch, text: str, says: str | None, cls: type) -> None:
    cfg = tmp_path / "fleet.toml"
    cfg.write_text(text)
    if says is None:
        says = ("[fleet]: unknown setting 'module' (it belongs under [agent])" if cls is AgentSettings
                else "[fleet]: unknown setting 'module'")
    if "[agent]: unknown setting" in says and cls is ControllerSettings:
        load_settings(cls, cfg)  # the agent's section: the controller does not read it
        return
    with pytest.raises(SettingsError) as exc:
        load_settings(cls, cfg)
    assert str(exc.value) == f"{cfg}: {says}"


def test_every_program_reads_a_section_every_program_accepts() -> None:
    from contract.settings import CONFIG_SECTIONS

    assert {BrokerSettings.config_section, AgentSettings.config_section, ControllerSettings.config_section} == set(
        CONFIG_SECTIONS)


def _own(cls: type[BrokerSettings]) -> list[str]:
    return [n for n in cls.model_fields if cls is BrokerSettings or n not in BrokerSettings.model_fields]


def test_no_variable_is_read_by_both_programs_for_different_settings(clean_env: pytest.MonkeyPatch) -> None:
    """A controller and an agent on one machine: FLEET_METRICS_PORT was both /metrics ports."""
    agent = {AgentSettings.env_var(n): n for n in _own(AgentSettings)}
    controller = {ControllerSettings.env_var(n): n for n in _own(ControllerSettings)}
    assert set(agent) & set(controller) == set()
    assert ControllerSettings.env_var("metrics_port") == "FLEET_CONTROLLER_METRICS_PORT"
    clean_env.setenv("FLEET_METRICS_PORT", "9500")
    clean_env.setenv("FLEET_CONTROLLER_METRICS_PORT", "9501")
    clean_env.setenv("FLEET_METRICS_HOST", "0.0.0.0")
    assert (AgentSettings().metrics_port, ControllerSettings().metrics_port) == (9500, 9501)
    assert (AgentSettings().metrics_host, ControllerSettings().metrics_host) == ("0.0.0.0", "127.0.0.1")


def test_every_setting_and_its_variable_is_in_the_configuration_reference() -> None:
    """docs/reference/configuration.md (generated by `make reference`): each setting's row names its variable."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "reference" / "configuration.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip(): line for line in page.splitlines() if line.startswith("| `[")}
    want = {f"`[{cls.config_section}] {n}`": cls.env_var(n)
            for cls in (BrokerSettings, AgentSettings, ControllerSettings) for n in _own(cls)}
    assert {k: f"`{v}`" in rows.get(k, "") for k, v in want.items()} == dict.fromkeys(want, True)
    assert "`FLEET_CONTROLLER_METRICS_PORT`" in rows["`[controller] metrics_port`"]
