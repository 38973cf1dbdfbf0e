"""fleetctl's bad-input paths: one clear line on stderr, exit code 2, nothing dispatched."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from controller.cli.app import main

INV = '[[module]]\nname = "m1"\ntransport = "local"\n'


def run(capsys, *args: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as e:
        main(list(args))
    return int(e.value.code or 0), capsys.readouterr().err


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for k in ("FLEET_CONFIG", "FLEET_BROKER_URL", "FLEET_INVENTORY", "FLEET_HISTORY"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("FLEET_DATA_DIR", str(tmp_path / "fleet"))
    (tmp_path / "inv.toml").write_text(INV)
    tar = tmp_path / "SGLang-MUSA-M1000-M1000_1.4.1_sglang.tar.gz"
    tar.write_bytes(b"not really a tarball")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def one_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, err
    return lines[0]


def test_missing_tarball(env, capsys):
    code, err = run(capsys, "-i", "inv.toml", "validate", "nope.tar.gz", "--models", "qwen3")
    assert code == 2 and "nope.tar.gz: no such release tarball" in one_line(err)


def test_unknown_model_key(env, capsys):
    code, err = run(capsys, "-i", "inv.toml", "validate", "SGLang-MUSA-M1000-M1000_1.4.1_sglang.tar.gz",
                    "--models", "qwen3,qwen9")
    assert code == 2 and "unknown model key 'qwen9'" in one_line(err)


def test_unknown_device(env, capsys):
    code, err = run(capsys, "-i", "inv.toml", "validate", "SGLang-MUSA-M1000-M1000_1.4.1_sglang.tar.gz",
                    "--devices", "m2")
    assert code == 2 and "device selector 'm2': unknown module" in one_line(err)


def test_malformed_inventory(env, capsys):
    (env / "bad.toml").write_text('[[module]]\nname = "m1"\nssh_port = "twenty-two"\n')
    code, err = run(capsys, "-i", "bad.toml", "devices")
    assert code == 2
    assert "bad.toml: module 'm1': field 'ssh_port'" in one_line(err)


def test_broker_down_at_start(env, capsys, monkeypatch):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("FLEET_BROKER_URL", f"redis://:hunter2@127.0.0.1:{port}/0")
    code, err = run(capsys, "-i", "inv.toml", "validate", "SGLang-MUSA-M1000-M1000_1.4.1_sglang.tar.gz")
    line = one_line(err)
    assert code == 2 and "unreachable" in line and f"127.0.0.1:{port}" in line
    assert "hunter2" not in err


def test_unknown_run(env, capsys):
    code, err = run(capsys, "status", "no-such-run")
    assert code == 2 and "no run 'no-such-run'" in one_line(err)


def test_bad_tarball_name(env, capsys):
    (env / "release.tgz").write_bytes(b"x")
    code, err = run(capsys, "-i", "inv.toml", "validate", "release.tgz")
    assert code == 2 and "not a release tarball name" in one_line(err)


# the agent's worker, as the systemd unit starts it: a bad setting is one line and exit 2, not a traceback
@pytest.mark.parametrize(("how", "env_extra", "toml", "says"), [
    ("fleet-agent", {"FLEET_SERVER_PORT": "notaport"}, None, "server_port: Input should be a valid integer"),
    ("fleet-agent", {}, '[agent]\nserver_port = "x"\n', "server_port: Input should be a valid integer"),
    ("fleet-agent", {}, "[agent\n", "not valid TOML"),
    ("typer", {"FLEET_SERVER_PORT": "notaport"}, None, "server_port: Input should be a valid integer"),
])
def test_agent_worker_bad_settings_one_line(tmp_path, how, env_extra, toml, says):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env.update(env_extra, FLEET_WORKDIR=str(tmp_path / "work"), FLEET_DATA_DIR=str(tmp_path / "data"))
    args = ["worker"]
    if toml is not None:
        (tmp_path / "agent.toml").write_text(toml)
        args += ["--config", str(tmp_path / "agent.toml")]
    code = ("from agent.entry import main; main()" if how == "fleet-agent" else
            "import sys; sys.argv[0] = 'fleet-agent'; from agent.cli import main; main()")
    r = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=60)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr
    assert lines[0].startswith("error: settings: ") and says in lines[0], r.stderr


# a misspelled section was skipped: [controler] gave an empty `fleetctl runs`, [agnet] an agent named for its host
def test_fleetctl_refuses_a_misspelled_section(env, capsys):
    (env / "fleet.toml").write_text(f'[controler]\nhistory = "{env / "real.sqlite"}"\n')
    code, err = run(capsys, "-c", "fleet.toml", "runs")
    assert code == 2
    assert one_line(err) == ("fleetctl: error: fleet.toml: unknown section [controler] (did you mean [controller]?); "
                             "the sections are [fleet], [agent], [controller]")


@pytest.mark.parametrize("command", [["worker"], ["exporter"], ["run", "x.tar.gz", "--model-root", "."]])
def test_fleet_agent_refuses_a_misspelled_section(tmp_path, command):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env.update(FLEET_WORKDIR=str(tmp_path / "work"), FLEET_DATA_DIR=str(tmp_path / "data"))
    (tmp_path / "agent.toml").write_text('[agnet]\nmodule = "m-a01"\n')
    r = subprocess.run([sys.executable, "-c", "from agent.entry import main; main()", *command, "--config",
                        "agent.toml"], env=env, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("error: ") and line.endswith(
        "agent.toml: unknown section [agnet] (did you mean [agent]?); the sections are [fleet], [agent], [controller]")
