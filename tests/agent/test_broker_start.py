"""``fleet-agent worker`` on a broker it cannot use (issue 48, item 5): one line and a status of its own each, against
real redis-servers (nothing listening, a wrong password, an ACL user without the module's rights, TLS with a CA that
did not sign the server's certificate, plain Redis spoken to a TLS port); the cause named, no password said.

The pure classifier (:func:`agent.broker_start.start_failure`) is checked on redis-py's own errors first (fast)."""

from __future__ import annotations

import os
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.exceptions as rx
from kombu.exceptions import OperationalError

from agent.broker_start import EXIT_ACL, EXIT_CREDENTIALS, EXIT_TLS, EXIT_UNREACHABLE, start_failure
from simulator.ports import free_port
from tests.support.secure import SecureRedis, make_tls, need_redis, secret_file, start_acl_redis

WHERE = "redis://127.0.0.1:6379/0"
SECRET = "the-right-password-0123"


def _raised_from(outer: BaseException, inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as e:
            raise outer from e
    except BaseException as wrapped:
        return wrapped


@pytest.mark.parametrize(("exc", "code", "words"), [
    (rx.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused."), EXIT_UNREACHABLE,
     "unreachable (Error 111"),
    (rx.AuthenticationError("invalid username-password pair or user is disabled."), EXIT_CREDENTIALS,
     "refused the credentials"),
    (rx.ResponseError("WRONGPASS invalid username-password pair"), EXIT_CREDENTIALS, "broker_password_file"),
    (rx.NoPermissionError("this user has no permissions to run the 'set' command"), EXIT_ACL, "(ACL)"),
    (rx.ConnectionError("Error 1 connecting to h:6379. [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed"),
     EXIT_TLS, "broker_tls_ca_file"),
    (_raised_from(OperationalError("Error 111 connecting"), rx.ConnectionError("refused")), EXIT_UNREACHABLE,
     "unreachable"),
    (_raised_from(rx.ConnectionError("Error connecting"), ssl.SSLError(1, "wrong version number")), EXIT_TLS,
     "TLS failed"),
    (rx.ConnectionError("Error while reading from h:6379 : (104, 'Connection reset by peer')"), EXIT_UNREACHABLE,
     "a TLS-only port spoken to without TLS?"),
])
def test_each_cause_gets_its_line_and_status(exc: BaseException, code: int, words: str) -> None:
    f = start_failure(exc, WHERE)
    assert f is not None and f.code == code and words in f.line, f
    assert f.line.startswith(f"broker {WHERE}") and "\n" not in f.line


def test_an_error_that_is_not_the_brokers_is_left_to_its_traceback() -> None:
    assert start_failure(KeyError("x"), WHERE) is None and start_failure(ZeroDivisionError(), WHERE) is None


# --------------------------------------------------------------------------- real servers
def _agent(base: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    e.update({"FLEET_MODULE": "m1", "FLEET_WORKDIR": str(base / "work"), "FLEET_MODEL_ROOT": str(base / "models"),
              "FLEET_METRICS_PORT": "0", **env})
    return subprocess.run([sys.executable, "-m", "agent.worker"], env=e, capture_output=True, text=True, timeout=120)


def _one_line(r: subprocess.CompletedProcess[str], code: int) -> str:
    out = (r.stdout + r.stderr).strip()
    assert r.returncode == code, out
    assert "Traceback" not in out and len(out.splitlines()) == 1, out
    assert SECRET not in out
    return out


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[SecureRedis]:
    need_redis()
    server = SecureRedis(tmp_path / "redis-tls", tls=make_tls(tmp_path / "tls"))
    try:
        server.start()
    except RuntimeError as exc:  # a redis-server built without TLS
        pytest.skip(f"redis-server without TLS: {exc}")
    yield server
    server.stop()


@pytest.mark.slow
def test_nothing_listening(tmp_path: Path) -> None:
    line = _one_line(_agent(tmp_path, {"FLEET_BROKER_URL": f"redis://127.0.0.1:{free_port()}/0"}), EXIT_UNREACHABLE)
    assert line.startswith("error: broker redis://127.0.0.1:") and "Connection refused" in line, line


@pytest.mark.slow
def test_a_wrong_password(tmp_path: Path) -> None:
    need_redis()
    server = SecureRedis(tmp_path / "redis", password=SECRET)
    server.start()
    try:
        r = _agent(tmp_path, {"FLEET_BROKER_URL": server.url(),
                              "FLEET_BROKER_PASSWORD_FILE": str(secret_file(tmp_path / "pw", "not-" + SECRET))})
    finally:
        server.stop()
    assert "refused the credentials (invalid username-password pair" in _one_line(r, EXIT_CREDENTIALS)


@pytest.mark.slow
def test_an_acl_user_without_the_modules_rights(tmp_path: Path) -> None:
    server, files = start_acl_redis(tmp_path, ["m1", "m2"])
    try:  # module m1 started with module m2's user and password: the broker's ACL refuses m1's keys to it
        r = _agent(tmp_path, {"FLEET_BROKER_URL": server.url("m2"),
                              "FLEET_BROKER_PASSWORD_FILE": str(files.passwords / "m2.password")})
    finally:
        server.stop()
    line = _one_line(r, EXIT_ACL)
    assert "refused a command to this user (ACL): this user has no permissions" in line, line
    assert (files.passwords / "m2.password").read_text().strip() not in line


@pytest.mark.slow
def test_tls_with_a_ca_that_did_not_sign_the_server(tmp_path: Path, tls_server: SecureRedis) -> None:
    tls = tls_server.tls
    assert tls is not None
    r = _agent(tmp_path, {"FLEET_BROKER_URL": tls_server.url(), "FLEET_BROKER_TLS_CA_FILE": str(tls["wrong_ca"]),
                          "FLEET_BROKER_TLS_CERT_FILE": str(tls["client_cert"]),
                          "FLEET_BROKER_TLS_KEY_FILE": str(tls["client_key"])})
    line = _one_line(r, EXIT_TLS)
    assert "TLS failed" in line and "CERTIFICATE_VERIFY_FAILED" in line, line


@pytest.mark.slow
def test_plain_redis_to_a_tls_port(tmp_path: Path, tls_server: SecureRedis) -> None:
    line = _one_line(_agent(tmp_path, {"FLEET_BROKER_URL": f"redis://127.0.0.1:{tls_server.port}/0"}),
                     EXIT_UNREACHABLE)
    assert "a TLS-only port spoken to without TLS? then use rediss://" in line, line


def test_the_shipped_units_space_their_restarts_out_and_never_give_up() -> None:
    import configparser

    root = Path(__file__).resolve().parents[2]
    for path in (root / "deploy" / "systemd" / "fleet-agent.service",
                 root / "controller" / "remote" / "deploy" / "scripts" / "fleet-agent.service"):
        unit = configparser.ConfigParser(interpolation=None, strict=False)
        unit.read_string(path.read_text().replace("{", "").replace("}", ""))
        svc = unit["Service"]
        assert svc["Restart"] == "always" and svc["RestartSec"] == "5", path
        assert int(svc["RestartSteps"]) >= 1 and int(svc["RestartMaxDelaySec"]) >= 60, path
        assert unit["Unit"]["StartLimitIntervalSec"] == "0", path
