"""Sentinel settings and the Celery app built from them (no server: settings and configuration only)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from agent.settings import AgentSettings
from contract.celery_app import make_app
from contract.settings import BrokerSettings

URL = "sentinel://127.0.0.1:26379;sentinel://127.0.0.1:26380;sentinel://127.0.0.1:26381/0"


def test_sentinel_url_needs_a_master_name() -> None:
    with pytest.raises(ValidationError, match="needs broker_sentinel_master"):
        BrokerSettings(broker_url=URL)
    with pytest.raises(ValidationError, match="is for a sentinel:// broker_url"):
        BrokerSettings(broker_url="redis://127.0.0.1:6379/0", broker_sentinel_master="m")


@pytest.mark.parametrize("url, why", [
    ("redis://a:1;redis://b:2", "only a sentinel:// broker_url lists several servers"),
    ("sentinel://a:1;redis://b:2", "every server of a sentinel broker_url is sentinel://host:port"),
    ("sentinel://:pw@a:1;sentinel://", "every server of a sentinel broker_url"),
])
def test_bad_sentinel_urls(url: str, why: str) -> None:
    with pytest.raises(ValidationError, match=why) as exc:
        BrokerSettings(broker_url=url, broker_sentinel_master="m")
    assert ":pw@" not in exc.value.errors()[0]["msg"]  # the message names the server redacted


def test_password_file_goes_into_every_server_and_is_redacted(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("s3cr/t\n")
    s = BrokerSettings(broker_url=URL, broker_sentinel_master="m1000", broker_password_file=secret)
    merged = s.broker_url_with_secret()
    assert merged.count(":s3cr%2Ft@127.0.0.1") == 3 and merged.endswith("/0")
    s2 = BrokerSettings(broker_url=merged, broker_sentinel_master="m1000")
    assert "s3cr" not in s2.redacted_broker_url() and s2.redacted_broker_url().count(":***@") == 3


def test_tls_is_refused_with_sentinel(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="need a rediss://"):
        BrokerSettings(broker_url=URL, broker_sentinel_master="m", broker_tls_ca_file=tmp_path / "ca.crt")


def test_sentinel_app_keeps_the_hardening_and_the_module_keys(tmp_path: Path) -> None:
    app = make_app(AgentSettings(module="m-01", broker_url=URL, broker_sentinel_master="m1000", workdir=tmp_path),
                   module="m-01")
    assert app.conf.broker_transport == "contract.safe_transport:SentinelTransport"
    opts = app.conf.broker_transport_options
    assert opts["master_name"] == "m1000" and opts["unacked_key"] == "unacked:module.m-01"
    assert app.conf.result_backend_transport_options["master_name"] == "m1000"
    assert type(app.backend).__name__ == "SentinelBackend"
    from contract.safe_transport import SentinelTransport

    with app.connection_for_write() as conn:
        assert isinstance(conn.transport, SentinelTransport)
        assert [a.split("/")[2] for a in conn.alt] == ["127.0.0.1:26379", "127.0.0.1:26380", "127.0.0.1:26381"]


def test_deploy_writes_a_sentinel_config_without_the_password(tmp_path: Path) -> None:
    import tomllib

    from controller.inventory import Module
    from controller.remote import deploy as dep

    url = "sentinel://:pw@10.0.0.1:26379;sentinel://:pw@10.0.0.2:26379;sentinel://:pw@10.0.0.3:26379/0"
    text, pw = dep.render_config(Module(name="m1"), "/w", BrokerSettings(broker_url=url, broker_sentinel_master="lab"))
    fleet = tomllib.loads(text)["fleet"]
    assert pw == "pw" and "pw" not in fleet["broker_url"] and fleet["broker_url"].count("sentinel://") == 3
    assert fleet["broker_sentinel_master"] == "lab" and fleet["broker_password_file"] == "/w/agent/broker_password"
    assert dep.with_user(fleet["broker_url"], "m1").count("sentinel://m1@") == 3


def test_final_state_waits_for_a_replica_with_sentinel_only() -> None:
    assert AgentSettings(broker_url=URL, broker_sentinel_master="m").replicas_to_wait() == 1
    assert AgentSettings(broker_url="redis://127.0.0.1:6379/0").replicas_to_wait() == 0
    assert AgentSettings(broker_url="redis://127.0.0.1:6379/0", final_state_replicas=2).replicas_to_wait() == 2
    assert AgentSettings(broker_url=URL, broker_sentinel_master="m", final_state_replicas=0).replicas_to_wait() == 0
