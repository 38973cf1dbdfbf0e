"""Helpers of the security tests: a redis-server started from a config file (password, ACL file,
TLS), raw messages as an attacker with broker access writes them, labs whose processes get
their secrets from files only.

Labs reuse ``tests/support/lab.py``'s simulated modules (real ``fleet-agent`` workers).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from controller.cli.demo import inventory_toml, start_worker, stop_workers, wait_for_heartbeats
from controller.remote.acl import AclFiles, write_acl
from controller.settings import ControllerSettings
from simulator.ports import free_port
from tests.support.lab import Lab
from tests.support.redis_server import REDIS

REDIS_CLI = shutil.which("redis-cli")


def need_redis() -> str:
    """redis-server's path; without one the test is skipped."""
    if not REDIS:
        pytest.skip("redis-server not installed (make test installs Debian's redis-server)")
    return REDIS


@dataclass
class SecureRedis:
    """redis-server configured by a file (mode 0600): nothing secret on its command line."""

    dir: Path
    password: str | None = None  # requirepass (default user)
    aclfile: Path | None = None
    tls: dict[str, Path] | None = None  # ca, cert, key of the server
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def conf(self) -> Path:
        return self.dir / "redis.conf"

    def write_conf(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        lines = ["bind 127.0.0.1", f"dir {self.dir}", "save \"\"", "appendonly no", "daemonize no",
                 "protected-mode yes", f"logfile {self.dir / 'redis.log'}"]
        if self.tls:
            lines += ["port 0", f"tls-port {self.port}", f"tls-ca-cert-file {self.tls['ca']}",
                      f"tls-cert-file {self.tls['cert']}", f"tls-key-file {self.tls['key']}", "tls-auth-clients yes"]
        else:
            lines.append(f"port {self.port}")
        if self.aclfile:
            lines.append(f"aclfile {self.aclfile}")
        elif self.password:
            lines.append(f"requirepass {self.password}")
        self.conf.write_text("\n".join(lines) + "\n")
        os.chmod(self.conf, 0o600)

    def start(self) -> None:
        server = need_redis()
        self.write_conf()
        self.proc = subprocess.Popen([server, str(self.conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        end = time.monotonic() + 10
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                log = (self.dir / "redis.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"redis-server exited: {log}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                return
            time.sleep(0.05)
        raise RuntimeError("redis-server did not start")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)

    def client(self, username: str | None = None, password: str | None = None, db: int = 0) -> Any:
        import redis

        kw: dict[str, Any] = {}
        if self.tls:
            kw = {"ssl": True, "ssl_ca_certs": str(self.tls["ca"]), "ssl_certfile": str(self.tls["client_cert"]),
                  "ssl_keyfile": str(self.tls["client_key"]), "ssl_cert_reqs": ssl.CERT_REQUIRED}
        return redis.Redis(host="127.0.0.1", port=self.port, db=db, username=username,
                           password=password if password is not None else self.password, **kw)

    def url(self, user: str | None = None, db: int = 0) -> str:
        scheme = "rediss" if self.tls else "redis"
        return f"{scheme}://{user + '@' if user else ''}127.0.0.1:{self.port}/{db}"


# --------------------------------------------------------------------------- raw messages
def task_envelope(module: str, body: bytes, *, content_type: str = "application/json", task: str = "fleet.run_release",
                  task_id: str | None = None) -> bytes:
    """One message as kombu's redis transport stores it in a queue list (what LPUSH puts there)."""
    tid = task_id or f"{module}:{uuid.uuid4()}"
    queue = f"module.{module}"
    env: dict[str, Any] = {
        "body": base64.b64encode(body).decode(), "content-encoding": "utf-8" if "json" in content_type else "binary",
        "content-type": content_type,
        "headers": {"lang": "py", "task": task, "id": tid, "shadow": None, "eta": None, "expires": None,
                    "group": None, "group_index": None, "retries": 0, "timelimit": [None, None], "root_id": tid,
                    "parent_id": None, "argsrepr": "", "kwargsrepr": "", "origin": "attacker", "ignore_result": False,
                    "replaced_task_nesting": 0, "stamped_headers": None, "stamps": {}},
        "properties": {"correlation_id": tid, "reply_to": "", "delivery_mode": 2,
                       "delivery_info": {"exchange": "", "routing_key": queue}, "priority": 0,
                       "body_encoding": "base64", "delivery_tag": str(uuid.uuid4())},
    }
    return json.dumps(env).encode()


def task_body(payload: object) -> bytes:
    """Celery's protocol 2 body: [args, kwargs, embed]."""
    return json.dumps([[payload], {}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}]).encode()


# --------------------------------------------------------------------------- labs with secrets in files
def secret_file(path: Path, secret: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(secret + "\n")
    os.chmod(path, 0o600)
    return path


@dataclass
class SecureLab(Lab):
    """A lab whose controller and modules read broker passwords (and TLS files) from files."""

    controller_env: dict[str, str] = field(default_factory=dict)
    module_env: dict[str, dict[str, str]] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        env = super().env()
        env.update(self.controller_env)
        return env

    def start(self, names: list[str] | None = None, sim_env: dict[str, dict[str, str]] | None = None,
              wait: bool = True, argv_prefix: tuple[str, ...] = ()) -> None:
        from simulator import make_models

        started = []
        for name in names or self.names:
            make_models(self.base / "modules" / name / "models")
            extra = {**self.module_env.get(name, {}), **(sim_env or {}).get(name, {})}
            w = start_worker(name, self.base, self.settings, sim_env=extra, argv_prefix=argv_prefix)
            self.workers[name] = w
            started.append(w)
        if wait:
            wait_for_heartbeats(self.settings, started, 60)

    def stop(self) -> None:
        stop_workers(list(self.workers.values()), grace=5)
        self.workers.clear()


def broker_env(url: str, password_file: Path | None, tls: dict[str, Path] | None = None,
               client: str = "client") -> dict[str, str]:
    env = {"FLEET_BROKER_URL": url}
    if password_file is not None:
        env["FLEET_BROKER_PASSWORD_FILE"] = str(password_file)
    if tls:
        env["FLEET_BROKER_TLS_CA_FILE"] = str(tls["ca"])
        env["FLEET_BROKER_TLS_CERT_FILE"] = str(tls[f"{client}_cert"])
        env["FLEET_BROKER_TLS_KEY_FILE"] = str(tls[f"{client}_key"])
    return env


def make_secure_lab(base: Path, server: SecureRedis, n: int, *, controller_user: str | None = None,
                    controller_password_file: Path | None = None,
                    module_password_files: dict[str, Path] | None = None, per_module_users: bool = False,
                    **overrides: float) -> SecureLab:
    names = [f"sim-{i + 1:02d}" for i in range(n)]
    tls = server.tls
    kw: dict[str, Any] = {}
    if tls:
        kw = {"broker_tls_ca_file": tls["ca"], "broker_tls_cert_file": tls["client_cert"],
              "broker_tls_key_file": tls["client_key"]}
    settings = ControllerSettings(
        broker_url=server.url(controller_user), broker_password_file=controller_password_file,
        data_dir=base / "fleet", inventory=base / "inventory.toml", history=base / "history.sqlite",
        heartbeat_interval=overrides.get("heartbeat_interval", 0.5), offline_after=overrides.get("offline_after", 4.0),
        **kw)
    base.mkdir(parents=True, exist_ok=True)
    (base / "inventory.toml").write_text(inventory_toml(names, base, None))
    lab = SecureLab(base, settings, names)
    lab.controller_env = broker_env(server.url(controller_user), controller_password_file, tls)
    for name in names:
        pw = (module_password_files or {}).get(name, controller_password_file)
        lab.module_env[name] = broker_env(server.url(name if per_module_users else controller_user), pw, tls)
    return lab


def fleetctl_path() -> str:
    exe = Path(sys.executable).parent / "fleetctl"
    return str(exe) if exe.exists() else "fleetctl"


# --------------------------------------------------------------------------- TLS material, made at test time
def make_tls(folder: Path) -> dict[str, Path]:
    """A CA, a server certificate for 127.0.0.1/localhost, a client certificate, and an unrelated CA."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)

    def name(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
        path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
        path.chmod(0o600)
        return path

    def write_cert(cert: x509.Certificate, path: Path) -> Path:
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return path

    def ca(cn: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(name(cn)).public_key(key.public_key())
                .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                             content_commitment=False, key_encipherment=False,
                                             data_encipherment=False, key_agreement=False, encipher_only=False,
                                             decipher_only=False), critical=True)
                .sign(key, hashes.SHA256()))
        return key, cert

    def leaf(cn: str, ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate, server: bool
             ) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        key = ec.generate_private_key(ec.SECP256R1())
        b = (x509.CertificateBuilder().subject_name(name(cn)).issuer_name(ca_cert.subject)
             .public_key(key.public_key()).serial_number(x509.random_serial_number())
             .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
             .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
             .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server
                                                   else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False))
        if server:
            b = b.add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                             x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                                critical=False)
        return key, b.sign(ca_key, hashes.SHA256())

    ca_key, ca_cert = ca("m1000-fleet test CA")
    s_key, s_cert = leaf("redis", ca_key, ca_cert, True)
    c_key, c_cert = leaf("fleet-client", ca_key, ca_cert, False)
    _, wrong = ca("some other CA")
    return {
        "ca": write_cert(ca_cert, folder / "ca.crt"),
        "cert": write_cert(s_cert, folder / "redis.crt"), "key": write_key(s_key, folder / "redis.key"),
        "client_cert": write_cert(c_cert, folder / "client.crt"), "client_key": write_key(c_key, folder / "client.key"),
        "wrong_ca": write_cert(wrong, folder / "wrong-ca.crt"),
    }


# one Redis ACL user per module, from `fleetctl broker acl` (tests/security)
ADMIN = ("acl-admin", "admin-pw-for-the-test-only")


def start_acl_redis(tmp_path: Path, modules: list[str]) -> tuple[SecureRedis, AclFiles]:
    files = write_acl(tmp_path / "broker", modules)
    # a test-only admin user, to read the ACL log (no fleet user may)
    with files.acl.open("a") as fh:
        fh.write(f"user {ADMIN[0]} on >{ADMIN[1]} ~* &* +@all\n")
    server = SecureRedis(tmp_path / "redis", aclfile=files.acl)
    server.start()
    return server, files


def pw(files: AclFiles, user: str) -> str:
    return (files.passwords / f"{user}.password").read_text().strip()
