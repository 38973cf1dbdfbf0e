"""The run history's column-wise reads: a run's rows into the report's pandas frame, from its column file when
that file is current, else from SQLite (and then the file is written, once the run has ended).

SQLite stays the record. A trigger on ``rows`` counts every change of a run's rows (``row_generations``); a
column file is recorded in ``row_files`` with the generation it was made from, its rows, size and sha256. A
file is read only when its generation is the run's and its bytes match: a stale, torn or damaged file is
never taken for the run's rows, whichever process (or older version of fleetctl) wrote the rows. A running
run is read from SQLite and gets no file. ``fleetctl history migrate`` writes the files of every ended run
that lacks a current one (idempotent; a migration killed part way leaves runs without a file, read from
SQLite, and the next one carries on).

A PostgreSQL history is read the same way (ADR 0031): its trigger counts the transactions that changed a run's
rows, and its column files' bytes live in the database (:class:`TableFiles`), so every controller of it reads the
file one of them wrote, under the same checks.

A long-lived process (``fleetctl serve``) keeps the frames it made in a :class:`FrameCache`, keyed by the records
of the files they came from: a file's bytes never change under its record (name, rows, size, sha256), so a kept
frame is the one its files would give again, and a run whose rows changed has another record, another key.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

from controller.history import columns
from controller.history.columns import ColumnFile
from controller.history.schema import ROW_FIELDS

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

    from controller.history.db import Database

_COLS = ", ".join(f'"{f}"' for f in ROW_FIELDS)


class ColumnStore(Protocol):
    """Where column files are kept: written, read checked against their record, superseded ones removed."""

    def write(self, run_id: str, name: str, table: pa.Table) -> ColumnFile: ...
    def read(self, rec: ColumnFile, only: Sequence[str] | None = None,
             modules: Collection[str] | None = None) -> pa.Table | None: ...
    def remove_others(self, run_id: str, keep: ColumnFile) -> None: ...
    def remove_abandoned(self) -> int: ...


@dataclass(frozen=True)
class TableFiles:
    """A PostgreSQL history's column files: their bytes in ``row_file_data``, keyed by name and sha256 (two
    controllers writing the same run's file at once each keep their own bytes; the record names one). A file is
    written in one statement: never seen half written, so none is ever abandoned."""

    db: Database

    def write(self, run_id: str, name: str, table: pa.Table) -> ColumnFile:
        data = columns.encode(table)
        rec = columns.record_of(name, table, data)
        self.db.execute("INSERT INTO row_file_data (run_id, name, sha256, data) VALUES (?,?,?,?)"
                        " ON CONFLICT DO NOTHING", (run_id, name, rec.sha256, data))
        return rec

    def read(self, rec: ColumnFile, only: Sequence[str] | None = None,
             modules: Collection[str] | None = None) -> pa.Table | None:
        data = self.db.blob("SELECT data FROM row_file_data WHERE name=? AND sha256=?", (rec.name, rec.sha256))
        return None if data is None else columns.decode(data, rec, only, modules)

    def remove_others(self, run_id: str, keep: ColumnFile) -> None:
        self.db.execute("DELETE FROM row_file_data WHERE run_id=? AND NOT (name=? AND sha256=?)",
                        (run_id, keep.name, keep.sha256))

    def remove_abandoned(self) -> int:
        return 0


class FrameCache:
    """Frames of runs read from their column files, and what was computed from such frames alone (a report's
    analysis), for the life of a process: at most ``max_bytes`` of them together, the least recently used going
    first (one larger than that is not kept). Frame keys are made by :meth:`ColumnReads.row_frame` from the
    files' records; a computation's key names every input of it. Safe across threads (the API's workers and the
    sync loop share one). A frame is handed out as a shallow copy (pandas' copy-on-write keeps a caller's change
    to it off the kept one); a computation's value as it is (it must be immutable)."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = self.hits = self.misses = self.recalled = 0
        self._kept: OrderedDict[Hashable, tuple[object, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> pd.DataFrame | None:
        """The frame kept under ``key`` (a shallow copy), or None."""
        got = self._take(key)
        if got is None:
            self.misses += 1
            return None
        self.hits += 1
        return cast("pd.DataFrame", got).copy(deep=False)

    def put(self, key: Hashable, frame: pd.DataFrame) -> None:
        self._keep(key, frame.copy(deep=False), frame_bytes(frame))

    def recall(self, key: Hashable) -> object | None:
        """What :meth:`remember` kept under ``key`` (None: nothing)."""
        got = self._take(key)
        if got is not None:
            self.recalled += 1
        return got

    def remember(self, key: Hashable, value: object, size: int) -> None:
        """Keep ``value``, a pure function of the inputs ``key`` names, which holds ``size`` bytes of its own."""
        self._keep(key, value, size)

    def _take(self, key: Hashable) -> object | None:
        with self._lock:
            got = self._kept.get(key)
            if got is None:
                return None
            self._kept.move_to_end(key)
            return got[0]

    def _keep(self, key: Hashable, value: object, size: int) -> None:
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._kept.pop(key, None)
            self.bytes += size - (old[1] if old else 0)
            self._kept[key] = (value, size)
            while self.bytes > self.max_bytes:
                _, (_, gone) = self._kept.popitem(last=False)
                self.bytes -= gone


def frame_bytes(frame: pd.DataFrame | None) -> int:
    """The bytes a frame's columns hold (text as categoricals: their codes and categories)."""
    return 0 if frame is None else int(frame.memory_usage(index=True, deep=False).sum())


@dataclass(frozen=True)
class Migrated:
    """What ``fleetctl history migrate`` did: runs whose column file it wrote, runs that had a current one,
    runs still running (read from the history's tables until they end), and temporary files of killed writers
    removed."""

    written: int
    current: int
    running: int
    abandoned: int


class ColumnReads:
    """The column-wise reads, a base of :class:`controller.history.History`."""

    db: Database
    path: Path | str
    # a long-lived process's (fleetctl serve): frames of column files kept
    frames: FrameCache | None = None

    @property
    def column_store(self) -> ColumnStore | None:
        """Where the ended runs' column files are kept: a folder beside a SQLite file, the ``row_file_data`` table
        of a PostgreSQL database (shared by every controller of it); None for a history in memory."""
        if self.db.engine == "postgresql":
            return TableFiles(self.db)
        folder = self.columns_folder
        return None if folder is None else columns.Folder(folder)

    @property
    def columns_folder(self) -> Path | None:
        """Where the column files live (None for a history in memory: its runs are read from SQLite)."""
        if not isinstance(self.path, Path) or str(self.path) == ":memory:":
            return None
        return self.path.with_name(self.path.name + ".columns")

    def row_frame(self, run_ids: Sequence[str], model_keys: Sequence[str] | None = None,
                  only: Sequence[str] | None = None, modules: Collection[str] | None = None) -> pd.DataFrame:
        """Every stored row of the given runs (of ``model_keys`` only, when given), one column per ResultRow
        field (the fields ``only``, when given: a trend over 100 runs converts 6 columns, not 48), text as
        categoricals (sorted categories), numbers as numbers: the same frame whichever store the rows come from.
        ``modules``: the rows of those modules only (a column file's other record batches not decompressed: each
        module's previous run read for a run of 100 modules is not a read of a fleet-wide run of 10,000)."""
        ids = list(dict.fromkeys(run_ids))
        wanted = None if modules is None else tuple(sorted(set(modules)))
        cache = self.frames
        key = None if cache is None else self.frame_key(ids, model_keys, only)
        if key is not None and wanted is not None:
            key = (key, wanted)
        if cache is not None and key is not None and (kept := cache.get(key)) is not None:
            return kept
        frame = columns.frame([self._run_table(r, only, wanted) for r in ids], model_keys)
        if cache is not None and key is not None:
            # rows that changed while they were read were read under another record than the key's: that record
            # is no longer current, so no later key names it, and what is kept under it is never found
            cache.put(key, frame)
        return frame

    def frame_key(self, run_ids: Sequence[str], model_keys: Sequence[str] | None = None,
                  only: Sequence[str] | None = None) -> Hashable | None:
        """What a kept frame of these runs is found by: the current files' records (None without a column store
        or when a run has no current file: a running run, rows not yet in a file)."""
        if self.column_store is None:
            return None
        recs = []
        for run_id in run_ids:
            rec = self._current_file(run_id)[0]
            if rec is None:
                return None
            recs.append(rec)
        return (str(self.path), tuple(recs), None if model_keys is None else tuple(model_keys),
                None if only is None else tuple(only))

    def _generation(self, run_id: str) -> int:
        row = self.db.execute("SELECT gen FROM row_generations WHERE run_id=?", (run_id,)).fetchone()
        return int(row[0]) if row else 0

    def _current_file(self, run_id: str) -> tuple[ColumnFile | None, int, bool]:
        """(the run's recorded file if made at the run's generation, the generation, whether the run has ended)."""
        row = self.db.execute(
            "SELECT f.name, f.rows, f.size, f.sha256, f.gen, COALESCE(g.gen, 0), r.state"
            " FROM (SELECT CAST(? AS TEXT) AS run_id) x LEFT JOIN row_files f ON f.run_id = x.run_id"
            " LEFT JOIN row_generations g ON g.run_id = x.run_id LEFT JOIN runs r ON r.run_id = x.run_id",
            (run_id,)).fetchone()
        name, rows, size, digest, made_at, gen, state = row
        rec = ColumnFile(name, int(rows), int(size), digest) if name is not None and made_at == gen else None
        return rec, int(gen), state is not None and state != "running"

    def _run_table(self, run_id: str, only: Sequence[str] | None = None,
                   modules: Collection[str] | None = None) -> pa.Table:
        """The run's rows (the fields ``only``, when given; of ``modules`` only, when given): its current column
        file's, else the rows table's (then the file of an ended run is written, of every field and module)."""
        store = self.column_store
        rec, _, ended = self._current_file(run_id)
        if store is not None and rec is not None:
            table = store.read(rec, only, modules)
            if table is not None:
                return table
        table, gen = self._table_from_rows(run_id)
        if ended:
            self._keep(run_id, gen, table)
        if modules is not None:
            import pyarrow as pa
            import pyarrow.compute as pc

            table = table.filter(pc.is_in(table.column("module").cast(pa.string()),
                                          value_set=pa.array(sorted(set(modules)), type=pa.string())))
        return table if only is None else table.select(list(only))

    def _keep(self, run_id: str, gen: int | None, table: pa.Table) -> bool:
        """Write and record the ended run's column file; False when it was not (rows changed while they were read,
        a history in memory, a folder not writable: the rows were read all the same)."""
        store = self.column_store
        if store is None or gen is None:
            return False
        try:
            self._record_file(run_id, gen, store.write(run_id, columns.file_name(run_id, gen), table),
                              columns.modules(table))
        except OSError:
            return False
        return True

    def _table_from_rows(self, run_id: str) -> tuple[pa.Table, int | None]:
        """The run's rows from the history's rows table (either engine), and the generation they are of (None when
        rows changed while read)."""
        before = self._generation(run_id)
        batches = self.db.batches(f"SELECT {_COLS} FROM rows WHERE run_id=?", (run_id,), columns.BATCH_ROWS)
        table = columns.table_from_values(batches, f"{self.path}: rows of run {run_id}")
        return table, before if self._generation(run_id) == before else None

    def _record_file(self, run_id: str, gen: int, rec: ColumnFile, modules: list[str]) -> None:
        """Record a written file and the modules with rows in it (a record of a later generation is never replaced
        by an earlier one), then remove the run's superseded files."""
        self.db.execute(
            "INSERT INTO row_files (run_id, gen, name, rows, size, sha256, modules) VALUES (?,?,?,?,?,?,?)"
            " ON CONFLICT (run_id) DO UPDATE SET gen=excluded.gen, name=excluded.name, rows=excluded.rows,"
            " size=excluded.size, sha256=excluded.sha256, modules=excluded.modules WHERE excluded.gen >= row_files.gen",
            (run_id, gen, rec.name, rec.rows, rec.size, rec.sha256, json.dumps(modules)))
        store = self.column_store
        if store is not None and self._current_file(run_id)[0] == rec:
            store.remove_others(run_id, rec)

    def migrate_columns(self) -> Migrated:
        """A column file for every ended run with rows that lacks a current one (``fleetctl history migrate``)."""
        store = self.column_store
        if store is None:
            return Migrated(0, 0, 0, 0)
        abandoned = store.remove_abandoned()
        runs = [r for (r,) in self.db.execute("SELECT DISTINCT run_id FROM rows ORDER BY run_id").fetchall()]
        written = current = running = 0
        for run_id in runs:
            rec, _, ended = self._current_file(run_id)
            if rec is not None and store.read(rec) is not None:
                current += 1
            elif not ended:
                running += 1
            else:
                table, gen = self._table_from_rows(run_id)
                written += self._keep(run_id, gen, table)
        return Migrated(written, current, running, abandoned)
