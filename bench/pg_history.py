"""The run history on SQLite and on PostgreSQL side by side (ADR 0031): a bulk load of an ended run's rows, its
first read into the report's frame (from the rows, writing its column file) and the next (from the column file),
and a small write transaction (a run's note), each on both engines in one run of this script.

PostgreSQL is a server of the script's own (tests/support/postgres_server.py: Debian's postgresql 15, fsync off
as in the tests). Run: ``.venv/bin/python bench/pg_history.py [ROWS ...]`` (default 100000).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.tables import parse_seed
from bench.report import stored_values  # bench/report.py, this script's folder: how its histories are filled
from controller.history import History
from controller.report.synth import fleet, rows_frame
from tests.conftest import _seed_path
from tests.support.postgres_server import postgres_server

if TYPE_CHECKING:
    import pandas as pd


def values(ref: pd.DataFrame, rows: int, run_id: str) -> list[tuple]:
    """A synthetic run's rows as either engine stores them (NaN as NULL, ``correct`` as 0/1)."""
    return stored_values(fleet(ref, modules=[f"m{i:05d}" for i in range(max(6, round(rows / len(ref))))], seed=1,
                               run_id=run_id))


def measure(where: str | Path, data: list[tuple], run_id: str) -> dict[str, float]:
    h = History(where)
    h.create_run(run_id, state="running")
    t = time.perf_counter()
    h.upsert_row_values(data)
    load = time.perf_counter() - t
    h.set_run_state(run_id, "done", "pass")
    t = time.perf_counter()
    first = h.row_frame([run_id])
    read1 = time.perf_counter() - t
    t = time.perf_counter()
    again = h.row_frame([run_id])
    read2 = time.perf_counter() - t
    assert len(first) == len(again) == len(data)
    t = time.perf_counter()
    for i in range(200):
        h.set_run_note(run_id, f"note {i}")
    write = (time.perf_counter() - t) / 200
    h.close()
    return {"load_s": load, "first_read_s": read1, "file_read_s": read2, "write_tx_ms": write * 1e3}


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [100_000]
    ref = rows_frame([r for rs in parse_seed(_seed_path().read_text(encoding="utf-8")).values() for r in rs])
    with tempfile.TemporaryDirectory() as d, postgres_server() as pg:
        for n in sizes:
            data = values(ref, n, f"bench-{n}")
            got = {"sqlite": measure(Path(d) / f"h{n}.sqlite", data, f"bench-{n}"),
                   "postgresql": measure(pg.fresh_database(), data, f"bench-{n}")}
            print(f"{len(data):,} rows | " + " | ".join(f"{k}" for k in got["sqlite"]))
            for engine, m in got.items():
                print(f"  {engine:10s} " + " | ".join(f"{v:8.3f}" for v in m.values()))
            print("  pg/sqlite  " + " | ".join(f"{got['postgresql'][k] / got['sqlite'][k]:8.2f}" for k in m))


if __name__ == "__main__":
    main()
