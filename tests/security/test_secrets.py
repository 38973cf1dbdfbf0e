"""Fast tier: no password on a command line — compose, `fleetctl deploy`, SSH key passphrases."""

from __future__ import annotations

import tomllib
from pathlib import Path

import paramiko
import pytest
import yaml
from typer.testing import CliRunner

from contract.settings import BrokerSettings
from controller.inventory import Inventory, Module
from controller.remote import deploy as dep
from controller.remote import ssh
from tests.support.cli import given_app

ROOT = Path(__file__).resolve().parents[2]


def test_compose_redis_reads_its_password_from_a_config_file():
    text = (ROOT / "deploy" / "compose.yaml").read_text()
    redis = yaml.safe_load(text)["services"]["redis"]
    assert redis["command"][:2] == ["redis-server", "/etc/redis/redis.conf"]
    assert " ".join(redis["command"][2:]) == "--maxmemory-policy noeviction"  # an evicting broker is refused
    assert any(v.startswith("./redis:/etc/redis") for v in redis["volumes"])
    assert "environment" not in redis
    for word in ("requirepass", "REDIS_PASSWORD", "--requirepass"):
        assert word not in " ".join(redis["command"]) and word not in text.split("services:", 1)[1]
    example = (ROOT / "deploy" / "redis" / "redis.conf.example").read_text()
    assert "aclfile /etc/redis/users.acl" in example
    assert "\nmaxmemory-policy noeviction\n" in example
    ignored = (ROOT / ".gitignore").read_text()
    assert "/deploy/redis/redis.conf" in ignored and "/deploy/redis/passwords/" in ignored


def module() -> Module:
    return Module(name="mod-1", host="10.0.0.7")


def test_broker_url_option_with_a_password_is_refused():
    with pytest.raises(dep.DeployError, match="--broker-url carries a password") as exc:
        dep.render_config(module(), "/w", BrokerSettings(broker_url="redis://10.0.0.1/0"),
                          broker_url="redis://:hunter2@10.0.0.1/0")
    assert "hunter2" not in str(exc.value)
    dep.check_broker_url_option("redis://10.0.0.1/0")
    dep.check_broker_url_option(None)


def test_broker_url_option_takes_the_password_from_broker_password_file(tmp_path):
    pw = tmp_path / "pw"
    pw.write_text("s3cret\n")
    settings = BrokerSettings(broker_url="redis://10.0.0.1/0", broker_password_file=pw)
    text, password = dep.render_config(module(), "/w", settings, broker_url="redis://10.9.9.9:6380/1")
    assert password == "s3cret" and "s3cret" not in text
    cfg = tomllib.loads(text)
    assert cfg["fleet"]["broker_url"] == "redis://10.9.9.9:6380/1"
    assert cfg["fleet"]["broker_password_file"] == "/w/agent/broker_password"
    # and without --broker-url too
    text, password = dep.render_config(module(), "/w", settings)
    assert password == "s3cret" and tomllib.loads(text)["fleet"]["broker_url"] == "redis://10.0.0.1/0"


def test_module_credentials_give_each_agent_its_own_user(tmp_path):
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "mod-1.password").write_text("own-pw\n")
    settings = BrokerSettings(broker_url="rediss://ctl@broker.lab:6379/0")
    text, password = dep.render_config(module(), "/w", settings, credentials=creds)
    assert password == "own-pw"
    assert tomllib.loads(text)["fleet"]["broker_url"] == "rediss://mod-1@broker.lab:6379/0"
    with pytest.raises(dep.DeployError, match="broker password of mod-2"):
        dep.render_config(Module(name="mod-2"), "/w", settings, credentials=creds)


def test_fleetctl_deploy_refuses_a_password_on_the_command_line(tmp_path):
    kh = tmp_path / "known_hosts"
    kh.write_text("")
    app = given_app(inventory=Inventory(modules=(module(),)), settings=BrokerSettings(broker_url="redis://10.0.0.1/0"))
    res = CliRunner().invoke(app, ["deploy", "--known-hosts", str(kh), "--broker-url", "redis://u:hunter2@h:6379/0"])
    assert res.exit_code == 2
    assert "--broker-url carries a password" in res.output and "hunter2" not in res.output


def _encrypted_key(path: Path, passphrase: bytes) -> Path:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.generate()
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                       serialization.BestAvailableEncryption(passphrase)))
    path.chmod(0o600)
    return path


def test_ssh_key_passphrase_from_a_file(tmp_path, monkeypatch):
    key = _encrypted_key(tmp_path / "id_ed25519", b"key pass phrase")
    pf = tmp_path / "passphrase"
    pf.write_text("key pass phrase\n")
    m = module()
    monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)
    kw = ssh.connect_kwargs(ssh.SshTarget.of(m, tmp_path / "kh", key, passphrase_file=pf))
    assert kw["passphrase"] == "key pass phrase" and kw["key_filename"] == [str(key)] and kw["allow_agent"] is False
    paramiko.Ed25519Key.from_private_key_file(str(key), password=kw["passphrase"])  # the key opens with it
    with pytest.raises(paramiko.SSHException):
        paramiko.Ed25519Key.from_private_key_file(str(key))
    # no passphrase file: the ssh-agent is asked when one runs
    monkeypatch.setenv("SSH_AUTH_SOCK", str(tmp_path / "agent.sock"))
    kw = ssh.connect_kwargs(ssh.SshTarget.of(m, tmp_path / "kh", key))
    assert kw["allow_agent"] is True and "passphrase" not in kw
    with pytest.raises(ssh.AuthError, match="cannot read the SSH key passphrase"):
        ssh.connect_kwargs(ssh.SshTarget.of(m, tmp_path / "kh", key, passphrase_file=tmp_path / "nope"))


def test_deploy_passes_the_passphrase_file_to_ssh(tmp_path, monkeypatch):
    seen = {}

    def fake_open(target):
        seen["target"] = target
        raise ssh.UnreachableError(target.name, "stop here")

    monkeypatch.setattr(ssh, "open_session", fake_open)
    pf = tmp_path / "pp"
    opts = dep.DeployOptions(known_hosts=tmp_path / "kh", settings=BrokerSettings(broker_url="redis://h/0"),
                             identity=tmp_path / "key", passphrase_file=pf,
                             wheelhouse=lambda f: pytest.fail("the wheelhouse is built after SSH opens"))
    res = dep.deploy([module()], opts)
    assert res["mod-1"].status == "failed" and seen["target"].passphrase_file == pf


def test_deploy_installs_the_ca_and_the_module_client_certificate(tmp_path):
    ca = tmp_path / "ca.crt"
    ca.write_bytes(b"CA")
    creds = tmp_path / "creds"
    creds.mkdir()
    (creds / "mod-1.password").write_text("pw")
    (creds / "mod-1.crt").write_bytes(b"CRT")
    (creds / "mod-1.key").write_bytes(b"KEY")
    settings = BrokerSettings(broker_url="rediss://ctl@broker:6379/0", broker_tls_ca_file=ca)
    files = dep.agent_tls_files(module(), settings, creds)
    assert files == {"ca.crt": b"CA", "client.crt": b"CRT", "client.key": b"KEY"}
    text, _ = dep.render_config(module(), "/w", settings, credentials=creds, tls_files=sorted(files))
    dep.check_config(text)
    fleet = tomllib.loads(text)["fleet"]
    assert fleet["broker_tls_ca_file"] == "/w/agent/tls/ca.crt"
    assert fleet["broker_tls_cert_file"] == "/w/agent/tls/client.crt"
    assert fleet["broker_tls_key_file"] == "/w/agent/tls/client.key"
    from agent.settings import AgentSettings

    AgentSettings(**fleet)  # the agent accepts what deploy writes
