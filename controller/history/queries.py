"""The run history's aggregate reads: what module states, the controller's metrics and reports ask of it.

Each is one query the history answers for a caller elsewhere in the controller (the fleet's
failure streaks and sync, ``/metrics``, the report's pandas frames), so that SQL runs in this
package only. pandas is imported by the report's reads alone, when they are called.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from controller.history.records import GOLDEN_NOTE, HistoryStopped, HistoryUnavailable

if TYPE_CHECKING:
    import pandas as pd

    from controller.history.db import Database

# what a read of a history that cannot be read raises (metrics: history down): SQLite's errors, and a PostgreSQL
# history's server gone, or a statement it stopped (controller.history.db translates psycopg's)
DatabaseError: tuple[type[Exception], ...] = (sqlite3.Error, HistoryUnavailable, HistoryStopped)


class HistoryQueries:
    """The aggregate reads, a base of :class:`controller.history.History`."""

    db: Database

    # -- the fleet ----------------------------------------------------------------------
    def module_parts(self, module: str, limit: int) -> list[tuple[str, float | None]]:
        """(progress JSON, the run's created_at) of the module's parts of runs it was sent (``attempt`` not 0),
        newest first, at most ``limit``."""
        cur = self.db.execute(
            "SELECT m.progress, r.created_at FROM module_runs m LEFT JOIN runs r ON r.run_id = m.run_id"
            " WHERE m.module=? AND COALESCE(CAST(m.progress ->> 'attempt' AS INTEGER), 1) != 0"
            " ORDER BY m.updated_at DESC LIMIT ?", (module, limit))
        return cur.fetchall()

    def release_row_count(self, run_id: str, module: str) -> int:
        """The release's rows of the module's part of a run (the probe's rows beside them are not counted)."""
        return int(self.db.execute(
            "SELECT COUNT(*) FROM rows WHERE run_id=? AND module=? AND source='release'",
            (run_id, module)).fetchone()[0])

    def release_row_counts(self, run_id: str, modules: Sequence[str]) -> dict[str, int]:
        """:meth:`release_row_count` of each of ``modules`` (those without rows: 0), in one query per 500."""
        out = dict.fromkeys(modules, 0)
        for i in range(0, len(modules), 500):
            part = modules[i:i + 500]
            cur = self.db.execute(
                f"SELECT module, COUNT(*) FROM rows WHERE run_id=? AND source='release'"
                f" AND module IN ({','.join('?' * len(part))}) GROUP BY module", (run_id, *part))
            out.update((str(m), int(n)) for m, n in cur.fetchall())
        return out

    def power_cycle_counts(self) -> dict[tuple[str, str], int]:
        """(module, result) -> the power cycles the recovery policy asked for (``controller.fleet.power``'s module
        events): result ``done`` (its PDU answered) or ``failed`` (it did not: the module needed attention)."""
        cur = self.db.execute(
            "SELECT module, CASE WHEN message LIKE ? THEN 'done' ELSE 'failed' END AS result, COUNT(*) FROM events"
            " WHERE run_id='' AND (message LIKE ? OR message LIKE ?) GROUP BY module, result",
            ("power-cycled%", "power-cycled%", "needs attention%"))
        return {(str(m), str(r)): int(n) for m, r, n in cur.fetchall()}

    def passed_last(self) -> set[str]:
        """The modules whose newest ended part (done or cancelled, its newest by ``updated_at``) has no failure in
        it (not the word "failed"): their failed runs in a row are none, whatever came before or runs now. One
        query for every module, on the ``(module, updated_at)`` index."""
        cur = self.db.execute(
            "SELECT m.module, m.state IN ('done', 'cancelled') AND CAST(m.progress AS TEXT) NOT LIKE '%failed%'"
            " FROM module_runs m JOIN (SELECT module, MAX(updated_at) AS u FROM module_runs"
            " WHERE state IN ('done', 'failed', 'cancelled', 'lost') GROUP BY module) n"
            " ON n.module = m.module AND n.u = m.updated_at WHERE m.state IN ('done', 'failed', 'cancelled', 'lost')")
        clean: dict[str, bool] = {}
        for module, ok in cur.fetchall():
            # two parts ended at once: both must have passed
            clean[module] = clean.get(module, True) and bool(ok)
        return {m for m, ok in clean.items() if ok}

    def recent_parts(self, modules: Sequence[str], limit: int) -> dict[str, list[tuple[str, str | None, float | None]]]:
        """module -> (state, progress JSON, the run's created_at) of its ``limit`` newest parts of runs it was sent
        (``attempt`` not 0: only a failed part can be one never sent), newest first: :meth:`module_parts` of many
        modules, each by the ``(module, updated_at)`` index. The progress only where a failure can be read in it
        (state failed or lost, or the word "failed" in it), else None: most parts passed, and their JSON is most of
        what the query would carry."""
        q = ("SELECT m.state, CASE WHEN m.state IN ('failed', 'lost') OR CAST(m.progress AS TEXT) LIKE '%failed%'"
             " THEN m.progress END, r.created_at FROM module_runs m LEFT JOIN runs r ON r.run_id = m.run_id"
             " WHERE m.module=? AND (m.state != 'failed'"
             " OR COALESCE(CAST(m.progress ->> 'attempt' AS INTEGER), 1) != 0) ORDER BY m.updated_at DESC LIMIT ?")
        return {m: self.db.execute(q, (m, limit)).fetchall() for m in modules}

    def running_runs(self) -> list[str]:
        """Run ids of the runs (kind 'run') not ended."""
        cur = self.db.execute("SELECT run_id FROM runs WHERE kind='run' AND state='running'")
        return [r[0] for r in cur.fetchall()]

    def waits(self, run_id: str | None = None) -> list[tuple[str, str, str, float]]:
        """(run id, module, priority, seconds it waited): from its last dispatch (``runs.dispatched_at``, else
        ``created_at``) to the module's start (``started_at`` of its progress, the module's clock), of every part
        a module started (of ``run_id`` only, when given), oldest run first. A start before the last dispatch
        (an earlier delivery's, before a resume) is no wait of that dispatch: left out."""
        where = " AND m.run_id=?" if run_id is not None else ""
        cur = self.db.execute(
            "SELECT m.run_id, m.module, r.priority, s - d FROM (SELECT run_id, module,"
            " CAST(progress ->> 'started_at' AS DOUBLE PRECISION) AS s FROM module_runs) m"
            " JOIN (SELECT run_id, priority, created_at, COALESCE(dispatched_at, created_at) AS d FROM runs"
            "       WHERE kind='run') r ON r.run_id = m.run_id"
            f" WHERE s IS NOT NULL AND s >= d{where} ORDER BY r.created_at, m.module",
            (run_id,) if run_id is not None else ())
        return [(a, b, c, float(w)) for a, b, c, w in cur.fetchall()]

    def ran_before(self, module: str, since: float, until: float, exclude: str) -> str | None:
        """The run whose part on ``module`` ended last between ``since`` and ``until`` (the module's clock), other
        than ``exclude``: what a run dispatched at ``since`` and started at ``until`` waited behind."""
        row = self.db.execute(
            "SELECT run_id FROM module_runs WHERE module=? AND run_id != ?"
            " AND CAST(progress ->> 'finished_at' AS DOUBLE PRECISION) BETWEEN ? AND ?"
            " ORDER BY CAST(progress ->> 'finished_at' AS DOUBLE PRECISION) DESC LIMIT 1",
            (module, exclude, since, until)).fetchone()
        return str(row[0]) if row else None

    # -- metrics --------------------------------------------------------------------------
    def verdict_counts(self) -> list[tuple[Any, int]]:
        """(verdict, or 'none' when not judged; how many runs of kind 'run')."""
        cur = self.db.execute("SELECT COALESCE(verdict, 'none'), COUNT(*) FROM runs WHERE kind='run' GROUP BY 1")
        return cur.fetchall()

    def modules_with_rows(self, run_id: str) -> list[Any]:
        """The modules that have rows (of any source) in a run."""
        mods = self.db.execute("SELECT DISTINCT module FROM rows WHERE run_id=?", (run_id,))
        return [module for (module,) in mods.fetchall()]

    def stored_row_count(self, run_id: str, module: str) -> int:
        """Every row of the module's part of a run, of any source."""
        (n,) = self.db.execute("SELECT COUNT(*) FROM rows WHERE run_id=? AND module=?",
                               (run_id, module)).fetchone()
        return int(n)

    # -- reports (pandas) --------------------------------------------------------------------
    def runs_before(self, created_at: float, run_id: str, limit: int, *, note: str | None = None) -> pd.DataFrame:
        """(run_id, created_at) of the newest ``limit`` runs (kind 'run') created before ``created_at``,
        ``run_id`` left out; newest first. Those of ``note`` only (a golden check's: the earlier checks of its
        release); without one, every run but the golden checks (their note starts with :data:`GOLDEN_NOTE`)."""
        import pandas as pd

        golden = GOLDEN_NOTE + " "
        which, arg = ("note = ?", note) if note is not None else (f"substr(note, 1, {len(golden)}) <> ?", golden)
        cur = self.db.execute(
            f"SELECT run_id, created_at FROM runs WHERE kind='run' AND created_at < ? AND run_id != ? AND {which}"
            " ORDER BY created_at DESC LIMIT ?", (created_at, run_id, arg, limit))
        return pd.DataFrame(cur.fetchall(), columns=["run_id", "created_at"])

    def modules_of_rows(self, run_ids: Sequence[str]) -> pd.DataFrame:
        """(run_id, module) for each module that has rows in one of the given runs: from the modules recorded with a
        run's column file made at the run's generation (no scan of its rows), else from the rows."""
        import pandas as pd

        marks = ",".join("?" * len(run_ids))
        recorded = dict(self.db.execute(
            "SELECT f.run_id, f.modules FROM row_files f LEFT JOIN row_generations g ON g.run_id = f.run_id"
            f" WHERE f.run_id IN ({marks}) AND f.gen = COALESCE(g.gen, 0) AND f.modules IS NOT NULL",
            list(run_ids)).fetchall())
        pairs = [(r, m) for r, mods in recorded.items() for m in json.loads(mods)]
        rest = [r for r in run_ids if r not in recorded]
        if rest:
            pairs += self.db.execute(f"SELECT run_id, module FROM rows WHERE run_id IN ({','.join('?' * len(rest))})"
                                     " GROUP BY run_id, module", rest).fetchall()
        return pd.DataFrame(pairs, columns=["run_id", "module"])
