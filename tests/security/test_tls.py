"""Slow tier (redis): the fleet over TLS — redis-server with --tls-port, CA and certificates made here.

A small fleet run passes over TLS (server certificate verified against our CA, client
certificates required); a controller given the wrong CA is refused with a one-line error.
"""

from __future__ import annotations

import subprocess

import pytest

from contract.settings import BrokerSettings
from tests.support.redis_server import REDIS
from tests.support.secure import SecureRedis, fleetctl_path, make_secure_lab, make_tls

pytestmark = [pytest.mark.slow, pytest.mark.redis]


def redis_has_tls() -> bool:
    if not REDIS:
        return False
    out = subprocess.run([REDIS, "--version"], capture_output=True, text=True).stdout
    ldd = subprocess.run(["ldd", REDIS], capture_output=True, text=True).stdout
    return "libssl" in ldd or "build=" in out  # Debian builds link OpenSSL


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory):
    if not redis_has_tls():
        pytest.skip("redis-server without TLS")
    tls = make_tls(tmp_path_factory.mktemp("tls"))
    server = SecureRedis(tmp_path_factory.mktemp("redis-tls"), tls=tls)
    server.start()
    try:
        yield server
    finally:
        server.stop()


def test_settings_build_the_tls_options(tmp_path):
    s = BrokerSettings(broker_url="rediss://h:6379/0", broker_tls_ca_file=tmp_path / "ca",
                       broker_tls_cert_file=tmp_path / "c", broker_tls_key_file=tmp_path / "k")
    from contract.celery_app import make_app

    app = make_app(s)
    for key in ("broker_use_ssl", "redis_backend_use_ssl"):
        opts = app.conf[key]
        assert opts["ssl_ca_certs"] == str(tmp_path / "ca") and opts["ssl_certfile"] == str(tmp_path / "c")
        assert opts["ssl_keyfile"] == str(tmp_path / "k") and opts["ssl_cert_reqs"].name == "CERT_REQUIRED"
    with pytest.raises(ValueError, match="need a rediss://"):
        BrokerSettings(broker_url="redis://h/0", broker_tls_ca_file=tmp_path / "ca")
    with pytest.raises(ValueError, match="go together"):
        BrokerSettings(broker_url="rediss://h/0", broker_tls_cert_file=tmp_path / "c")


def test_plain_connection_to_the_tls_port_fails(tls_server):
    import redis

    with pytest.raises(redis.ConnectionError):
        redis.Redis(host="127.0.0.1", port=tls_server.port, socket_timeout=2).ping()
    assert tls_server.client().ping()


def test_fleet_run_over_tls(tls_server, tmp_path):
    from simulator import build_release

    lab = make_secure_lab(tmp_path / "lab", tls_server, 1)
    assert lab.settings.broker_url.startswith("rediss://")
    lab.start()
    try:
        rel = build_release(tmp_path / "release", time_scale=1000.0, noise=0.0, seed=3)
        r = subprocess.run([fleetctl_path(), "validate", str(rel.path), "--models", "qwen3", "--devices", "sim-01"],
                           env=lab.env(), capture_output=True, text=True, timeout=180)
        assert r.returncode in (0, 1), r.stderr
        from controller.history import History

        run = History(lab.settings.history_path).runs()[0]
        assert run.state == "done", r.stderr
        assert len(History(lab.settings.history_path).rows(run.run_id)) == 11
    finally:
        lab.stop()


def test_wrong_ca_is_refused_with_one_clear_line(tls_server, tmp_path):
    lab = make_secure_lab(tmp_path / "lab", tls_server, 1)
    env = lab.env()
    env["FLEET_BROKER_TLS_CA_FILE"] = str(tls_server.tls["wrong_ca"])
    rel = tmp_path / "SGLang-MUSA-M1000-M1000_1.4.1_sglang.tar.gz"
    rel.write_bytes(b"x")
    r = subprocess.run([fleetctl_path(), "validate", str(rel), "--models", "qwen3"], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2, (r.returncode, r.stderr)
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, r.stderr
    assert "unreachable" in lines[0] and "certificate verify failed" in lines[0].lower(), lines[0]
