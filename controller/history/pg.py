"""The run history's tables on PostgreSQL, and their versioned migrations.

The same tables as the SQLite history (:mod:`~controller.history.schema`), typed: times ``DOUBLE PRECISION``,
a row's fields by their kind (:data:`controller.history.columns.KINDS`), a module's progress ``json`` (the queries
read its fields with ``->>``). ``schema_version`` holds the versions applied; :func:`migrate` applies the missing
ones in order, each in its own transaction under an advisory lock, so controllers starting together migrate
once. Differences the queries do not see: ``rows.seq`` (the insertion order SQLite's ``rowid`` gives) and a
generation that counts the transactions that changed a run's rows (SQLite's trigger counts the rows): each
changes whenever the rows do, which is all a column file's check asks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from controller.history.columns import KINDS
from controller.history.schema import ROW_FIELDS

if TYPE_CHECKING:
    from controller.history.db import PostgresDatabase

# held while migrating (session level): one controller migrates, the others wait
MIGRATE_LOCK = 0x6D31303031


def _row_columns() -> str:
    types = {"float": "DOUBLE PRECISION", "int": "BIGINT", "str": "TEXT"}
    return ", ".join(f'"{f}" {types[KINDS[f]]}' for f in ROW_FIELDS)


# version 1, by the records its tables hold (data: only the rows' columns are derived, from their fields)
_V1_RUNS = """
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY,
    created_at DOUBLE PRECISION NOT NULL,
    release TEXT NOT NULL DEFAULT '',
    tarball TEXT NOT NULL DEFAULT '',
    sha256 TEXT NOT NULL DEFAULT '',
    models TEXT NOT NULL DEFAULT '[]',
    modules TEXT NOT NULL DEFAULT '[]',
    kind TEXT NOT NULL DEFAULT 'run',
    state TEXT NOT NULL DEFAULT 'running',
    verdict TEXT,
    finished_at DOUBLE PRECISION,
    note TEXT NOT NULL DEFAULT '',
    verdict_line TEXT,
    module_models TEXT NOT NULL DEFAULT '{}',
    started_by TEXT NOT NULL DEFAULT '',
    priority TEXT NOT NULL DEFAULT 'normal',
    dispatched_at DOUBLE PRECISION
);
CREATE INDEX runs_created ON runs (kind, created_at);
CREATE TABLE module_runs (
    run_id TEXT NOT NULL,
    module TEXT NOT NULL,
    state TEXT NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    progress JSON NOT NULL,
    PRIMARY KEY (run_id, module)
);
CREATE INDEX module_runs_module ON module_runs (module, updated_at);
"""
_V1_RECORDS = """CREATE TABLE events (
    run_id TEXT NOT NULL,
    module TEXT NOT NULL,
    ts DOUBLE PRECISION NOT NULL,
    message TEXT NOT NULL
);
CREATE INDEX events_run ON events (run_id, module);
CREATE TABLE baselines (
    release TEXT NOT NULL,
    version INTEGER NOT NULL,
    run_id TEXT NOT NULL,
    source TEXT NOT NULL DEFAULT '',
    created_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (release, version)
);
CREATE TABLE telemetry (
    run_id TEXT NOT NULL,
    module TEXT NOT NULL,
    summary TEXT NOT NULL,
    PRIMARY KEY (run_id, module)
);
CREATE TABLE fingerprints (
    run_id TEXT NOT NULL,
    module TEXT NOT NULL,
    digest TEXT NOT NULL,
    record TEXT NOT NULL,
    PRIMARY KEY (run_id, module)
);
CREATE INDEX fingerprints_digest ON fingerprints (digest);
"""
_V1_WEBHOOKS = """CREATE TABLE webhook_outbox (
    run_id TEXT NOT NULL,
    event TEXT NOT NULL,
    verdict TEXT NOT NULL,
    line TEXT NOT NULL,
    state TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    payload TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (run_id, event)
);
CREATE INDEX webhook_outbox_created ON webhook_outbox (created_at);
CREATE TABLE webhook_targets (
    url_sha256 TEXT PRIMARY KEY,
    first_seen DOUBLE PRECISION NOT NULL
);
CREATE TABLE webhook_sent (
    run_id TEXT NOT NULL,
    event TEXT NOT NULL,
    url_sha256 TEXT NOT NULL,
    outcome TEXT NOT NULL,
    at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (run_id, event, url_sha256)
);
CREATE TABLE webhook_claims (
    run_id TEXT NOT NULL,
    event TEXT NOT NULL,
    url_sha256 TEXT NOT NULL,
    holder TEXT NOT NULL,
    until DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (run_id, event, url_sha256)
);
"""
# the generation a column file is checked against (see the module's docstring)
_V1_ROW_GENERATIONS = """CREATE TABLE row_generations (
    run_id TEXT PRIMARY KEY,
    gen BIGINT NOT NULL,
    tx BIGINT
);
CREATE TABLE row_files (
    run_id TEXT PRIMARY KEY,
    gen BIGINT NOT NULL,
    name TEXT NOT NULL,
    rows BIGINT NOT NULL,
    size BIGINT NOT NULL,
    sha256 TEXT NOT NULL,
    modules TEXT
);
CREATE FUNCTION history_rows_changed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    tx BIGINT := txid_current();
    changed TEXT;
BEGIN
    FOREACH changed IN ARRAY CASE TG_OP WHEN 'INSERT' THEN ARRAY[NEW.run_id] WHEN 'DELETE' THEN ARRAY[OLD.run_id]
                                       ELSE ARRAY[OLD.run_id, NEW.run_id] END LOOP
        -- the run this transaction bumped last (a setting local to it): its next rows need no look at the table
        IF current_setting('history.bumped', true) IS DISTINCT FROM tx || ':' || changed THEN
            INSERT INTO row_generations (run_id, gen, tx) VALUES (changed, 1, tx)
                ON CONFLICT (run_id) DO UPDATE SET gen = row_generations.gen + 1, tx = excluded.tx
                WHERE row_generations.tx IS DISTINCT FROM excluded.tx;
            PERFORM set_config('history.bumped', tx || ':' || changed, true);
        END IF;
    END LOOP;
    RETURN NULL;
END
$$;
CREATE TRIGGER rows_generation AFTER INSERT OR UPDATE OR DELETE ON rows
    FOR EACH ROW EXECUTE FUNCTION history_rows_changed();
"""


def _v1() -> str:
    """Version 1's DDL: the runs, their rows (columns by field kind), the records beside them, the webhooks' and
    the rows' generations."""
    rows = f"""CREATE TABLE rows (
    {_row_columns()},
    seq BIGINT GENERATED ALWAYS AS IDENTITY,
    PRIMARY KEY (run_id, module, model_key, profile, source)
);
CREATE INDEX rows_module ON rows (module, model_key);
"""
    return _V1_RUNS + rows + _V1_RECORDS + _V1_WEBHOOKS + _V1_ROW_GENERATIONS


# the column files' bytes (controller.history.frames.TableFiles): every controller of the database reads the one
# a controller wrote, checked against its record in row_files as a file beside a SQLite history is
_V2 = """
CREATE TABLE row_file_data (
    run_id TEXT NOT NULL,
    name TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    data BYTEA NOT NULL,
    PRIMARY KEY (name, sha256)
);
CREATE INDEX row_file_data_run ON row_file_data (run_id);
"""

# the change points the history keeps of itself (controller.history.trends, ADR 0043)
_V3 = """
CREATE TABLE trend_findings (
    name TEXT PRIMARY KEY,
    version TEXT NOT NULL,
    computed_at DOUBLE PRECISION NOT NULL,
    body TEXT NOT NULL
);
"""

# run requests recorded with their parts and not yet sent (ADR 0060)
_V4 = """
CREATE TABLE unsent_requests (
    run_id TEXT NOT NULL,
    module TEXT NOT NULL,
    payload TEXT NOT NULL,
    priority TEXT NOT NULL,
    started_by TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (run_id, module)
);
"""

# (version, DDL): append a new version for a change; never edit one that has shipped
MIGRATIONS: tuple[tuple[int, str], ...] = ((1, _v1()), (2, _V2), (3, _V3), (4, _V4))


def applied(db: PostgresDatabase) -> int:
    """The newest schema version applied (0: none)."""
    db.raw.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, applied_at"
                   " TIMESTAMPTZ NOT NULL DEFAULT now())")
    row = db.raw.execute("SELECT COALESCE(MAX(version), 0) FROM schema_version").fetchone()
    return int(row[0]) if row else 0


def migrate(db: PostgresDatabase) -> int:
    """Apply the missing versions, in order, each in one transaction; returns the version now applied."""
    if db.raw.execute("SELECT to_regclass('schema_version') IS NOT NULL").fetchone() == (True,) and \
            applied(db) >= MIGRATIONS[-1][0]:
        return MIGRATIONS[-1][0]  # the common case: no lock taken
    db.raw.execute("SELECT pg_advisory_lock(%s)", (MIGRATE_LOCK,))
    try:
        have = applied(db)
        for version, ddl in MIGRATIONS:
            if version > have:
                with db.raw.transaction():
                    db.raw.execute(ddl)
                    db.raw.execute("INSERT INTO schema_version (version) VALUES (%s)", (version,))
                have = version
    finally:
        db.raw.execute("SELECT pg_advisory_unlock(%s)", (MIGRATE_LOCK,))
    return have
