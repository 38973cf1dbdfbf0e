"""The change points the history keeps of itself: the findings of the detector over every series, computed once per
version of what the series are built from, and read by ``/metrics`` and ``fleetctl trend`` (ADR 0043).

The history does not know what a finding is: it keeps one text (JSON, :mod:`controller.report.kept`) per name,
with the :meth:`TrendFindings.trend_version` it was computed at. A version is a digest of every run's (run_id,
release, created_at, kind) and of the row generations (the triggers count every change of a run's rows, on either
engine): any row stored, replaced or removed, any run added, renamed or removed gives another version.
"""

from __future__ import annotations

import hashlib
import time
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from controller.history.db import Database


class TrendFindings:
    """The kept findings' reads and writes, a base of :class:`controller.history.History`."""

    db: Database

    if TYPE_CHECKING:
        def tx(self) -> AbstractContextManager[Database]: ...

    def trend_version(self) -> str:
        """A digest of what the trend's series are built from (two queries, no row read)."""
        d = hashlib.sha256()
        for run_id, release, created_at, kind in self.db.execute(
                "SELECT run_id, release, created_at, kind FROM runs ORDER BY run_id").fetchall():
            d.update(f"{run_id}\0{release}\0{float(created_at)!r}\0{kind}\n".encode())
        n, total = self.db.execute("SELECT COUNT(*), COALESCE(SUM(gen), 0) FROM row_generations").fetchone()
        d.update(f"gen {int(n)} {int(total)}".encode())
        return d.hexdigest()[:32]

    def release_count(self) -> int:
        """How many releases (not '') the history's runs (kind 'run') are of: an upper bound on the length of every
        trend series (a series has one value per release)."""
        row = self.db.execute("SELECT COUNT(DISTINCT release) FROM runs WHERE kind='run' AND release != ''").fetchone()
        return int(row[0]) if row else 0

    def trend_findings(self, name: str) -> tuple[str, str] | None:
        """(version, body) of the findings kept under ``name`` (None: none kept)."""
        row = self.db.execute("SELECT version, body FROM trend_findings WHERE name=?", (name,)).fetchone()
        return (str(row[0]), str(row[1])) if row else None

    def keep_trend_findings(self, name: str, version: str, body: str) -> None:
        """Keep ``body`` under ``name`` as the findings at ``version`` (replacing what was kept)."""
        with self.tx() as c:
            c.execute("INSERT INTO trend_findings (name, version, computed_at, body) VALUES (?,?,?,?)"
                      " ON CONFLICT (name) DO UPDATE SET version=excluded.version, computed_at=excluded.computed_at,"
                      " body=excluded.body", (name, version, time.time(), body))

    def forget_trend_findings(self) -> None:
        """Drop every kept finding (the next reader computes them again)."""
        with self.tx() as c:
            c.execute("DELETE FROM trend_findings")
