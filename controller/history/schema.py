"""The run history's tables in SQLite: their schema, its migrations, and how a result row is stored in one.

Rows are stored one column per ``ResultRow`` field, so reports read them straight into
pandas (``pd.read_sql_query``). :func:`connect` opens a history file with the schema created
and migrated (an older history gains what it lacks, once).
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

from contract.records import ResultRow
from controller.history.records import HistoryError

ROW_FIELDS: tuple[str, ...] = tuple(ResultRow.model_fields)
_ROWS_KEY = "run_id, module, model_key, profile, source"  # a probe row sits beside the release's row
_JSON_FIELDS = {"extra", "flags", "energy"}
_BOOL_FIELDS = {"correct"}
# fields whose default is not None: a NULL (a column added to an older history) reads as the default
_NOT_NULL_DEFAULTS = frozenset(f for f, info in ResultRow.model_fields.items()
                               if not info.is_required() and info.default is not None and info.default_factory is None)

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    release TEXT NOT NULL DEFAULT '',
    tarball TEXT NOT NULL DEFAULT '',
    sha256 TEXT NOT NULL DEFAULT '',
    models TEXT NOT NULL DEFAULT '[]',
    modules TEXT NOT NULL DEFAULT '[]',
    kind TEXT NOT NULL DEFAULT 'run',
    state TEXT NOT NULL DEFAULT 'running',
    verdict TEXT,
    finished_at REAL,
    note TEXT NOT NULL DEFAULT '',
    verdict_line TEXT,
    module_models TEXT NOT NULL DEFAULT '{{}}',
    started_by TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS module_runs (
    run_id TEXT NOT NULL,
    module TEXT NOT NULL,
    state TEXT NOT NULL,
    updated_at REAL NOT NULL,
    progress TEXT NOT NULL,
    PRIMARY KEY (run_id, module)
);
CREATE INDEX IF NOT EXISTS module_runs_module ON module_runs (module, updated_at);
CREATE TABLE IF NOT EXISTS rows (
    {", ".join(f'"{f}"' for f in ROW_FIELDS)},
    PRIMARY KEY ({_ROWS_KEY})
);
CREATE INDEX IF NOT EXISTS rows_module ON rows (module, model_key);
CREATE TABLE IF NOT EXISTS events (
    run_id TEXT NOT NULL,
    module TEXT NOT NULL,
    ts REAL NOT NULL,
    message TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS events_run ON events (run_id, module);
CREATE TABLE IF NOT EXISTS baselines (
    release TEXT NOT NULL,
    version INTEGER NOT NULL,
    run_id TEXT NOT NULL,
    source TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL,
    PRIMARY KEY (release, version)
);
"""

# device telemetry: one summary (contract.records.TelemetrySummary, JSON) per run and module
_TELEMETRY_SCHEMA = """
CREATE TABLE IF NOT EXISTS telemetry (
    run_id TEXT NOT NULL,
    module TEXT NOT NULL,
    summary TEXT NOT NULL,
    PRIMARY KEY (run_id, module)
);
"""


# the environment each module measured a run in: one contract.fingerprint.EnvFingerprint (JSON) per run and
# module, with its digest (what each of its rows carries as env_digest)
_FINGERPRINT_SCHEMA = """
CREATE TABLE IF NOT EXISTS fingerprints (
    run_id TEXT NOT NULL,
    module TEXT NOT NULL,
    digest TEXT NOT NULL,
    record TEXT NOT NULL,
    PRIMARY KEY (run_id, module)
);
CREATE INDEX IF NOT EXISTS fingerprints_digest ON fingerprints (digest);
"""


# webhook outbox: a verdict recorded queues its event in the same transaction (whoever recorded it:
# serve, an attached fleetctl); `fleetctl serve` sends what is pending when it starts and while it
# runs. Webhook URLs may carry secrets (tokens in the path): only their sha256 is stored.
_OUTBOX_SCHEMA = """
CREATE TABLE IF NOT EXISTS webhook_outbox (
    run_id TEXT NOT NULL,
    event TEXT NOT NULL,
    verdict TEXT NOT NULL,
    line TEXT NOT NULL,
    state TEXT NOT NULL,
    created_at REAL NOT NULL,
    payload TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (run_id, event)
);
CREATE INDEX IF NOT EXISTS webhook_outbox_created ON webhook_outbox (created_at);
CREATE TABLE IF NOT EXISTS webhook_targets (
    url_sha256 TEXT PRIMARY KEY,
    first_seen REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS webhook_sent (
    run_id TEXT NOT NULL,
    event TEXT NOT NULL,
    url_sha256 TEXT NOT NULL,
    outcome TEXT NOT NULL,
    at REAL NOT NULL,
    PRIMARY KEY (run_id, event, url_sha256)
);
CREATE TABLE IF NOT EXISTS webhook_claims (
    run_id TEXT NOT NULL,
    event TEXT NOT NULL,
    url_sha256 TEXT NOT NULL,
    holder TEXT NOT NULL,
    until REAL NOT NULL,
    PRIMARY KEY (run_id, event, url_sha256)
);
"""


# column files (controller.history.frames): a trigger counts every change of a run's rows (its generation), whoever
# writes them; a run's column file is recorded with the generation it was made from and read only at that one,
# with the modules that have rows in it (JSON: what the report's previous-run lookup asks, without a scan of rows;
# NULL: not recorded)
_COLUMNS_SCHEMA = """
CREATE TABLE IF NOT EXISTS row_generations (
    run_id TEXT PRIMARY KEY,
    gen INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS row_files (
    run_id TEXT PRIMARY KEY,
    gen INTEGER NOT NULL,
    name TEXT NOT NULL,
    rows INTEGER NOT NULL,
    size INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    modules TEXT
);
CREATE TRIGGER IF NOT EXISTS rows_generation_insert AFTER INSERT ON rows BEGIN
    INSERT INTO row_generations (run_id, gen) VALUES (NEW.run_id, 1)
        ON CONFLICT (run_id) DO UPDATE SET gen = gen + 1;
END;
CREATE TRIGGER IF NOT EXISTS rows_generation_delete AFTER DELETE ON rows BEGIN
    INSERT INTO row_generations (run_id, gen) VALUES (OLD.run_id, 1)
        ON CONFLICT (run_id) DO UPDATE SET gen = gen + 1;
END;
CREATE TRIGGER IF NOT EXISTS rows_generation_update AFTER UPDATE ON rows BEGIN
    INSERT INTO row_generations (run_id, gen) VALUES (OLD.run_id, 1)
        ON CONFLICT (run_id) DO UPDATE SET gen = gen + 1;
    INSERT INTO row_generations (run_id, gen) VALUES (NEW.run_id, 1)
        ON CONFLICT (run_id) DO UPDATE SET gen = gen + 1;
END;
"""


def row_to_db(row: ResultRow) -> tuple[Any, ...]:
    """A row's values in ``ROW_FIELDS`` order: JSON fields as text, booleans as 0/1 (as SQLite keeps them; a
    PostgreSQL history's column is an integer too)."""
    d = row.model_dump(mode="json")
    return tuple(json.dumps(d[f]) if f in _JSON_FIELDS and d[f] is not None
                 else int(d[f]) if f in _BOOL_FIELDS and d[f] is not None else d[f] for f in ROW_FIELDS)


_EMPTY: dict[str, Any] = {"extra": {}, "flags": (), "energy": None}


def row_from_db(values: sqlite3.Row | tuple[Any, ...]) -> ResultRow:
    d: dict[str, Any] = dict(zip(ROW_FIELDS, values, strict=True))
    for f in _JSON_FIELDS:
        d[f] = json.loads(d[f]) if d[f] else _EMPTY[f]
    for f in _BOOL_FIELDS:
        if d[f] is not None:
            d[f] = bool(d[f])
    for f in _NOT_NULL_DEFAULTS:
        if d[f] is None:
            del d[f]
    return ResultRow.model_validate(d)


def _key_rows_by_source(conn: sqlite3.Connection) -> None:
    """A history from before ``ResultRow.source``: its rows table is rebuilt once, keyed with the source
    (every old row was measured by the release's benchmark)."""
    old = [r[1] for r in conn.execute("PRAGMA table_info(rows)")]
    if "source" in old:
        return
    cols, new = (", ".join(f'"{f}"' for f in names) for names in (old, ROW_FIELDS))
    conn.executescript(
        "BEGIN IMMEDIATE; ALTER TABLE rows RENAME TO rows_unkeyed; DROP INDEX IF EXISTS rows_module;"
        f" CREATE TABLE rows ({new}, PRIMARY KEY ({_ROWS_KEY}));"
        f" INSERT INTO rows ({cols}, source) SELECT {cols}, 'release' FROM rows_unkeyed; DROP TABLE rows_unkeyed;"
        " CREATE INDEX rows_module ON rows (module, model_key); COMMIT;")


def _add_row_columns(conn: sqlite3.Connection) -> None:
    """A history from before a ``ResultRow`` field (``env_digest``, ...) gets its column (NULL in old rows), once.
    Rows are written and read by column name, so the order columns were added in does not matter."""
    have = {r[1] for r in conn.execute("PRAGMA table_info(rows)")}
    for f in ROW_FIELDS:
        if f not in have:
            _add_run_column(conn, f'"{f}"', "", table="rows")


def _add_run_column(conn: sqlite3.Connection, column: str, declaration: str, table: str = "runs") -> None:
    """A history from before ``<table>.<column>`` (default ``runs``) gets the column, once."""
    name = column.strip('"')
    if name in {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}:
        return
    conn.execute("BEGIN IMMEDIATE")
    # another process may have added it between the look and the lock
    try:
        if name not in {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}".rstrip())
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


# run requests recorded with their parts and not yet sent (ADR 0060): a dispatching controller stopped between the
# record and the send leaves them here, and whoever follows the run sends them
_UNSENT_SCHEMA = """
CREATE TABLE IF NOT EXISTS unsent_requests (
    run_id TEXT NOT NULL,
    module TEXT NOT NULL,
    payload TEXT NOT NULL,
    priority TEXT NOT NULL,
    started_by TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (run_id, module)
);
"""


# the change points the history keeps of itself (controller.history.trends, ADR 0043): one text per name, with the
# version of the history it was computed at
_TRENDS_SCHEMA = """
CREATE TABLE IF NOT EXISTS trend_findings (
    name TEXT PRIMARY KEY,
    version TEXT NOT NULL,
    computed_at REAL NOT NULL,
    body TEXT NOT NULL
);
"""


def connect(path: Path) -> sqlite3.Connection:
    """The history at ``path`` (created when absent), in WAL mode, its schema created and migrated."""
    try:
        conn = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
    except sqlite3.Error as exc:
        raise HistoryError(f"{path}: cannot open run history: {exc}") from exc
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.executescript(_SCHEMA)
    conn.executescript(_TELEMETRY_SCHEMA)
    conn.executescript(_FINGERPRINT_SCHEMA)
    conn.executescript(_OUTBOX_SCHEMA)
    conn.executescript(_TRENDS_SCHEMA)
    conn.executescript(_UNSENT_SCHEMA)
    _key_rows_by_source(conn)
    _add_row_columns(conn)
    # after the rows table's own migrations: a rebuild drops its triggers
    conn.executescript(_COLUMNS_SCHEMA)
    # NULL: the modules of such a file were not recorded; they are read from its rows
    _add_run_column(conn, "modules", "TEXT", table="row_files")
    # NULL: such a run is judged again the next time its verdict is asked for, and its line recorded then
    _add_run_column(conn, "verdict_line", "TEXT")
    # '{}': every module of such a run was asked for all of the run's model keys
    _add_run_column(conn, "module_models", "TEXT NOT NULL DEFAULT '{}'")
    # '': who started such a run is not known (it ran before runs recorded their user)
    _add_run_column(conn, "started_by", "TEXT NOT NULL DEFAULT ''")
    # '': every event of such an outbox is a verdict (the run's summary is its whole body)
    _add_run_column(conn, "payload", "TEXT NOT NULL DEFAULT ''", table="webhook_outbox")
    # 'normal' and NULL: such a run was sent before priorities, at the one level there was; its wait counts
    # from its created_at
    _add_run_column(conn, "priority", "TEXT NOT NULL DEFAULT 'normal'")
    _add_run_column(conn, "dispatched_at", "REAL")
    return conn
