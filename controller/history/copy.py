"""A whole run history copied into another, on either engine (``fleetctl history copy --to LOCATION``): an
existing SQLite history moved into a shared PostgreSQL database (ADR 0031), or a backup.

A run is copied in one write transaction of the destination, its ``runs`` record with everything keyed by it
(its modules' progress, rows, events, telemetry, fingerprints, baseline version, webhook events and deliveries),
so a copy killed midway leaves every run whole or absent there. Copying again is idempotent and resumes: a run
whose copy already ended the same way (state, verdict, end) is skipped, one that has moved on since (it was
running) is replaced. What no run keys (modules' own events, webhook targets) is added where missing. Columns go
by name: an older history's missing columns take the destination's defaults, and engine-only columns (the
insertion order ``seq`` of PostgreSQL) are left to the destination. Column files are not copied: the
destination writes its own (``fleetctl history migrate`` or a run's first read).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from controller.history.db import Database
from controller.history.records import HistoryError

# what each run carries, beside its ``runs`` record: (table, the column that names the run)
RUN_TABLES: tuple[str, ...] = ("module_runs", "rows", "events", "telemetry", "fingerprints", "baselines",
                               "webhook_outbox", "webhook_sent", "unsent_requests")
_ENDED = "state, verdict, finished_at, verdict_line"  # a run copied with these equal needs no copy again
BATCH = 20_000  # rows read from the source at a time


@dataclass(frozen=True)
class CopyDone:
    """What :func:`copy_history` did: runs copied, already current there, replaced (they had moved on); events
    of modules and webhook targets added."""

    copied: int
    current: int
    replaced: int
    module_events: int
    targets: int


def _columns(db: Database, table: str) -> list[str]:
    cur = db.execute(f"SELECT * FROM {table} WHERE 1=0")
    return [d[0] for d in cur.description]


def _copy_rows(src: Database, dst: Database, table: str, where: str, params: tuple[Any, ...],
               shared: list[str]) -> None:
    """The source's ``table`` rows matching ``where`` inserted into the destination (``shared``: the columns both
    have), a batch at a time; a row whose key the destination holds is left as it is."""
    cols = ", ".join(f'"{c}"' for c in shared)
    insert = f"INSERT INTO {table} ({cols}) VALUES ({','.join('?' * len(shared))}) ON CONFLICT DO NOTHING"
    # a run's rows are read in insertion order
    order = f" ORDER BY {src.insert_order}" if table == "rows" else ""
    for batch in src.batches(f"SELECT {cols} FROM {table} WHERE {where}{order}", params, BATCH):
        dst.executemany(insert, batch)


def copy_history(src: Database, dst: Database, progress: Callable[[str], None] | None = None) -> CopyDone:
    """Every run of ``src`` into ``dst`` (see the module's docstring); ``progress`` is told each run copied."""
    if src.where == dst.where:
        raise HistoryError(f"{dst.where}: a history cannot be copied into itself")
    shared = {t: [c for c in _columns(src, t) if c in set(_columns(dst, t))] for t in ("runs", *RUN_TABLES)}
    there = {r[0]: tuple(r[1:]) for r in dst.execute(f"SELECT run_id, {_ENDED} FROM runs").fetchall()}
    copied = current = replaced = 0
    source_runs = src.execute(f"SELECT run_id, {_ENDED} FROM runs ORDER BY created_at, run_id").fetchall()
    for run_id, *ended in source_runs:
        if run_id in there and there[run_id] == tuple(ended):
            current += 1
            continue
        with dst.tx() as tx:
            # it moved on since it was copied (it was running): copied afresh
            if run_id in there:
                for table in (*RUN_TABLES, "runs"):
                    tx.execute(f"DELETE FROM {table} WHERE run_id=?", (run_id,))
            for table in RUN_TABLES:
                _copy_rows(src, tx, table, "run_id=?", (run_id,), shared[table])
            _copy_rows(src, tx, "runs", "run_id=?", (run_id,), shared["runs"])  # last: the run is whole
        replaced += run_id in there
        copied += run_id not in there
        if progress is not None:
            progress(run_id)
    events, targets = _copy_unkeyed(src, dst)
    return CopyDone(copied=copied, current=current, replaced=replaced, module_events=events, targets=targets)


def _copy_unkeyed(src: Database, dst: Database) -> tuple[int, int]:
    """Modules' own events (run id '') and webhook targets that the destination lacks: (events, targets) added."""
    have = set(dst.execute("SELECT module, ts, message FROM events WHERE run_id=''").fetchall())
    events = [e for e in src.execute("SELECT module, ts, message FROM events WHERE run_id=''").fetchall()
              if tuple(e) not in have]
    targets = src.execute("SELECT url_sha256, first_seen FROM webhook_targets").fetchall()
    with dst.tx() as tx:
        tx.executemany("INSERT INTO events (run_id, module, ts, message) VALUES ('', ?, ?, ?)", events)
        added = tx.executemany("INSERT INTO webhook_targets (url_sha256, first_seen) VALUES (?, ?)"
                               " ON CONFLICT DO NOTHING", targets).rowcount
    return len(events), max(0, added)
