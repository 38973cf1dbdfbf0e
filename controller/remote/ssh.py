"""The only module that speaks SSH.

Two channels to a module, one trust store:

* control (commands, small files): Fabric ``Connection`` over paramiko, with Fabric's
  default ``AutoAddPolicy`` replaced by ``RejectPolicy`` and host keys loaded from one
  known_hosts file only (no ~/.ssh/config, no agent, no key search);
* bulk data (release tarballs): the OpenSSH client (``ssh``) reading the local file as
  its stdin, measured faster than paramiko's SFTP (see docs/howto/deploy.md), with
  ``StrictHostKeyChecking=yes`` against the same known_hosts file.

Every remote command is built from an argument list with ``shlex.join``: no inventory
value reaches the remote shell unquoted. Failures are translated into ``SshError``
leaves that carry what happened.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shlex
import stat
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import paramiko
from fabric import Config, Connection
from invoke.exceptions import CommandTimedOut

from controller.errors import FleetctlError
from controller.inventory import Module

# AES-GCM first: with AES-NI it is faster than OpenSSH's default chacha20-poly1305 (bench/push.py: scp with
# push's cipher beside scp as typed, docs/performance.md)
BULK_CIPHERS = "aes128-gcm@openssh.com,chacha20-poly1305@openssh.com,aes256-gcm@openssh.com,aes128-ctr"


class SshError(FleetctlError):
    """Root of the SSH errors; ``module`` names the module, the message says what failed."""

    def __init__(self, module: str, message: str) -> None:
        super().__init__(f"{module}: {message}")
        self.module = module
        self.reason = message


class HostKeyError(SshError):
    """Unknown or changed host key: the module is refused."""


class UnreachableError(SshError, ConnectionError):
    """No TCP/SSH connection (host down, refused, timed out, link cut)."""


class AuthError(SshError, PermissionError):
    """The server refused our key."""


@dataclass(frozen=True)
class CommandResult:
    command: str
    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def tail(self, n: int = 300) -> str:
        text = (self.stderr.strip() or self.stdout.strip()).replace("\n", " | ")
        return text[-n:]


class RemoteCommandError(SshError):
    """A remote command exited non-zero; ``result`` holds its output."""

    def __init__(self, module: str, what: str, result: CommandResult) -> None:
        super().__init__(module, f"{what} failed (exit {result.exit_code}): {result.tail()}")
        self.result = result


@dataclass(frozen=True)
class SshTarget:
    """How to reach one module. ``known_hosts`` is the only trust store used."""

    name: str
    host: str
    port: int
    user: str
    known_hosts: Path
    identity: Path | None = None
    connect_timeout: float = 10.0
    alive_interval: int = 5  # keepalive period of the bulk channel, s
    alive_count: int = 3  # missed keepalives before the bulk channel gives up
    # the passphrase of ``identity``, read from this file (mode 0600) when the key is used; else
    # a running ssh-agent (SSH_AUTH_SOCK) is asked. Never on a command line.
    passphrase_file: Path | None = None
    use_agent: bool = True

    @classmethod
    def of(cls, module: Module, known_hosts: Path, identity: Path | None = None, **kw: Any) -> SshTarget:
        return cls(name=module.name, host=module.host, port=module.ssh_port, user=module.ssh_user,
                   known_hosts=Path(known_hosts), identity=Path(identity) if identity else None, **kw)

    @property
    def where(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"


def remote_command(argv: Sequence[str]) -> str:
    """The one way a command line for a remote shell is made: every word quoted."""
    return shlex.join([str(a) for a in argv])


# --- control channel: Fabric -------------------------------------------------------


def read_passphrase(path: Path) -> str:
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except OSError as exc:
        raise AuthError("-", f"{path}: cannot read the SSH key passphrase: {exc.strerror or exc}") from None
    return text.rstrip("\r\n")


def connect_kwargs(target: SshTarget) -> dict[str, Any]:
    """paramiko's connect arguments: our key (and its passphrase from a file), or the ssh-agent's keys."""
    kwargs: dict[str, Any] = {"look_for_keys": False,
                              "allow_agent": target.use_agent and bool(os.environ.get("SSH_AUTH_SOCK")),
                              "banner_timeout": target.connect_timeout, "auth_timeout": target.connect_timeout}
    if target.identity is not None:
        kwargs["key_filename"] = [str(target.identity)]
        if target.passphrase_file is not None:
            kwargs["passphrase"] = read_passphrase(target.passphrase_file)
    return kwargs



class Session:
    """An open control connection to one module (use as a context manager)."""

    def __init__(self, target: SshTarget) -> None:
        self.target = target
        config = Config(overrides={"load_ssh_configs": False, "run": {"hide": True, "warn": True}})
        kwargs = connect_kwargs(target)
        self.conn = Connection(host=target.host, user=target.user, port=target.port, config=config,
                               connect_timeout=int(max(1, target.connect_timeout)), connect_kwargs=kwargs)
        # Replace Fabric's AutoAddPolicy: only keys in our known_hosts file are accepted.
        self.conn.client.set_missing_host_key_policy(paramiko.RejectPolicy())
        if not target.known_hosts.is_file():
            raise HostKeyError(target.name, f"known_hosts file {target.known_hosts} not found")
        self.conn.client.load_host_keys(str(target.known_hosts))
        self._sftp: paramiko.SFTPClient | None = None

    def open(self) -> Session:
        t = self.target
        try:
            self.conn.open()
        except paramiko.BadHostKeyException as exc:
            raise HostKeyError(t.name, f"host key of {t.host}:{t.port} CHANGED ({exc.key.get_name()} "
                                       f"{exc.key.get_fingerprint().hex()[:16]}...) differs from the key in "
                                       f"{t.known_hosts}; "
                                       "refusing (verify the module, then update known_hosts)") from exc
        except paramiko.AuthenticationException as exc:
            raise AuthError(t.name, f"{t.where}: authentication refused ({exc})") from exc
        except paramiko.SSHException as exc:
            if "not found in known_hosts" in str(exc):
                raise HostKeyError(t.name, f"host {t.host}:{t.port} is unknown: no key in {t.known_hosts}; "
                                           "refusing (add its verified key with ssh-keyscan)") from exc
            raise UnreachableError(t.name, f"{t.where}: SSH failed: {exc}") from exc
        except (OSError, EOFError) as exc:
            msg = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
            raise UnreachableError(t.name, f"{t.where}: unreachable: {msg}") from exc
        return self

    def __enter__(self) -> Session:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._sftp is not None:
            with contextlib.suppress(Exception):
                self._sftp.close()
            self._sftp = None
        with contextlib.suppress(Exception):
            self.conn.close()

    # commands
    def run(self, argv: Sequence[str], *, what: str = "", stdin: bytes | None = None, check: bool = True,
            timeout: float | None = None) -> CommandResult:
        """Run ``argv`` (quoted word by word) on the module."""
        return self.run_line(remote_command(argv), what=what or str(argv[0]), stdin=stdin, check=check,
                             timeout=timeout)

    def run_line(self, line: str, *, what: str, stdin: bytes | None = None, check: bool = True,
                 timeout: float | None = None) -> CommandResult:
        """Run a command line already built by ``remote_command`` (joined with fixed operators)."""
        stream = io.StringIO(stdin.decode("utf-8")) if stdin is not None else io.StringIO("")
        try:
            r = self.conn.run(line, in_stream=stream, timeout=timeout)
        except CommandTimedOut as exc:
            res = CommandResult(line, 124, exc.result.stdout, exc.result.stderr)
            raise RemoteCommandError(self.target.name, f"{what} (timed out after {timeout}s)", res) from exc
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise UnreachableError(self.target.name, f"{what}: connection lost: {exc}") from exc
        res = CommandResult(line, int(r.exited), r.stdout, r.stderr)
        if check and not res.ok:
            raise RemoteCommandError(self.target.name, what, res)
        return res

    def python(self, python: str, script: str, *args: str, what: str, check: bool = True,
               timeout: float | None = None) -> dict[str, Any]:
        """Run a Python ``script`` with ``args`` on the module; it prints one JSON object."""
        res = self.run([python, "-c", script, *args], what=what, check=check, timeout=timeout)
        try:
            out = json.loads(res.stdout.strip().splitlines()[-1])
        except (IndexError, ValueError):
            raise RemoteCommandError(self.target.name, f"{what} (no JSON answer)", res) from None
        if not isinstance(out, dict):
            raise RemoteCommandError(self.target.name, f"{what} (unexpected answer)", res)
        return out

    # files (SFTP: no shell involved at all)
    @property
    def sftp(self) -> paramiko.SFTPClient:
        if self._sftp is None:
            self._sftp = self.conn.sftp()
        return self._sftp

    def put_file(self, local: Path, remote: str) -> None:
        """Upload to ``remote`` via a temporary name, renamed when complete."""
        tmp = f"{remote}.part"
        try:
            self.sftp.put(str(local), tmp)
            self.sftp.posix_rename(tmp, remote)
        except (OSError, paramiko.SSHException) as exc:
            raise UnreachableError(self.target.name, f"upload of {local.name} to {remote} failed: {exc}") from exc

    def write_file(self, remote: str, data: bytes, mode: int = 0o644) -> None:
        """Write ``data`` to ``remote`` atomically with ``mode`` set before the rename.

        Secrets: put them in a 0700 folder; the temporary file is never readable by others.
        """
        tmp = f"{remote}.tmp"
        try:
            with self.sftp.open(tmp, "wb") as f:
                f.chmod(mode)
                f.write(data)
            self.sftp.posix_rename(tmp, remote)
        except (OSError, paramiko.SSHException) as exc:
            raise UnreachableError(self.target.name, f"writing {remote} failed: {exc}") from exc

    def listdir(self, remote: str) -> dict[str, int]:
        """Regular files in ``remote`` with their sizes ({} when it does not exist)."""
        try:
            return {a.filename: int(a.st_size or 0) for a in self.sftp.listdir_attr(remote)
                    if a.st_mode is not None and stat.S_ISREG(a.st_mode)}
        except FileNotFoundError:
            return {}
        except (OSError, paramiko.SSHException) as exc:
            raise UnreachableError(self.target.name, f"listing {remote} failed: {exc}") from exc


def open_session(target: SshTarget) -> Session:
    return Session(target).open()


# --- bulk channel: OpenSSH client ----------------------------------------------------


def ssh_argv(target: SshTarget, line: str, *, ciphers: str | None = BULK_CIPHERS) -> list[str]:
    """OpenSSH client arguments: our known_hosts only, strict checking, no user config."""
    argv = ["ssh", "-F", "/dev/null", "-T", "-x", "-a",
            "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={target.known_hosts}",
            "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "UpdateHostKeys=no",
            "-o", f"ConnectTimeout={int(max(1, target.connect_timeout))}",
            "-o", f"ServerAliveInterval={target.alive_interval}",
            "-o", f"ServerAliveCountMax={target.alive_count}",
            "-o", "LogLevel=ERROR",
            "-p", str(target.port)]
    if ciphers:
        argv += ["-c", ciphers]
    if target.identity is not None:
        argv += ["-o", "IdentitiesOnly=yes", "-i", str(target.identity)]
    argv += ["-l", target.user, "--", target.host, line]
    return argv


def classify_ssh_failure(target: SshTarget, res: CommandResult) -> SshError:
    """Turn an OpenSSH client failure (exit 255) into the matching error, from its stderr."""
    err = res.stderr
    if "REMOTE HOST IDENTIFICATION HAS CHANGED" in err or "Host key for" in err and "has changed" in err:
        return HostKeyError(target.name, f"host key of {target.host}:{target.port} CHANGED; refusing")
    if "Host key verification failed" in err or "No " in err and "host key is known" in err:
        return HostKeyError(target.name, f"host {target.host}:{target.port} is unknown to {target.known_hosts}; "
                                         "refusing")
    if "Permission denied" in err:
        return AuthError(target.name, f"{target.where}: authentication refused")
    if "connect to host" in err or "Could not resolve" in err or "timed out" in err:
        return UnreachableError(target.name, f"{target.where}: unreachable: {res.tail()}")
    return UnreachableError(target.name, f"{target.where}: {res.tail() or 'connection lost'}")


def stream_file(target: SshTarget, local: IO[bytes], line: str, *, timeout: float | None = None) -> CommandResult:
    """Run ``line`` on the module with ``local`` (an open file, at its current offset) as stdin.

    The ssh process reads the file descriptor directly: no copy through Python.
    """
    t0 = time.monotonic()
    try:
        p = subprocess.run(ssh_argv(target, line), stdin=local, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise UnreachableError(target.name, f"transfer timed out after {time.monotonic() - t0:.0f}s") from exc
    res = CommandResult(line, p.returncode, p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace"))
    if res.exit_code == 255:
        raise classify_ssh_failure(target, res)
    return res
