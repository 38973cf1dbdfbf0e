"""The run history's store: runs, module progress, events, rows, baselines, telemetry and environment
fingerprints, in one SQLite file or one PostgreSQL database (:mod:`~controller.history.db`: the same queries).

Writes are idempotent: the same row, progress or run recorded twice is stored once. Baselines
are versioned per release; each baseline version's rows are kept under the pseudo run id
``baseline:<release>:v<N>``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from contract.fingerprint import EnvFingerprint
from contract.records import ResultRow, RunProgress, TelemetrySummary
from controller.command import fleetctl
from controller.history.browse import BrowseQueries
from controller.history.db import Cursor, Database, connect, is_url
from controller.history.frames import ColumnReads, FrameCache
from controller.history.outbox import WebhookOutbox
from controller.history.queries import HistoryQueries
from controller.history.records import (
    GOLDEN_DRIFT_EVENT,
    RESET_EVENT,
    VERDICT_EVENT,
    HistoryError,
    RunInfo,
    UnsentRequest,
)
from controller.history.schema import ROW_FIELDS, row_from_db, row_to_db
from controller.history.trends import TrendFindings

# rows by column name: a history whose columns were added in another order (schema._add_row_columns) reads the same
_ROW_COLUMNS = ", ".join(f'"{f}"' for f in ROW_FIELDS)
_ROWS_KEY = ("run_id", "module", "model_key", "profile", "source")
_INSERT_ROW = (f"INSERT INTO rows ({_ROW_COLUMNS}) VALUES ({','.join('?' * len(ROW_FIELDS))})"
               f" ON CONFLICT ({', '.join(_ROWS_KEY)}) DO UPDATE SET "
               + ", ".join(f'"{f}"=excluded."{f}"' for f in ROW_FIELDS if f not in _ROWS_KEY))


class History(HistoryQueries, BrowseQueries, ColumnReads, WebhookOutbox, TrendFindings):
    """One run history (a SQLite file, or a PostgreSQL database given by its URL): its runs, their modules'
    progress and the events about them, result rows, baselines and device telemetry (the webhook outbox, the
    aggregate reads, the column-wise reads of rows and the kept trend findings are its bases).

    ``path``: the SQLite file, or the database's URL without its password (what messages name); ``db``: the
    database seam every query goes through; ``conn``: the engine's own connection under it (sqlite3's, psycopg's)."""

    path: Path | str

    def __init__(self, location: str | Path, *, frames: FrameCache | None = None) -> None:
        self.frames = frames
        self.db: Database = connect(location)
        self.path = self.db.where if is_url(location) else Path(location).expanduser()

    @property
    def conn(self) -> Any:
        """The engine's connection now (a PostgreSQL one is made again after its server dropped the last)."""
        return self.db.raw

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def tx(self) -> Iterator[Database]:
        """A write transaction (writers take turns, on either engine)."""
        with self.db.tx() as c:
            yield c

    # -- runs ---------------------------------------------------------------------------
    def create_run(self, run_id: str, *, release: str = "", tarball: str = "", sha256: str = "",
                   models: Iterable[str] = (), modules: Iterable[str] = (), kind: str = "run",
                   note: str = "", state: str = "running",
                   module_models: Mapping[str, Iterable[str]] | None = None) -> None:
        """Record a run (once). ``module_models``: the modules asked for only some of ``models``, and those
        (:attr:`RunInfo.module_models`)."""
        own = {m: list(keys) for m, keys in (module_models or {}).items()}
        with self.tx() as c:
            c.execute(
                "INSERT INTO runs (run_id, created_at, release, tarball, sha256, models, modules,"
                " kind, state, note, module_models) VALUES (?,?,?,?,?,?,?,?,?,?,?) ON CONFLICT DO NOTHING",
                (run_id, time.time(), release, tarball, sha256, json.dumps(list(models)),
                 json.dumps(list(modules)), kind, state, note, json.dumps(own)),
            )

    def set_dispatched(self, run_id: str, priority: str, at: float) -> None:
        """The run was (again) sent to its modules at ``priority``: its modules' waits count from ``at``."""
        with self.tx() as c:
            c.execute("UPDATE runs SET priority=?, dispatched_at=? WHERE run_id=?", (priority, at, run_id))

    def set_started_by(self, run_id: str, user: str) -> None:
        """Who started the run, recorded once: a resumed run keeps the user who started it."""
        with self.tx() as c:
            c.execute("UPDATE runs SET started_by=? WHERE run_id=? AND started_by=''", (user, run_id))

    def set_run_note(self, run_id: str, note: str) -> None:
        """The run's note (e.g. the comparison a run of ``fleetctl ab`` belongs to)."""
        with self.tx() as c:
            c.execute("UPDATE runs SET note=? WHERE run_id=?", (note, run_id))

    def set_run_state(self, run_id: str, state: str, verdict: str | None = None, line: str | None = None,
                      findings: str | None = None) -> None:
        """The run's state (and verdict); a verdict of a finished run also queues its webhook event, once
        (``findings``: JSON of its regressions and outliers, kept as the event's ``payload`` and sent with it).

        The verdict's line is kept with it (``RunInfo.verdict_line``: what ``fleetctl status`` shows of a
        finished run without building its report again); a run set running again (resumed) loses it,
        so its next end is judged afresh."""
        now = time.time()
        finished = now if state != "running" else None
        recorded = line or (f"{verdict.upper()} {run_id}" if verdict is not None else None)
        with self.tx() as c:
            c.execute(
                "UPDATE runs SET state=?, verdict=COALESCE(?, verdict), finished_at=COALESCE(finished_at, ?),"
                " verdict_line=CASE WHEN ?='running' THEN NULL ELSE COALESCE(?, verdict_line) END"
                " WHERE run_id=?",
                (state, verdict, finished, state, recorded if verdict is not None else None, run_id),
            )
            if verdict is not None and state != "running":
                c.execute("INSERT INTO webhook_outbox (run_id, event, verdict, line, state, created_at, payload)"
                          " SELECT run_id, ?, ?, ?, ?, ?, ? FROM runs WHERE run_id=? ON CONFLICT DO NOTHING",
                          (VERDICT_EVENT, verdict, recorded, state, now, findings or "", run_id))

    def run(self, run_id: str) -> RunInfo | None:
        cur = self.db.execute("SELECT * FROM runs WHERE run_id=?", (run_id,))
        r = cur.fetchone()
        return self._run_info(cur, r) if r else None

    def find_run(self, prefix: str) -> RunInfo:
        """A run by id or unique id prefix ('latest' is the newest run)."""
        if prefix == "latest":
            runs = self.runs(limit=1)
            if not runs:
                raise HistoryError(f"no runs in {self.path} yet: run a validation "
                                   f"(`{fleetctl('validate', 'TARBALL')}`)")
            return runs[0]
        exact = self.run(prefix)
        if exact:
            return exact
        cur = self.db.execute("SELECT * FROM runs WHERE run_id LIKE ? ORDER BY created_at DESC",
                              (prefix.replace("%", "") + "%",))
        found = cur.fetchall()
        if len(found) == 1:
            return self._run_info(cur, found[0])
        if not found:
            raise HistoryError(f"no run {prefix!r} in {self.path}")
        raise HistoryError(f"run id {prefix!r} is ambiguous ({len(found)} runs)")

    def runs(self, limit: int = 50, kind: str = "run") -> list[RunInfo]:
        cur = self.db.execute("SELECT * FROM runs WHERE kind=? ORDER BY created_at DESC LIMIT ?",
                              (kind, limit))
        return [self._run_info(cur, r) for r in cur.fetchall()]

    def releases_in_use(self, newest: int) -> set[str]:
        """sha256 of the releases of running runs and of the ``newest`` releases by their last run."""
        running = self.db.execute("SELECT DISTINCT sha256 FROM runs WHERE state='running' AND sha256 != ''")
        recent = self.db.execute("SELECT sha256 FROM runs WHERE sha256 != '' GROUP BY sha256 "
                                 "ORDER BY MAX(created_at) DESC LIMIT ?", (newest,))
        return {r[0] for r in running.fetchall()} | {r[0] for r in recent.fetchall()}

    def release_versions(self) -> dict[str, str]:
        """The version of each release run here, by its tarball's sha256 (the newest run's name for it)."""
        cur = self.db.execute("SELECT sha256, release FROM runs WHERE sha256 != '' ORDER BY created_at")
        return {str(sha): str(rel) for sha, rel in cur.fetchall()}

    @staticmethod
    def _run_info(cur: Cursor, r: tuple[Any, ...]) -> RunInfo:
        d = dict(zip([c[0] for c in cur.description], r, strict=True))
        d["models"] = tuple(json.loads(d["models"]))
        d["modules"] = tuple(json.loads(d["modules"]))
        d["module_models"] = {m: tuple(keys) for m, keys in json.loads(d.get("module_models") or "{}").items()}
        return RunInfo.model_validate(d)

    # -- progress -----------------------------------------------------------------------
    def upsert_progress(self, p: RunProgress, *, force: bool = False) -> None:
        """Keep the newest progress of (run, module); an older update never wins unless ``force``
        (a late state from the module replacing the controller's own "lost")."""
        self.upsert_progress_many([p], force=force)

    def upsert_progress_many(self, progress: Iterable[RunProgress], *, force: bool = False) -> None:
        """:meth:`upsert_progress` of each, in one transaction."""
        progress = list(progress)
        if not progress:
            return
        with self.tx() as c:
            _upsert_progress(c, progress, force)

    def record_queued(self, progress: Iterable[RunProgress], requests: Iterable[UnsentRequest]) -> None:
        """The parts' progress and their requests not yet sent, in one transaction: what a dispatch records before
        its first message (ADR 0060)."""
        progress, requests = list(progress), list(requests)
        with self.tx() as c:
            if progress:
                _upsert_progress(c, progress, False)
            c.executemany("INSERT INTO unsent_requests (run_id, module, payload, priority, started_by, created_at) "
                          "VALUES (?,?,?,?,?,?) ON CONFLICT (run_id, module) DO UPDATE SET payload=excluded.payload, "
                          "priority=excluded.priority, started_by=excluded.started_by, created_at=excluded.created_at",
                          [(r.run_id, r.module, json.dumps(r.payload), r.priority, r.started_by, r.created_at)
                           for r in requests])

    def unsent(self, run_id: str, *, before: float | None = None) -> list[UnsentRequest]:
        """The run's requests recorded and not yet marked sent (those recorded before ``before``, when given)."""
        cur = self.db.execute("SELECT module, payload, priority, started_by, created_at FROM unsent_requests "
                              "WHERE run_id=? AND created_at < ? ORDER BY module",
                              (run_id, float("inf") if before is None else before))
        return [UnsentRequest(run_id=run_id, module=m, payload=json.loads(p), priority=pr, started_by=u,
                              created_at=float(t)) for m, p, pr, u, t in cur.fetchall()]

    def mark_sent(self, run_id: str, modules: Iterable[str] | None = None) -> None:
        """The run's requests to ``modules`` (all of them: None) sent, or no longer to be sent."""
        with self.tx() as c:
            if modules is None:
                c.execute("DELETE FROM unsent_requests WHERE run_id=?", (run_id,))
            else:
                c.executemany("DELETE FROM unsent_requests WHERE run_id=? AND module=?",
                              [(run_id, m) for m in modules])

    # -- what the controller decided, and why ----------------------------------------------
    def add_event(self, run_id: str, module: str, message: str) -> None:
        with self.tx() as c:
            c.execute("INSERT INTO events (run_id, module, ts, message) VALUES (?,?,?,?)",
                      (run_id, module, time.time(), message))

    def add_events(self, run_id: str, modules: Iterable[str], message: str) -> None:
        """The same event of each of ``modules`` of the run, in one transaction (a cancel of a whole fleet)."""
        now = time.time()
        with self.tx() as c:
            c.executemany("INSERT INTO events (run_id, module, ts, message) VALUES (?,?,?,?)",
                          [(run_id, m, now, message) for m in modules])

    def add_module_event(self, module: str, message: str) -> None:
        """An event about a module, not a run (run id ''): e.g. its failed runs reset by ``fleetctl devices reset``."""
        self.add_event("", module, message)

    def module_events(self, module: str) -> list[tuple[float, str]]:
        cur = self.db.execute("SELECT ts, message FROM events WHERE run_id='' AND module=? ORDER BY ts", (module,))
        return [(float(t), str(msg)) for t, msg in cur.fetchall()]

    def last_module_reset(self, module: str) -> float | None:
        """When the module's failed runs were last reset (``fleetctl devices reset``), or None."""
        (ts,) = self.db.execute("SELECT MAX(ts) FROM events WHERE run_id='' AND module=? AND message LIKE ?",
                                (module, f"{RESET_EVENT}%")).fetchone()
        return None if ts is None else float(ts)

    def module_marks(self) -> tuple[dict[str, float], dict[str, str]]:
        """Every module's last reset (:meth:`last_module_reset`) and newest failed golden check since it
        (:meth:`golden_drift`), module -> each, in one query (modules with none left out)."""
        cur = self.db.execute("SELECT module, ts, message FROM events WHERE run_id='' AND (message LIKE ? OR"
                              " message LIKE ?) ORDER BY ts", (f"{RESET_EVENT}%", f"{GOLDEN_DRIFT_EVENT}%"))
        resets: dict[str, float] = {}
        drifts: dict[str, tuple[float, str]] = {}
        for m, ts, msg in cur.fetchall():
            if str(msg).startswith(RESET_EVENT):
                resets[m] = max(float(ts), resets.get(m, float(ts)))
            else:
                drifts[m] = (float(ts), str(msg)[len(GOLDEN_DRIFT_EVENT) + 2:])
        return resets, {m: msg for m, (ts, msg) in drifts.items() if ts > resets.get(m, -1.0)}

    def golden_drift(self, module: str) -> str | None:
        """The module's newest failed golden check since its last reset (``fleetctl devices reset``), or None."""
        reset = self.last_module_reset(module)
        row = self.db.execute("SELECT message FROM events WHERE run_id='' AND module=? AND message LIKE ? AND ts > ?"
                              " ORDER BY ts DESC LIMIT 1", (module, f"{GOLDEN_DRIFT_EVENT}%",
                                                              -1.0 if reset is None else reset)).fetchone()
        return None if row is None else str(row[0])[len(GOLDEN_DRIFT_EVENT) + 2:]

    def events(self, run_id: str) -> list[tuple[str, float, str]]:
        cur = self.db.execute("SELECT module, ts, message FROM events WHERE run_id=? ORDER BY ts", (run_id,))
        return [(str(m), float(t), str(msg)) for m, t, msg in cur.fetchall()]

    def progress(self, run_id: str) -> dict[str, RunProgress]:
        cur = self.db.execute("SELECT module, progress FROM module_runs WHERE run_id=? ORDER BY module",
                              (run_id,))
        return {m: RunProgress.model_validate_json(p) for m, p in cur.fetchall()}

    def progress_json(self, run_id: str) -> list[tuple[str, str]]:
        """(module, its progress as stored JSON) of the run: what a sync pass compares with its last reading
        before it parses any (an unchanged record is not parsed again)."""
        cur = self.db.execute("SELECT module, progress FROM module_runs WHERE run_id=? ORDER BY module", (run_id,))
        return [(str(m), str(p)) for m, p in cur.fetchall()]

    def record_sync(self, run_id: str, *, rows: Mapping[str, Iterable[ResultRow]] | None = None,
                    telemetry: Iterable[TelemetrySummary] = (), progress: Iterable[RunProgress] = (),
                    forced: Iterable[RunProgress] = (), events: Iterable[tuple[str, str]] = ()) -> None:
        """What one sync pass of ``run_id`` took, in one transaction: each module's rows become exactly ``rows``
        (:meth:`replace_rows`), telemetry summaries, progress (:meth:`upsert_progress`; ``forced``: with
        ``force``) and events (module, message)."""
        now = time.time()
        with self.tx() as c:
            for module, module_rows in (rows or {}).items():
                data = list(_last_of_each_key(row_to_db(r) for r in module_rows
                                              if r.run_id == run_id and r.module == module))
                c.execute("DELETE FROM rows WHERE run_id=? AND module=?", (run_id, module))
                c.executemany(_INSERT_ROW, data)
            c.executemany("INSERT INTO telemetry (run_id, module, summary) VALUES (?,?,?)"
                          " ON CONFLICT (run_id, module) DO UPDATE SET summary=excluded.summary",
                          [(t.run_id, t.module, t.model_dump_json()) for t in telemetry])
            for ps, force in ((list(progress), False), (list(forced), True)):
                _upsert_progress(c, ps, force)
            c.executemany("INSERT INTO events (run_id, module, ts, message) VALUES (?,?,?,?)",
                          [(run_id, m, now, msg) for m, msg in events])

    # -- rows ---------------------------------------------------------------------------
    def upsert_rows(self, rows: Iterable[ResultRow]) -> int:
        data = list(_last_of_each_key(row_to_db(r) for r in rows))
        if not data:
            return 0
        # rowcount: the rows' own changes (total_changes would count the triggers' too)
        with self.tx() as c:
            return c.executemany(_INSERT_ROW, data).rowcount

    def upsert_row_values(self, values: Iterable[tuple[Any, ...]]) -> int:
        """Rows given as their stored values (``ROW_FIELDS`` order, as :func:`row_to_db` gives them: JSON fields
        as text, booleans as 0/1), in one transaction, without a ``ResultRow`` each: a bulk load (the benches'
        millions of rows). The last of each key wins, as in :meth:`upsert_rows`."""
        data = list(_last_of_each_key(values))
        if not data:
            return 0
        with self.tx() as c:
            return c.executemany(_INSERT_ROW, data).rowcount

    def replace_rows(self, run_id: str, module: str, rows: Iterable[ResultRow]) -> int:
        """The module's rows of the run become exactly ``rows`` (rows of superseded attempts go), atomically."""
        data = list(_last_of_each_key(row_to_db(r) for r in rows if r.run_id == run_id and r.module == module))
        with self.tx() as c:
            c.execute("DELETE FROM rows WHERE run_id=? AND module=?", (run_id, module))
            c.executemany(_INSERT_ROW, data)
        return len(data)

    def rows(self, run_id: str, module: str | None = None, source: str | None = "release") -> list[ResultRow]:
        """Rows of a run: the release's own (default), the agent's probe's (``source="probe"``) or all (None)."""
        q = f"SELECT {_ROW_COLUMNS} FROM rows WHERE run_id=?"
        args: tuple[Any, ...] = (run_id,)
        if source:
            q += " AND source=?"
            args += (source,)
        if module:
            q += " AND module=?"
            args += (module,)
        q += f" ORDER BY module, model_key, {self.db.insert_order}"
        return [row_from_db(r) for r in self.db.execute(q, args).fetchall()]

    def row_count(self, run_id: str) -> int:
        """The release's rows of a run (the probe's rows beside them are not counted)."""
        return int(self.db.execute("SELECT COUNT(*) FROM rows WHERE run_id=? AND source='release'",
                                   (run_id,)).fetchone()[0])

    # -- baselines ----------------------------------------------------------------------
    def add_baseline(self, release: str, rows: Iterable[ResultRow], source: str) -> tuple[int, str]:
        """Store rows as the next baseline version of ``release``; returns (version, run id)."""
        with self.tx() as c:
            (last,) = c.execute("SELECT COALESCE(MAX(version), 0) FROM baselines WHERE release=?",
                                (release,)).fetchone()
            version = int(last) + 1
            run_id = f"baseline:{release}:v{version}"
            c.execute("INSERT INTO baselines (release, version, run_id, source, created_at) VALUES (?,?,?,?,?)",
                      (release, version, run_id, source, time.time()))
            c.execute("INSERT INTO runs (run_id, created_at, release, kind, state, note)"
                      " VALUES (?,?,?,?,?,?) ON CONFLICT DO NOTHING",
                      (run_id, time.time(), release, "baseline", "done", source))
        self.upsert_rows(r.model_copy(update={"run_id": run_id, "release": release}) for r in rows)
        return version, run_id

    def baseline_run_id(self, spec: str | None = None, release: str | None = None) -> str | None:
        """``spec``: None (latest of ``release``, else latest of any), '1.4.1', '1.4.1@v2' or a run id."""
        if spec and self.run(spec):
            return spec
        rel, ver = (spec.split("@v", 1) + [None])[:2] if spec else (release, None)
        q = "SELECT run_id FROM baselines"
        args: tuple[Any, ...] = ()
        if rel:
            q += " WHERE release=?"
            args = (rel,)
            if ver:
                q += " AND version=?"
                args += (int(ver),)
        q += " ORDER BY created_at DESC, version DESC LIMIT 1"
        r = self.db.execute(q, args).fetchone()
        return str(r[0]) if r else None

    def baselines(self) -> list[dict[str, Any]]:
        cur = self.db.execute("SELECT release, version, run_id, source, created_at FROM baselines"
                              " ORDER BY release, version")
        cols = [c[0] for c in cur.description]
        return [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]

    # -- device telemetry -----------------------------------------------------------------
    def upsert_telemetry(self, summary: TelemetrySummary) -> None:
        with self.tx() as c:
            c.execute("INSERT INTO telemetry (run_id, module, summary) VALUES (?,?,?)"
                      " ON CONFLICT (run_id, module) DO UPDATE SET summary=excluded.summary",
                      (summary.run_id, summary.module, summary.model_dump_json()))

    def telemetry(self, run_id: str) -> dict[str, TelemetrySummary]:
        """module -> the device telemetry summary of its part of ``run_id`` (modules without one left out)."""
        cur = self.db.execute("SELECT module, summary FROM telemetry WHERE run_id=? ORDER BY module", (run_id,))
        return {m: TelemetrySummary.model_validate_json(raw) for m, raw in cur.fetchall()}

    # -- environment fingerprints -------------------------------------------------------------
    def fingerprints(self, run_id: str) -> dict[str, EnvFingerprint]:
        """module -> the environment it measured ``run_id`` in (modules that sent none left out)."""
        cur = self.db.execute("SELECT module, record FROM fingerprints WHERE run_id=? ORDER BY module", (run_id,))
        return {m: EnvFingerprint.model_validate_json(raw) for m, raw in cur.fetchall()}

    def fingerprints_by_digest(self, digests: Iterable[str]) -> dict[str, EnvFingerprint]:
        """digest -> its record, from whichever run recorded it (digests no run recorded left out)."""
        wanted = sorted(set(digests))
        if not wanted:
            return {}
        marks = ",".join("?" * len(wanted))
        cur = self.db.execute(f"SELECT digest, MIN(record) FROM fingerprints WHERE digest IN ({marks})"
                              " GROUP BY digest", wanted)
        return {d: EnvFingerprint.model_validate_json(raw) for d, raw in cur.fetchall()}


_KEY_AT = tuple(ROW_FIELDS.index(k) for k in _ROWS_KEY)


def _upsert_progress(c: Database, progress: list[RunProgress], force: bool) -> None:
    """:meth:`History.upsert_progress_many` inside the transaction ``c``."""
    where = "" if force else " WHERE excluded.updated_at >= module_runs.updated_at"
    values = [(p.run_id, p.module, p.state.value, p.updated_at, p.model_dump_json()) for p in progress]
    prints = [(p.run_id, p.module, p.fingerprint.digest(), p.fingerprint.model_dump_json()) for p in progress
              if p.fingerprint is not None]
    c.executemany("INSERT INTO fingerprints (run_id, module, digest, record) VALUES (?,?,?,?)"
                  " ON CONFLICT (run_id, module) DO UPDATE SET digest=excluded.digest, record=excluded.record",
                  prints)
    c.executemany("INSERT INTO module_runs (run_id, module, state, updated_at, progress) VALUES (?,?,?,?,?)"
                  " ON CONFLICT (run_id, module) DO UPDATE SET state=excluded.state,"
                  " updated_at=excluded.updated_at, progress=excluded.progress" + where, values)


def _last_of_each_key(values: Iterable[tuple[Any, ...]]) -> Iterator[tuple[Any, ...]]:
    """Rows' values with one per key, the last given (as a replace of each in turn would leave them)."""
    return iter({tuple(v[i] for i in _KEY_AT): v for v in values}.values())
