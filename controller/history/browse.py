"""The run browser's reads (``fleetctl serve``'s pages, :mod:`controller.serve.pages.data`): single indexed or
bounded statements, so a page costs the same whether the history holds ten runs or ten thousand. A base of
:class:`controller.history.History`; the pages hold no SQL (``tests/unit/test_sql_boundary.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from controller.history.records import GOLDEN_NOTE, RunInfo

if TYPE_CHECKING:
    from controller.history.db import Cursor, Database


@dataclass(frozen=True)
class RunsWhere:
    """Which runs (kind 'run') a list shows, each field '' / None for any: ``verdict`` 'none' for not judged;
    ``module`` a name the run was sent to; ``since``/``until``/``before``: created at or after, before, before."""

    release: str = ""
    verdict: str = ""
    state: str = ""
    user: str = ""
    module: str = ""
    since: float | None = None
    until: float | None = None
    before: float | None = None

    def clause(self) -> tuple[str, list[Any]]:
        """The WHERE clause and its parameters (pure)."""
        where: list[str] = ["kind='run'"]
        args: list[Any] = []
        for col, v in (("release", self.release), ("state", self.state), ("started_by", self.user)):
            if v:
                where.append(f"{col}=?")
                args.append(v)
        if self.verdict == "none":
            where.append("verdict IS NULL")
        elif self.verdict:
            where.append("verdict=?")
            args.append(self.verdict)
        # the runs' modules are a JSON list of names: the name in quotes, LIKE's wildcards escaped
        if self.module:
            esc = self.module.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_").replace('"', "")
            where.append("modules LIKE ? ESCAPE '\\'")
            args.append(f'%"{esc}"%')
        for op, at in ((">=", self.since), ("<", self.until), ("<", self.before)):
            if at is not None:
                where.append(f"created_at {op} ?")
                args.append(at)
        return " AND ".join(where), args


class BrowseQueries:
    """The pages' reads, a base of :class:`controller.history.History`."""

    db: Database

    if TYPE_CHECKING:
        @staticmethod
        def _run_info(cur: Cursor, r: tuple[Any, ...]) -> RunInfo: ...

    def _infos(self, sql: str, args: Sequence[Any]) -> list[RunInfo]:
        cur = self.db.execute(sql, list(args))
        return [self._run_info(cur, r) for r in cur.fetchall()]

    def runs_where(self, w: RunsWhere, limit: int) -> list[RunInfo]:
        """The runs ``w`` selects, newest first, at most ``limit``."""
        where, args = w.clause()
        return self._infos(f"SELECT * FROM runs WHERE {where} ORDER BY created_at DESC LIMIT ?", [*args, limit])

    def runs_of(self, run_ids: Sequence[str], *, kind_run: bool = False) -> list[RunInfo]:
        """The runs of ``run_ids`` the history holds (``kind_run``: validations only), in no order."""
        if not run_ids:
            return []
        marks = ",".join("?" * len(run_ids))
        kind = "kind='run' AND " if kind_run else ""
        return self._infos(f"SELECT * FROM runs WHERE {kind}run_id IN ({marks})", run_ids)

    def recent_releases(self, limit: int = 200) -> list[str]:
        """The runs' releases, the newest run's first."""
        return [str(r[0]) for r in self.db.execute(
            "SELECT release FROM runs WHERE kind='run' AND release != '' GROUP BY release"
            " ORDER BY MAX(created_at) DESC LIMIT ?", (limit,)).fetchall()]

    def run_users(self, limit: int = 200) -> list[str]:
        """Who started runs (sorted)."""
        return sorted(str(r[0]) for r in self.db.execute(
            "SELECT DISTINCT started_by FROM runs WHERE started_by != '' LIMIT ?", (limit,)).fetchall())

    def golden_runs(self, recent: int) -> list[RunInfo]:
        """The ``recent`` newest golden checks, newest first."""
        return self._infos("SELECT * FROM runs WHERE note LIKE ? ORDER BY created_at DESC LIMIT ?",
                           [f"{GOLDEN_NOTE}%", recent])

    def module_progress(self, module: str, limit: int) -> list[tuple[str, str]]:
        """(run id, progress JSON) of the module's ``limit`` newest parts (the ``(module, updated_at)`` index)."""
        return [(str(r), str(p)) for r, p in self.db.execute(
            "SELECT run_id, progress FROM module_runs WHERE module=? ORDER BY updated_at DESC LIMIT ?",
            (module, limit)).fetchall()]

    def module_log(self, module: str, limit: int = 50) -> list[tuple[float, str, str]]:
        """(ts, run id or '', message) of the module's events and its runs', newest first."""
        return [(float(t), str(r), str(m)) for t, r, m in self.db.execute(
            "SELECT ts, run_id, message FROM events WHERE module=? ORDER BY ts DESC LIMIT ?",
            (module, limit)).fetchall()]

    def release_runs_counted(self, limit: int) -> list[tuple[str, int, float]]:
        """(release, runs, newest run's created_at), the newest release first."""
        return [(str(rel), int(n), float(t)) for rel, n, t in self.db.execute(
            "SELECT release, COUNT(*), MAX(created_at) FROM runs WHERE kind='run' AND release != ''"
            " GROUP BY release ORDER BY MAX(created_at) DESC LIMIT ?", (limit,)).fetchall()]

    def release_verdicts(self, releases: Sequence[str]) -> list[tuple[str, str, str | None]]:
        """(release, run id, verdict) of the validations of ``releases``, newest first."""
        if not releases:
            return []
        marks = ",".join("?" * len(releases))
        return [(str(rel), str(rid), v) for rel, rid, v in self.db.execute(
            f"SELECT release, run_id, verdict FROM runs WHERE kind='run' AND release IN ({marks})"
            " ORDER BY created_at DESC", list(releases)).fetchall()]

    def release_run_infos(self, release: str, limit: int) -> list[RunInfo]:
        """The release's validations, newest first."""
        return self._infos("SELECT * FROM runs WHERE kind='run' AND release=? ORDER BY created_at DESC LIMIT ?",
                           [release, limit])

    def trend_findings_version(self, name: str) -> str | None:
        """The version of the findings kept under ``name`` (None: none), without their body."""
        row = self.db.execute("SELECT version FROM trend_findings WHERE name=?", (name,)).fetchone()
        return None if row is None else str(row[0])
