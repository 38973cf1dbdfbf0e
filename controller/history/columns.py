"""A run's rows as one column file (Arrow IPC, lz4) beside the SQLite history: its format, its atomic write and
its checked read. No SQL here: :mod:`~controller.history.frames` says which file is current.

SQLite hands every value to Python as an object (~8 µs a row of ``ResultRow``'s 48 columns); a report of a
1 M-row run waited ~8 s on that alone. A finished run's rows are kept a second time, column by column, in
``<history>.columns/<digest of the run id>-g<generation>.arrow`` (ADR 0028: Arrow IPC with lz4 read ~2x faster
than Parquet at the same size). A file is written to a temporary name, fsynced and renamed, so a reader sees
it whole or not at all; its row count, size and sha256 are recorded in the history and checked on every read,
so a torn or damaged file is never taken for the run's rows.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import typing
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contract.records import ResultRow
from controller.history.records import HistoryError
from controller.history.schema import ROW_FIELDS

# pyarrow and pandas load when rows are read into a frame, not with the history
if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

SUFFIX = ".arrow"
# <name>.tmp-<pid>: a file being written (left behind by a writer killed mid-write)
TMP_MARK = ".tmp-"
# rows converted from SQLite's Python objects at a time (bounded memory)
BATCH_ROWS = 50_000
# a column file's record batch (lz4 frames of its own): a read of some modules decompresses only the batches that
# hold their rows (a module's rows are stored together, in a batch or two); a file of a smaller run is one batch
FILE_BATCH_ROWS = 4096


@dataclass(frozen=True)
class ColumnFile:
    """A column file as the history records it: what a read checks the file against."""

    name: str
    rows: int
    size: int
    sha256: str


def _kind(field: str) -> str:
    """'float', 'int' or 'str': how a ResultRow field is stored (bool as SQLite does, 0/1; JSON fields as text)."""
    args = typing.get_args(ResultRow.model_fields[field].annotation) or (ResultRow.model_fields[field].annotation,)
    return "float" if float in args else "int" if (int in args or bool in args) else "str"


KINDS: dict[str, str] = {f: _kind(f) for f in ROW_FIELDS}
TEXT_FIELDS = tuple(f for f, k in KINDS.items() if k == "str")


def schema() -> pa.Schema:
    import pyarrow as pa

    types = {"float": pa.float64(), "int": pa.int64(), "str": pa.dictionary(pa.int32(), pa.string())}
    return pa.schema([(f, types[k]) for f, k in KINDS.items()])


def file_name(run_id: str, generation: int) -> str:
    """The file of a run's rows at a generation (run ids hold ':' and '/': the name is their digest)."""
    return f"{hashlib.sha256(run_id.encode()).hexdigest()[:32]}-g{generation}{SUFFIX}"


def table_from_values(batches: Iterable[Sequence[tuple[Any, ...]]], where: str) -> pa.Table:
    """Rows as SQLite gives them (tuples in ``ROW_FIELDS`` order, a batch at a time) as one Arrow table: numbers
    as numbers (NULL as null), text dictionary-encoded. ``where`` names the rows in an error."""
    import pyarrow as pa

    sch = schema()
    out = []
    for rows in batches:
        arrays = []
        for i, values in enumerate(zip(*rows, strict=True)):
            field = sch.field(i)
            try:
                arr = pa.array(values, type=field.type.value_type if KINDS[field.name] == "str" else field.type)
            except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
                raise HistoryError(f"{where}: column {field.name!r} holds a value of another type: {exc}") from exc
            arrays.append(arr.dictionary_encode() if KINDS[field.name] == "str" else arr)
        out.append(pa.RecordBatch.from_arrays(arrays, schema=sch))
    table = pa.Table.from_batches(out, schema=sch).unify_dictionaries().combine_chunks()
    return pa.table([_sorted_dictionary(table.column(i)) if KINDS[f] == "str" else table.column(i)
                     for i, f in enumerate(ROW_FIELDS)], schema=sch)


def _sorted_dictionary(col: pa.ChunkedArray) -> pa.Array:
    """A dictionary column with its dictionary sorted (the frame's categories come sorted, as the analysis
    wants them, without a pass over the rows when read)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    order = pc.array_sort_indices(arr.dictionary).to_numpy()
    rank = np.empty(len(order), dtype=np.int32)
    rank[order] = np.arange(len(order), dtype=np.int32)
    return pa.DictionaryArray.from_arrays(pc.take(pa.array(rank), arr.indices), arr.dictionary.take(pa.array(order)))


def encode(table: pa.Table) -> bytes:
    """The bytes of a column file of ``table`` (Arrow IPC file format, lz4)."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    sink = pa.BufferOutputStream()
    with ipc.new_file(sink, table.schema, options=ipc.IpcWriteOptions(compression="lz4")) as writer:
        writer.write_table(table, max_chunksize=FILE_BATCH_ROWS)
    return bytes(sink.getvalue())


def record_of(name: str, table: pa.Table, data: bytes) -> ColumnFile:
    return ColumnFile(name=name, rows=table.num_rows, size=len(data), sha256=hashlib.sha256(data).hexdigest())


def decode(data: bytes, rec: ColumnFile, only: Sequence[str] | None = None,
           modules: Collection[str] | None = None) -> pa.Table | None:
    """The table in a column file's bytes (of the fields ``only``, in that order, when given: the other columns
    are not decompressed, 0.13 s instead of 0.5 s for a trend's 6 columns of 100 runs; of the rows of ``modules``
    only, when given: only the record batches that hold them are decompressed, ADR 0043), or None when the bytes
    are of another size or digest than recorded, or do not hold the recorded rows in the recorded columns."""
    import pyarrow as pa
    import pyarrow.ipc as ipc

    if len(data) != rec.size or hashlib.sha256(data).hexdigest() != rec.sha256:
        return None
    full = schema()
    fields = None if only is None else [full.get_field_index(f) for f in only]
    if fields is not None and min(fields, default=0) < 0:
        raise ValueError(f"not a field of the rows: {[f for f in only or () if full.get_field_index(f) < 0]}")
    try:
        buf = pa.py_buffer(data)
        reader = ipc.open_file(buf)
        if not reader.schema.equals(full):
            return None
        if modules is not None:
            return _of_modules(buf, rec, full, fields, modules)
        # a reader of some fields (its schema is of those: the whole one is checked above)
        if fields is not None:
            reader = ipc.open_file(buf, options=ipc.IpcReadOptions(included_fields=fields))
        table = reader.read_all()
    except (pa.ArrowInvalid, OSError):
        return None
    if table.num_rows != rec.rows:
        return None
    return table if only is None else table.select(list(only))


def _of_modules(buf: pa.Buffer, rec: ColumnFile, full: pa.Schema, fields: list[int] | None,
                modules: Collection[str]) -> pa.Table | None:
    """:func:`decode` of the rows of ``modules``: the module column of every batch read (the recorded rows counted),
    then every field of the batches with a row of one of them, then those rows."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.ipc as ipc

    at = full.get_field_index("module")
    want = pa.array(sorted(set(modules)), type=pa.string())
    names = ipc.open_file(buf, options=ipc.IpcReadOptions(included_fields=[at]))
    counted, keep = 0, []
    for i in range(names.num_record_batches):
        col = names.get_batch(i).column(0)
        counted += len(col)
        hit = pc.is_in(col.dictionary.cast(pa.string()), value_set=want)  # the file's one dictionary
        if len(col) and pc.any(pc.take(hit, col.indices)).as_py():
            keep.append(i)
    if counted != rec.rows:
        return None
    read = None if fields is None else sorted({*fields, at})
    reader = ipc.open_file(buf, options=ipc.IpcReadOptions(included_fields=read)) if read else ipc.open_file(buf)
    table = pa.Table.from_batches([reader.get_batch(i) for i in keep], schema=reader.schema)
    table = table.filter(pc.is_in(table.column("module").cast(pa.string()), value_set=want))
    return table if fields is None else table.select([full.field(i).name for i in fields])


def write(folder: Path, name: str, table: pa.Table) -> ColumnFile:
    """``table`` as ``folder/name``, atomically: written under a temporary name, fsynced, renamed, the folder
    fsynced. Returns what the history records of it."""
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / name
    tmp = folder / f"{name}{TMP_MARK}{os.getpid()}"
    data = encode(table)
    try:
        tmp.write_bytes(data)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    dfd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return record_of(name, table, data)


def read(folder: Path, rec: ColumnFile, only: Sequence[str] | None = None,
         modules: Collection[str] | None = None) -> pa.Table | None:
    """The table in the recorded file (of the fields ``only``, when given), or None when the file is missing, of
    another size or digest, or does not hold the recorded rows in the recorded columns (the caller reads SQLite
    instead)."""
    try:
        data = (folder / rec.name).read_bytes()
    except OSError:
        return None
    return decode(data, rec, only, modules)


def frame(tables: Sequence[pa.Table], model_keys: Sequence[str] | None = None) -> pd.DataFrame:
    """Tables of rows as the report's frame: one column per ResultRow field, text as categoricals with sorted
    categories (the analysis numbers modules in category order), numbers as numpy arrays (an int column with
    a NULL as float, NaN for NULL). Only the rows of ``model_keys``, when given."""
    import pandas as pd
    import pyarrow as pa

    table = pa.concat_tables(tables).unify_dictionaries() if len(tables) != 1 else tables[0]
    if model_keys is not None:
        import pyarrow.compute as pc

        table = table.filter(pc.is_in(table.column("model_key").cast(pa.string()),
                                      value_set=pa.array(list(model_keys), type=pa.string())))
    # the caller's list: each table goes as it is converted (self_destruct)
    del tables
    df = table.to_pandas(split_blocks=True, self_destruct=True)
    del table
    # the Arrow buffers freed by the conversion back to the system: pyarrow's allocator keeps them otherwise, for
    # the process's life (1 M rows: 90 MiB of a report's peak, bench/report.py --history)
    pa.default_memory_pool().release_unused()
    for c in TEXT_FIELDS:
        # a table of some of the fields (``row_frame``'s ``only``)
        if c not in df.columns:
            continue
        cats = df[c].cat.categories
        if not len(cats):  # all NULL: categories of text still, as pandas gives text
            df[c] = df[c].cat.set_categories(pd.Index([], dtype=object).astype(str))
        elif not cats.is_monotonic_increasing:
            df[c] = df[c].cat.reorder_categories(cats.sort_values())
    return df


def modules(table: pa.Table) -> list[str]:
    """The modules with rows in a table of rows, sorted."""
    return sorted({str(m) for m in table.column("module").unique().to_pylist() if m is not None})


def remove_others(folder: Path, run_id: str, keep: str) -> None:
    """The run's files of other generations (superseded), best effort: a reader that has one open keeps it."""
    prefix = file_name(run_id, 0).rsplit("-g", 1)[0] + "-g"
    for p in folder.glob(f"{prefix}*{SUFFIX}"):
        if p.name != keep:
            with contextlib.suppress(OSError):
                p.unlink()


def remove_abandoned(folder: Path) -> int:
    """Temporary files whose writer is gone (killed mid-write); returns how many went."""
    gone = 0
    for p in folder.glob(f"*{TMP_MARK}*") if folder.is_dir() else ():
        pid = p.name.rsplit(TMP_MARK, 1)[1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            with contextlib.suppress(OSError):
                p.unlink()
                gone += 1
    return gone


@dataclass(frozen=True)
class Folder:
    """Where a SQLite history keeps its column files: a folder beside it (the other store, a PostgreSQL history's
    table, is :class:`controller.history.frames.TableFiles`)."""

    path: Path

    def write(self, run_id: str, name: str, table: pa.Table) -> ColumnFile:
        return write(self.path, name, table)

    def read(self, rec: ColumnFile, only: Sequence[str] | None = None,
             modules: Collection[str] | None = None) -> pa.Table | None:
        return read(self.path, rec, only, modules)

    def remove_others(self, run_id: str, keep: ColumnFile) -> None:
        remove_others(self.path, run_id, keep.name)

    def remove_abandoned(self) -> int:
        return remove_abandoned(self.path)
