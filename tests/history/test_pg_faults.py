"""A PostgreSQL history's server faults, on a real server (issue 48, item 1): a dropped connection is made again at
the next use, a statement stopped by the server's ``statement_timeout`` and a write refused for a full disk are one
line each (``fleetctl`` exits 2 without a traceback), and the same command succeeds once the cause is gone."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from contract.records import ResultRow
from controller.history import History, HistoryFull, HistoryStopped, HistoryUnavailable
from tests.support.postgres_server import PostgresServer
from tests.support.tmpfs import mounted_tmpfs

pytestmark = pytest.mark.slow


def _fleetctl(url: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")} | {"FLEET_DATA_DIR": str(tmp_path)}
    return subprocess.run([sys.executable, "-m", "controller", "--history", url, *args], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)


def _one_line_error(r: subprocess.CompletedProcess[str]) -> str:
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    return lines[0]


def test_a_dropped_connection_is_made_again_at_the_next_use(pg_server: PostgresServer) -> None:
    url = pg_server.fresh_database()
    h = History(url)
    h.create_run("r1")
    pg_server.admin(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{url.rsplit('/', 1)[1]}'")
    with pytest.raises(HistoryUnavailable):
        h.runs()  # the use that finds the connection gone
    assert [r.run_id for r in h.runs()] == ["r1"]  # the next one connects again
    h.close()


def test_a_statement_timeout_is_one_line_and_the_next_call_succeeds(pg_server: PostgresServer, tmp_path: Path) -> None:
    url = pg_server.fresh_database()
    History(url).close()
    name = url.rsplit("/", 1)[1]
    pg_server.admin(f"ALTER DATABASE {name} SET statement_timeout = '300ms'")
    with psycopg.connect(url) as holder:  # a long transaction holds the runs table
        holder.execute("LOCK TABLE runs IN ACCESS EXCLUSIVE MODE")
        line = _one_line_error(_fleetctl(url, tmp_path, "runs"))
        with pytest.raises(HistoryStopped) as err:  # not HistoryFull: one statement, not every write
            History(url).runs()
        assert err.value.http_status == 503 and not isinstance(err.value, HistoryFull)
    assert "run history query stopped by the server: canceling statement due to statement timeout" in line, line
    assert line.startswith("fleetctl: error: postgresql://***@127.0.0.1:"), line
    ok = _fleetctl(url, tmp_path, "runs")
    assert ok.returncode == 0, ok.stderr


@pytest.fixture
def small_disk(pg_server: PostgresServer, tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs the server may write (a tablespace's folder: in the server's own, which it can reach)."""
    mnt = pg_server.dir / f"small-{tmp_path.name}"
    for d in mounted_tmpfs(mnt, "size=2m,mode=0700"):
        if os.geteuid() == 0:
            shutil.chown(d, "postgres", "postgres")
        yield d


def test_a_full_disk_is_one_line_and_writes_succeed_once_space_is_freed(pg_server: PostgresServer, tmp_path: Path,
                                                                       small_disk: Path, seed_path: Path) -> None:
    url = pg_server.fresh_database()
    h = History(url)
    h.create_run("r1")
    space = f"small_{url.rsplit('/', 1)[1]}"
    pg_server.admin(f"CREATE TABLESPACE {space} LOCATION '{small_disk}'")
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"ALTER TABLE ALL IN TABLESPACE pg_default SET TABLESPACE {space}")
            conn.execute(f"CREATE TABLE filler (b bytea) TABLESPACE {space}")
            with pytest.raises(psycopg.errors.DiskFull):
                for _ in range(1000):
                    conn.execute("INSERT INTO filler SELECT decode(repeat('ab', 8000), 'hex') "
                                 "FROM generate_series(1, 16)")
        line = _one_line_error(_fleetctl(url, tmp_path, "baseline", "import", str(seed_path), "--release", "1.4.1"))
        assert "run history not written, the server's disk is full: could not extend file" in line, line
        row = ResultRow(run_id="r1", module="m1", release="1.0", model_key="qwen3", table="sweep", profile="1:128",
                        model="Qwen3", decode_tps=1.0)
        with pytest.raises(HistoryFull):  # the rows table has no page to spare: every write of rows fails so
            h.upsert_rows([row])
        assert [r.run_id for r in h.runs()] == ["r1"]  # reads go on, on the same connection
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("DROP TABLE filler")
        ok = _fleetctl(url, tmp_path, "baseline", "import", str(seed_path), "--release", "1.4.1")
        assert ok.returncode == 0, ok.stderr
    finally:
        h.close()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"ALTER TABLE ALL IN TABLESPACE {space} SET TABLESPACE pg_default")
        pg_server.admin(f"DROP DATABASE {url.rsplit('/', 1)[1]}")
        pg_server.admin(f"DROP TABLESPACE {space}")
