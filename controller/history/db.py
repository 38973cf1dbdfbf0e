"""The run history's database seam: which engine a history lives in, its connection, its transactions and its
placeholders. The history's queries are written once, in SQL both engines accept (``?`` placeholders,
``ON CONFLICT``, ``->>``, ``CAST(... AS DOUBLE PRECISION)``); this module is the one place that knows the engine.

A path (or ``:memory:``) is a SQLite file, the embedded default (:mod:`~controller.history.schema` creates and
migrates it); a ``postgresql://`` URL is a PostgreSQL database shared by several controllers
(:mod:`~controller.history.pg`: versioned migrations). ADR 0031 says why and what was measured.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, Protocol

from contract.redact import redact_url
from controller.history.pg import migrate
from controller.history.records import HistoryFull, HistoryStopped, HistoryUnavailable
from controller.history.schema import connect as connect_sqlite

URL_SCHEMES = ("postgresql://", "postgres://")
# every write transaction of a PostgreSQL history takes this lock: writers take turns, as SQLite's BEGIN IMMEDIATE
# makes them (a baseline's next version, a webhook's claim and a run's generation stay read-then-write safe)
WRITE_LOCK = 0x6D31303030  # "m1000"
CONNECT_TIMEOUT = 30.0  # s, the first connection of a PostgreSQL history
RECONNECT_TIMEOUT = 5.0  # s, each reconnection (fleetctl serve retries)


class Cursor(Protocol):
    """What the history reads of a statement's result (sqlite3's and psycopg's cursors both are this)."""

    @property
    def description(self) -> Any: ...
    @property
    def rowcount(self) -> int: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...
    def fetchmany(self, size: int = ...) -> list[Any]: ...
    def __iter__(self) -> Iterator[Any]: ...


def is_url(location: str | Path) -> bool:
    """Whether a history setting names a PostgreSQL database (else it is a SQLite file)."""
    return isinstance(location, str) and location.startswith(URL_SCHEMES)




class Database:
    """One connection to a history's database. ``execute``/``executemany`` take ``?`` placeholders on either
    engine; :meth:`tx` is a write transaction (writers take turns); reads outside one see committed data."""

    engine: str  # 'sqlite' or 'postgresql'
    # what messages name: the file, or the URL without its password
    where: str
    # the column that orders a table's rows as they were first inserted
    insert_order: str
    raw: Any  # the engine's own connection

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        raise NotImplementedError

    def executemany(self, sql: str, params: Iterable[Sequence[Any]]) -> Cursor:
        raise NotImplementedError

    def executescript(self, sql: str) -> None:
        raise NotImplementedError

    def batches(self, sql: str, params: Sequence[Any], size: int) -> Iterator[list[tuple[Any, ...]]]:
        """The result a batch at a time, never all of it in memory at once."""
        raise NotImplementedError

    def blob(self, sql: str, params: Sequence[Any] = ()) -> bytes | None:
        """The one binary value a query selects (None: no row)."""
        raise NotImplementedError

    @contextmanager
    def tx(self) -> Iterator[Database]:
        raise NotImplementedError
        yield self

    def close(self) -> None:
        raise NotImplementedError


class SqliteDatabase(Database):
    engine = "sqlite"
    insert_order = "rowid"

    def __init__(self, path: Path) -> None:
        self.where = str(path)
        self.raw = connect_sqlite(path)

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        return self.raw.execute(sql, params)

    def executemany(self, sql: str, params: Iterable[Sequence[Any]]) -> Cursor:
        return self.raw.executemany(sql, params)

    def executescript(self, sql: str) -> None:
        self.raw.executescript(sql)

    def batches(self, sql: str, params: Sequence[Any], size: int) -> Iterator[list[tuple[Any, ...]]]:
        cur = self.raw.execute(sql, params)
        while rows := cur.fetchmany(size):
            yield rows

    def blob(self, sql: str, params: Sequence[Any] = ()) -> bytes | None:
        row = self.raw.execute(sql, params).fetchone()
        return None if row is None else bytes(row[0])

    @contextmanager
    def tx(self) -> Iterator[Database]:
        self.raw.execute("BEGIN IMMEDIATE")
        try:
            yield self
        except BaseException:
            self.raw.execute("ROLLBACK")
            raise
        self.raw.execute("COMMIT")

    def close(self) -> None:
        self.raw.close()


def _line(exc: BaseException) -> str:
    """psycopg's message in one line (its DETAIL/HINT lines and a server's context dropped)."""
    text = str(exc).strip()
    return text.splitlines()[0].strip() if text else type(exc).__name__


@lru_cache(maxsize=512)
def _pg_sql(sql: str) -> str:
    """``?`` placeholders as psycopg's ``%s`` (a literal ``%`` doubled). The history's SQL holds no ``?`` but its
    placeholders."""
    return sql.replace("%", "%%").replace("?", "%s")


class PostgresDatabase(Database):
    engine = "postgresql"
    insert_order = "seq"

    def __init__(self, url: str) -> None:
        import psycopg

        self.where = redact_url(url)
        self._url = url
        self._errors = psycopg.errors
        self.raw = self._open(CONNECT_TIMEOUT)
        # a statement_timeout, or the server gone mid-way: one line too
        with self._reached():
            migrate(self)

    def _open(self, timeout: float) -> Any:
        """A new connection (autocommit; JSON read as its text, as SQLite gives it); HistoryUnavailable when none."""
        import psycopg
        from psycopg.types.string import TextLoader

        try:
            raw = psycopg.connect(self._url, autocommit=True, connect_timeout=max(1, round(timeout)))
        except psycopg.Error as exc:
            raise HistoryUnavailable(f"{self.where}: cannot open run history: {_line(exc)}") from exc
        for name in ("json", "jsonb"):
            raw.adapters.register_loader(name, TextLoader)
        return raw

    def _conn(self) -> Any:
        """The connection, made again when the server dropped the last one (restarted, killed, a failover): a
        history outlives its server's restarts; while the server is away each use is one HistoryUnavailable."""
        if self.raw.broken or self.raw.closed:
            self.raw = self._open(RECONNECT_TIMEOUT)
        return self.raw

    @contextmanager
    def _reached(self) -> Iterator[None]:
        """psycopg's errors as the history's own, in one line: the server gone (HistoryUnavailable, what /metrics
        and ``fleetctl serve`` count as the history down), or a statement the server stopped (HistoryStopped: its
        statement_timeout, its disk full)."""
        errors = self._errors
        try:
            yield
        except errors.QueryCanceled as exc:
            raise HistoryStopped(f"{self.where}: run history query stopped by the server: {_line(exc)} (its "
                                 "statement_timeout, or an administrator's cancel)") from exc
        except errors.DiskFull as exc:
            raise HistoryFull(f"{self.where}: run history not written, the server's disk is full: "
                                 f"{_line(exc)}") from exc
        except errors.OperationalError as exc:
            raise HistoryUnavailable(f"{self.where}: run history unreachable: {_line(exc)}") from exc

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Cursor:
        with self._reached():
            return self._conn().execute(_pg_sql(sql), params)

    def executemany(self, sql: str, params: Iterable[Sequence[Any]]) -> Cursor:
        with self._reached():
            cur = self._conn().cursor()
            cur.executemany(_pg_sql(sql), params)
            return cur

    def executescript(self, sql: str) -> None:
        with self._reached():
            self._conn().execute(sql)  # the history's own DDL, no parameters

    def batches(self, sql: str, params: Sequence[Any], size: int) -> Iterator[list[tuple[Any, ...]]]:
        with self._reached():
            conn = self._conn()
            with conn.transaction(), conn.cursor(name="history_batches") as cur:  # a server-side cursor
                cur.itersize = size
                cur.execute(_pg_sql(sql), params)
                while rows := cur.fetchmany(size):
                    yield rows

    def blob(self, sql: str, params: Sequence[Any] = ()) -> bytes | None:
        # in binary: bytea's text form is hex, twice the bytes on the wire and a decode (a 1 M-row run's column
        # file read 0.67 s so, against SQLite's 0.15 s)
        with self._reached():
            row = self._conn().execute(_pg_sql(sql), params, binary=True).fetchone()
        return None if row is None else bytes(row[0])

    @contextmanager
    def tx(self) -> Iterator[Database]:
        with self._reached():
            conn = self._conn()
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (WRITE_LOCK,))
                yield self

    def close(self) -> None:
        self.raw.close()


def connect(location: str | Path) -> Database:
    """The history at ``location``: a ``postgresql://`` URL, else a SQLite file (created when absent), its schema
    created and migrated."""
    if is_url(location):
        return PostgresDatabase(str(location))
    path = Path(location).expanduser()
    if str(path) != ":memory:":
        path.parent.mkdir(parents=True, exist_ok=True)
    return SqliteDatabase(path)

