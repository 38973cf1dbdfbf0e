"""SQL runs in ``controller/history/`` only: no other controller module executes a statement or imports sqlite3.

Walks the sources with ``ast`` (nothing imported): outside the history package a call of ``.execute(``,
``.executemany(``, ``.executescript(``, of any ``read_sql*`` (pandas), or an import of ``sqlite3`` or ``psycopg``
(the PostgreSQL driver) fails the test, naming the file and line. The history's methods are where a new query goes.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONTROLLER = ROOT / "controller"
HISTORY = CONTROLLER / "history"
SQL_CALLS = {"execute", "executemany", "executescript"}
DRIVERS = {"sqlite3", "psycopg"}


def _called(node: ast.Call) -> str | None:
    f = node.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None


def sql_outside_history() -> list[str]:
    found: list[str] = []
    for path in sorted(CONTROLLER.rglob("*.py")):
        if path.is_relative_to(HISTORY):
            continue
        where = path.relative_to(ROOT)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Call):
                name = _called(node)
                if name in SQL_CALLS or (name or "").startswith("read_sql"):
                    found.append(f"{where}:{node.lineno}: calls {name}()")
            elif isinstance(node, ast.Import):
                found += [f"{where}:{node.lineno}: imports {a.name}" for a in node.names
                          if a.name.split(".")[0] in DRIVERS]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in DRIVERS:
                found.append(f"{where}:{node.lineno}: imports from {node.module}")
    return found


def test_sql_runs_in_the_history_package_only() -> None:
    assert HISTORY.is_dir()
    assert sql_outside_history() == []


def test_the_walk_sees_the_history_s_own_sql() -> None:
    """The check is not vacuous: the history package itself does all of these."""
    text = "\n".join(p.read_text(encoding="utf-8") for p in HISTORY.rglob("*.py"))
    for needle in ("import sqlite3", "import psycopg", ".execute(", ".executemany(", ".executescript("):
        assert needle in text
