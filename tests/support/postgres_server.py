"""A PostgreSQL 15 server of the tests' own (Debian's ``postgresql`` package): initdb'd in a temporary folder,
listening on a free loopback port and a unix socket there, a fresh database per test (CREATE DATABASE takes
milliseconds), stopped at the end.

postgres refuses to run as root (CI runs as root): the server then runs as the ``postgres`` user. Where the
binaries are missing, the tests that need them skip, naming what is missing.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from simulator.ports import free_port

BIN = Path("/usr/lib/postgresql/15/bin")
_NAMES = itertools.count(1)


def _as_server_user() -> list[str]:
    """The prefix that runs a server program as a user postgres accepts (itself, unless root)."""
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


def missing() -> str | None:
    """Why no server can be started here (None: one can)."""
    for prog in ("initdb", "postgres", "pg_ctl"):
        if not (BIN / prog).is_file():
            return f"{BIN / prog} not installed (tests/system-deps.sh installs Debian's postgresql)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no 'postgres' user to run the server as"
        if not shutil.which("runuser"):
            return "running as root and runuser is not installed"
    return None


@dataclass
class PostgresServer:
    dir: Path
    port: int

    @property
    def socket_dir(self) -> Path:
        return self.dir / "sock"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def admin(self, sql: str) -> None:
        """Run one statement as the superuser on the ``postgres`` database (autocommit)."""
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(sql)

    def fresh_database(self) -> str:
        """A new empty database; returns its URL."""
        name = f"t{os.getpid()}_{next(_NAMES)}"
        self.admin(f"CREATE DATABASE {name}")
        return self.url(name)

    @property
    def options(self) -> str:
        return (f"-p {self.port} -k {self.socket_dir} -h 127.0.0.1 -c fsync=off -c synchronous_commit=off"
                " -c full_page_writes=off -c max_connections=50")

    def start(self, timeout: float = 60.0) -> None:
        """Start the server (again: after :meth:`kill`, once its backends have seen their postmaster die and left
        its shared memory) and wait until it answers."""
        deadline = time.monotonic() + timeout
        while True:
            r = subprocess.run([*_as_server_user(), str(BIN / "pg_ctl"), "-D", str(self.dir / "data"), "-o",
                                self.options, "-l", str(self.dir / "log"), "-w", "-t", "60", "start"],
                               capture_output=True, text=True, timeout=90)
            if r.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"postgres did not start: {r.stdout}{r.stderr}")
            time.sleep(0.2)
        while True:
            try:
                self.admin("SELECT 1")
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def kill(self) -> int:
        """SIGKILL the postmaster (a crash, the OOM killer), as a fault test does; its pid."""
        pid = int((self.dir / "data" / "postmaster.pid").read_text().split()[0])
        os.kill(pid, signal.SIGKILL)
        return pid

    def stop(self) -> None:
        subprocess.run([*_as_server_user(), str(BIN / "pg_ctl"), "-D", str(self.dir / "data"), "-m", "immediate",
                        "-w", "stop"], check=False, capture_output=True, timeout=60)


@contextlib.contextmanager
def running_postgres() -> Iterator[PostgresServer]:
    """A server of the tests' own (skips, saying why, where none can be started)."""
    why = missing()
    if why:
        pytest.skip(why)
    with postgres_server() as server:
        yield server


@contextlib.contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    """A server of its own, stopped and removed at the end (a bench's too: ``fresh_database()`` gives the URL of a
    new empty database, ``History(url)`` makes its tables). RuntimeError, saying why, where none can be started."""
    why = missing()
    if why:
        raise RuntimeError(why)
    top = Path(tempfile.mkdtemp(prefix="m1000-pg-"))
    top.chmod(0o755)
    server = PostgresServer(top, free_port())
    server.socket_dir.mkdir()
    if os.geteuid() == 0:
        shutil.chown(top, "postgres", "postgres")
        shutil.chown(server.socket_dir, "postgres", "postgres")
    run = _as_server_user()
    try:
        subprocess.run([*run, str(BIN / "initdb"), "-D", str(top / "data"), "-U", "postgres", "--auth=trust",
                        "-E", "UTF8", "--locale=C.UTF-8", "--no-sync"], check=True, capture_output=True, timeout=120)
        server.start(timeout=30)
        yield server
    finally:
        server.stop()
        shutil.rmtree(top, ignore_errors=True)
