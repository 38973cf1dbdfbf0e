"""Energy figures in the run history (controller.history): stored and read back, and an older history gains the
columns once (fast tier, a real SQLite file)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from contract.energy import EnergyWindow
from contract.records import ResultRow
from controller.history import ROW_FIELDS, History, row_to_db

ENERGY_COLUMNS = ("energy_j", "j_per_token", "tokens_per_j", "avg_power_w", "idle_power_w", "energy_above_idle_j",
                  "energy")

ENERGY = EnergyWindow(source="samples", start=10.0, end=20.0, window_s=10.0, samples=11, period_s=1.0,
                      coverage=1.0, max_gap_s=1.0, output_tokens=250, idle_samples=5)
ROW = ResultRow(run_id="r1", module="m1", model_key="qwen3", table="sweep", profile="128:128", model="Qwen3",
                decode_tps=24.5, output_tokens=100, energy_j=500.0, j_per_token=2.0, tokens_per_j=0.5,
                avg_power_w=50.0, idle_power_w=20.0, energy_above_idle_j=300.0, energy=ENERGY)


def test_energy_figures_round_trip_through_the_history(tmp_path: Path) -> None:
    h = History(tmp_path / "h.sqlite")
    try:
        h.create_run("r1", release="1.4.2", models=("qwen3",), modules=("m1",), state="done")
        plain = ROW.model_copy(update={"profile": "250:250", "energy_j": None, "j_per_token": None,
                                       "tokens_per_j": None, "avg_power_w": None, "idle_power_w": None,
                                       "energy_above_idle_j": None, "energy": None})
        assert h.upsert_rows([ROW, plain]) == 2
        assert h.rows("r1") == [ROW, plain]
    finally:
        h.close()


def test_an_older_history_gains_the_energy_columns_once(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    added = set(ENERGY_COLUMNS)
    old = [f for f in ROW_FIELDS if f not in added]
    conn = sqlite3.connect(path)
    conn.executescript(f"CREATE TABLE rows ({', '.join(repr(f) for f in old)}, "
                       "PRIMARY KEY (run_id, module, model_key, profile, source));")
    bare = ROW.model_copy(update={"energy_j": None, "j_per_token": None, "tokens_per_j": None, "avg_power_w": None,
                                  "idle_power_w": None, "energy_above_idle_j": None, "energy": None})
    conn.execute(f"INSERT INTO rows VALUES ({','.join('?' * len(old))})",
                 [v for f, v in zip(ROW_FIELDS, row_to_db(bare), strict=True) if f not in added])
    conn.commit()
    conn.close()
    h = History(path)
    try:
        cols = [r[1] for r in h.conn.execute("PRAGMA table_info(rows)")]
        assert cols[-len(ENERGY_COLUMNS):] == list(ENERGY_COLUMNS)
        assert h.rows("r1") == [bare]  # the old row: no energy
        assert h.upsert_rows([ROW.model_copy(update={"profile": "250:250"})]) == 1
        assert h.rows("r1")[1].energy == ENERGY and h.rows("r1")[1].j_per_token == 2.0
    finally:
        h.close()
    History(path).close()  # opening it again changes nothing
