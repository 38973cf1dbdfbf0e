"""What only a PostgreSQL history has: its versioned migrations, a generation per transaction, and the column files
kept in the database (shared by every controller of it, checked as files beside a SQLite history are)."""

from __future__ import annotations

import pandas as pd
import pytest

from contract.records import ResultRow
from controller.history import History, UnsentRequest
from controller.history.columns import file_name
from controller.history.pg import MIGRATIONS
from tests.support.postgres_server import PostgresServer

pytestmark = pytest.mark.slow


def _rows(run: str, n: int) -> list[ResultRow]:
    return [ResultRow(run_id=run, module=f"m{i % 3}", release="1.0", model_key="qwen3", table="sweep",
                      profile=f"{i}:128", model="Qwen3", decode_tps=float(i), prefill_len=i, correct=i % 2 == 0)
            for i in range(n)]


def _ended(url: str, run: str, n: int) -> History:
    h = History(url)
    h.create_run(run)
    h.upsert_rows(_rows(run, n))
    h.set_run_state(run, "done", "pass")
    return h


def _stored(h: History) -> list[tuple[str, str]]:
    return [(str(r), str(n)) for r, n in h.db.execute("SELECT run_id, name FROM row_file_data ORDER BY name")]


def test_migrations_are_versioned_and_applied_once(pg_server: PostgresServer) -> None:
    url = pg_server.fresh_database()
    History(url).close()
    h = History(url)  # opened again: nothing applied twice
    assert [v for (v,) in h.db.execute("SELECT version FROM schema_version ORDER BY version")] == [
        v for v, _ in MIGRATIONS] == [1, 2, 3, 4]
    # a database left at version 1 (by an older fleetctl) gains versions 2 to 4 when next opened
    h.db.executescript("DROP TABLE row_file_data; DROP TABLE trend_findings; DROP TABLE unsent_requests;"
                       " DELETE FROM schema_version WHERE version >= 2")
    h.close()
    h = History(url)
    assert [v for (v,) in h.db.execute("SELECT version FROM schema_version ORDER BY version")] == [1, 2, 3, 4]
    assert h.db.execute("SELECT COUNT(*) FROM row_file_data").fetchone() == (0,)
    assert h.trend_findings("changes") is None
    # version 4: a dispatch's requests recorded and not yet sent (ADR 0060), on this engine too
    h.record_queued([], [UnsentRequest(run_id="r1", module="m0", payload={"run_id": "r1"}, priority="high",
                                       started_by="ana", created_at=100.0)])
    assert [(r.module, r.payload, r.priority, r.started_by) for r in h.unsent("r1", before=101.0)] == [
        ("m0", {"run_id": "r1"}, "high", "ana")]
    h.mark_sent("r1")
    assert h.unsent("r1") == []
    h.close()


def test_a_generation_counts_the_transactions_that_changed_a_run_s_rows(pg_server: PostgresServer) -> None:
    h = _ended(pg_server.fresh_database(), "r1", 30)  # 30 rows in one transaction
    gen = lambda: h.db.execute("SELECT gen FROM row_generations WHERE run_id='r1'").fetchone()[0]  # noqa: E731
    assert gen() == 1
    h.replace_rows("r1", "m0", _rows("r1", 3)[:1])  # a delete and an insert, one transaction
    assert gen() == 2
    h.upsert_rows(_rows("r1", 2))
    assert gen() == 3
    h.close()


def test_an_ended_run_s_column_file_is_kept_in_the_database_and_read_by_another_controller(
        pg_server: PostgresServer) -> None:
    url = pg_server.fresh_database()
    a = _ended(url, "r1", 60)
    first = a.row_frame(["r1"])  # from the rows; the file written
    assert _stored(a) == [("r1", file_name("r1", 1))]
    b = History(url)  # another controller
    pd.testing.assert_frame_equal(b.row_frame(["r1"]), first, check_exact=True)
    assert _stored(b) == [("r1", file_name("r1", 1))]  # read, not written again
    # rows changed: the file is stale, the rows are read, the new file replaces it
    a.upsert_rows([_rows("r1", 1)[0].model_copy(update={"decode_tps": 99.0})])
    got = b.row_frame(["r1"])
    assert float(got[got["profile"] == "0:128"]["decode_tps"].iloc[0]) == 99.0
    assert _stored(b) == [("r1", file_name("r1", 2))]
    a.close()
    b.close()


def test_a_damaged_file_in_the_database_is_never_taken_for_the_run_s_rows(pg_server: PostgresServer) -> None:
    h = _ended(pg_server.fresh_database(), "r1", 60)
    want = h.row_frame(["r1"])
    h.db.execute("UPDATE row_file_data SET data = substring(data from 1 for 100)")  # torn
    pd.testing.assert_frame_equal(h.row_frame(["r1"]), want, check_exact=True)
    h.db.execute("UPDATE row_file_data SET data = overlay(data placing '\\x00'::bytea from 200)")  # a byte changed
    pd.testing.assert_frame_equal(h.row_frame(["r1"]), want, check_exact=True)
    h.close()


def test_migrate_writes_the_files_of_ended_runs_once(pg_server: PostgresServer) -> None:
    url = pg_server.fresh_database()
    h = _ended(url, "r1", 10)
    h.create_run("r2")
    h.upsert_rows(_rows("r2", 5))  # still running: read from its rows until it ends
    first = h.migrate_columns()
    assert (first.written, first.current, first.running, first.abandoned) == (1, 0, 1, 0)
    again = h.migrate_columns()
    assert (again.written, again.current, again.running) == (0, 1, 1)
    h.close()


def test_fleetctl_takes_a_postgresql_url_as_its_history(pg_server: PostgresServer, tmp_path) -> None:
    """``fleetctl --history postgresql://...`` in a real process: the same verbs, the URL shown without its user."""
    import json
    import os
    import subprocess
    import sys

    url = pg_server.fresh_database()
    _ended(url, "r1", 12).close()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")} | {"FLEET_DATA_DIR": str(tmp_path)}

    def fleetctl(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "controller", "--history", url, *args], env=env, cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)

    done = fleetctl("history", "migrate", "-o", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"written": 1, "current": 0, "running": 0, "abandoned": 0}
    again = fleetctl("history", "migrate")
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip().endswith(f"({url.replace('postgres@', '***@')})")
    results = fleetctl("results", "r1", "--format", "json")
    assert results.returncode == 0, results.stderr
    assert sorted(r["profile"] for r in json.loads(results.stdout)) == sorted(f"{i}:128" for i in range(12))
    assert not list(tmp_path.glob("*.sqlite"))  # no SQLite file made beside


def test_a_server_gone_is_the_history_unavailable(pg_server: PostgresServer) -> None:
    """psycopg's error of a dropped connection reaches callers as HistoryUnavailable (HTTP 503), which /metrics
    counts as the history down (DatabaseError); a server that cannot be reached at all, the same."""
    from controller.history import DatabaseError, HistoryUnavailable

    url = pg_server.fresh_database()
    h = History(url)
    pg_server.admin(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{url.rsplit('/', 1)[1]}'")
    with pytest.raises(HistoryUnavailable, match=r"^postgresql://\*\*\*@127\.0\.0\.1:\d+/t\w+: run history unreachable"
                       ) as err:
        h.runs()
    assert isinstance(err.value, DatabaseError) and err.value.http_status == 503
    with pytest.raises(HistoryUnavailable, match="cannot open run history"):
        History(f"postgresql://postgres@127.0.0.1:{pg_server.port}/no_such_database")


_WRITER = """
import sys
from controller.history import History
from contract.records import ResultRow
h = History(sys.argv[1])
row = ResultRow(run_id="r1", module="m1", model_key="qwen3", table="sweep", profile="1:1", model="Qwen3")
for i in range(5):
    h.add_baseline("1.0", [], f"writer {sys.argv[2]}")
    h.create_run("r1")
    h.upsert_rows([row])
    h.set_run_state("r1", "done", "pass")
h.close()
"""


def test_writers_in_several_processes_take_turns(pg_server: PostgresServer) -> None:
    """Four processes writing at once: each baseline version given once (a read-then-write step, safe because
    writers take turns), the same run, row and verdict event stored once."""
    import subprocess
    import sys

    url = pg_server.fresh_database()
    History(url).close()  # the tables made once, before the writers start
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, url, str(n)], stderr=subprocess.PIPE, text=True)
             for n in range(4)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    h = History(url)
    assert [b["version"] for b in h.baselines()] == list(range(1, 21))
    assert sorted({b["source"] for b in h.baselines()}) == [f"writer {n}" for n in range(4)]
    assert [r.run_id for r in h.runs()] == ["r1"] and h.row_count("r1") == 1
    assert h.db.execute("SELECT COUNT(*) FROM webhook_outbox WHERE run_id='r1'").fetchone() == (1,)
    h.close()
