"""A run's rows read column-wise (controller.history.frames): from its column file or from SQLite, the same frame
as the report read before (one ``read_sql_query``, text made categoricals) and the same report; a stale, torn or
damaged file never taken for the run's rows; ``migrate_columns`` of a history written before column files."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from contract.records import ResultRow
from controller.history import GOLDEN_DRIFT_EVENT, ROW_FIELDS, FrameCache, History
from controller.history.columns import TMP_MARK, file_name
from controller.report import Thresholds, analyse, build_report
from controller.report.load import _compact, concat_compact, read_rows
from controller.report.render import rows_with_baseline, to_json, to_markdown
from controller.report.synth import fleet
from tests.support.frames import frame_to_rows

MODULES = [f"m{i:02d}" for i in range(7)]
RUNS: tuple[tuple[str, int, dict[tuple[str, str], float]], ...] = (
    ("run-a", 1, {}), ("run-b", 2, {("qwen3", "decode_tps"): 0.08}))


def _fill(h: History, reference: pd.DataFrame, seed_rows: list[ResultRow]) -> None:
    h.add_baseline("1.4.1", seed_rows, "seed")
    for run_id, seed, regress in RUNS:
        h.create_run(run_id, release="1.4.2", modules=MODULES)
        h.upsert_rows(frame_to_rows(fleet(reference, modules=MODULES, module_factor={"m03": 0.88}, regress=regress,
                                          seed=seed, run_id=run_id)))
        h.set_run_state(run_id, "done")


@pytest.fixture(scope="module")
def template(reference: pd.DataFrame, seed_rows: list[ResultRow], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A history of a baseline and two ended runs (7 modules x 92 rows), no column file yet."""
    path = tmp_path_factory.mktemp("template") / "history.sqlite"
    h = History(path)
    _fill(h, reference, seed_rows)
    h.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    h.close()
    return path


@pytest.fixture
def history(template: Path, tmp_path: Path):
    shutil.copyfile(template, tmp_path / "history.sqlite")
    h = History(tmp_path / "history.sqlite")
    yield h
    h.close()


def _old_read(h: History, run_id: str) -> pd.DataFrame:
    """The frame as the report read it before column files: one ``read_sql_query``, text made categoricals."""
    cols = ", ".join(f'"{f}"' for f in ROW_FIELDS)
    raw = pd.read_sql_query(f"SELECT {cols} FROM rows WHERE run_id IN (?)", h.conn, params=[run_id])
    return concat_compact([_compact(raw)], ROW_FIELDS)


def _files(h: History) -> list[str]:
    folder = h.columns_folder
    assert folder is not None
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def test_first_read_of_an_ended_run_writes_its_file_and_both_reads_equal_the_old_one(history: History) -> None:
    old = _old_read(history, "run-b")
    assert _files(history) == []
    from_sqlite = read_rows(history, ["run-b"])
    (gen,) = history.conn.execute("SELECT gen FROM row_generations WHERE run_id='run-b'").fetchone()
    assert gen == 7 * 92 and _files(history) == [file_name("run-b", gen)]
    from_file = read_rows(history, ["run-b"])
    pd.testing.assert_frame_equal(from_sqlite, old, check_exact=True)
    pd.testing.assert_frame_equal(from_file, old, check_exact=True)
    text = [c for c in old.columns if isinstance(old[c].dtype, pd.CategoricalDtype)]
    assert {"module", "model_key", "profile", "flags", "prediction"} <= set(text)
    assert all(from_file[c].cat.categories.is_monotonic_increasing for c in text)


def test_report_from_column_files_equals_report_from_the_old_read(history: History) -> None:
    old = analyse(_old_read(history, "run-b"), run_id="run-b", baseline=_old_read(history, "baseline:1.4.1:v1"),
                  previous=_old_read(history, "run-a"))
    for _ in range(2):  # the first read from SQLite (writing the files), the second from the files
        got = analyse(read_rows(history, ["run-b"]), run_id="run-b", baseline=read_rows(history, ["baseline:1.4.1:v1"]),
                      previous=read_rows(history, ["run-a"]))
        assert got.verdict == "regressed" and [o.module for o in got.outliers] == ["m03"]
        assert to_json(got) == to_json(old)
        assert to_markdown(got) == to_markdown(old)
        pd.testing.assert_frame_equal(got.summary, old.summary, check_exact=True)
        assert rows_with_baseline(got).to_csv(index=False) == rows_with_baseline(old).to_csv(index=False)
    assert len(_files(history)) == 3


def test_several_runs_and_model_keys_read_as_one_frame(history: History, reference: pd.DataFrame) -> None:
    read_rows(history, ["run-a", "run-b"])  # both files written
    got = read_rows(history, ["run-a", "run-b"], model_keys=["qwen3"])
    old = pd.concat([_old_read(history, r) for r in ("run-a", "run-b")])
    old = old[old["model_key"] == "qwen3"]
    assert len(got) == len(old) == 2 * len(MODULES) * int((reference["model_key"] == "qwen3").sum())
    assert sorted(got["module"].cat.categories) == list(got["module"].cat.categories) == MODULES
    for c in ("run_id", "module", "profile", "decode_tps", "ttft_ms"):
        assert sorted(map(str, got[c])) == sorted(map(str, old[c])), c


def test_a_running_run_is_read_from_sqlite_and_gets_no_file(history: History) -> None:
    history.set_run_state("run-b", "running")
    pd.testing.assert_frame_equal(read_rows(history, ["run-b"]), _old_read(history, "run-b"), check_exact=True)
    assert _files(history) == []


def test_rows_changed_after_the_file_was_written_are_read_from_sqlite(history: History) -> None:
    read_rows(history, ["run-b"])
    first = _files(history)
    (before,) = history.conn.execute("SELECT gen FROM row_generations WHERE run_id='run-b'").fetchone()
    row = history.rows("run-b", "m00")[0]
    history.upsert_rows([row.model_copy(update={"decode_tps": 1.0})])  # a late rewrite of one row
    got = read_rows(history, ["run-b"])
    assert float(got[(got["module"] == "m00") & (got["model_key"] == row.model_key)
                      & (got["profile"] == row.profile)]["decode_tps"].iloc[0]) == 1.0
    pd.testing.assert_frame_equal(got, _old_read(history, "run-b"), check_exact=True)
    (gen,) = history.conn.execute("SELECT gen FROM row_generations WHERE run_id='run-b'").fetchone()
    # an upsert of a stored row is an update: the trigger counts the row's old and new run
    assert gen == before + 2 and first == [file_name("run-b", before)] and _files(history) == [file_name("run-b", gen)]


FIELDS = ["decode_tps", "run_id", "module", "model_key", "profile"]


def test_a_read_of_some_fields_decodes_them_from_the_current_file_in_the_order_asked(history: History) -> None:
    whole = read_rows(history, ["run-b"])  # from SQLite: the file written
    # the trigger dropped, a value changed behind its back: a read that still gives the old value read the file
    history.conn.execute("DROP TRIGGER rows_generation_update")
    history.conn.execute("UPDATE rows SET decode_tps = -1 WHERE run_id='run-b'")
    got = read_rows(history, ["run-b"], only=FIELDS)
    assert list(got.columns) == FIELDS and (got["decode_tps"] > 0).all()
    pd.testing.assert_frame_equal(got, whole[FIELDS], check_exact=True)
    with pytest.raises(ValueError, match=r"not a field of the rows: \['decode_tsp'\]"):
        read_rows(history, ["run-b"], only=["decode_tsp"])


def test_a_read_of_some_fields_from_a_damaged_file_reads_sqlite(history: History) -> None:
    read_rows(history, ["run-b"])
    folder = history.columns_folder
    assert folder is not None
    (path,) = folder.iterdir()
    data = path.read_bytes()
    path.write_bytes(data[:1000] + bytes([data[1000] ^ 0xFF]) + data[1001:])
    got = read_rows(history, ["run-b"], only=FIELDS)
    pd.testing.assert_frame_equal(got, _old_read(history, "run-b")[FIELDS], check_exact=True)
    assert path.read_bytes() == data  # written again, whole, of every field


@pytest.mark.parametrize("damage", ["truncated", "byte flipped", "removed"])
def test_a_torn_or_damaged_file_is_never_taken_for_the_rows(history: History, damage: str) -> None:
    read_rows(history, ["run-b"])
    folder = history.columns_folder
    assert folder is not None
    (path,) = folder.iterdir()
    data = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "byte flipped":
        path.write_bytes(data[:1000] + bytes([data[1000] ^ 0xFF]) + data[1001:])
    else:
        path.unlink()
    pd.testing.assert_frame_equal(read_rows(history, ["run-b"]), _old_read(history, "run-b"), check_exact=True)
    assert path.read_bytes() == data  # written again, whole


def test_migrate_a_history_written_before_column_files(history: History, tmp_path: Path) -> None:
    """A history as today's code on main leaves it (no generations, files or triggers): migrated, every row and
    every verdict the same; a second migration writes nothing."""
    history.conn.executescript("DROP TRIGGER rows_generation_insert; DROP TRIGGER rows_generation_delete;"
                               " DROP TRIGGER rows_generation_update;"
                               " DROP TABLE row_generations; DROP TABLE row_files;")
    history.close()
    h = History(tmp_path / "history.sqlite")
    runs = ["baseline:1.4.1:v1", "run-a", "run-b"]
    before = {r: _old_read(h, r) for r in runs}
    verdict = to_json(build_report(h, "run-b"))  # against the baseline and run-a
    shutil.rmtree(tmp_path / "history.sqlite.columns")  # the reports wrote files: start the migration from none
    done = h.migrate_columns()
    assert (done.written, done.current, done.running, done.abandoned) == (3, 0, 0, 0)
    assert len(_files(h)) == 3
    for r in runs:
        pd.testing.assert_frame_equal(read_rows(h, [r]), before[r], check_exact=True)
    assert to_json(build_report(h, "run-b")) == verdict
    again = h.migrate_columns()
    assert (again.written, again.current, again.running) == (0, 3, 0)
    h.close()


def test_migrate_removes_a_temporary_file_of_a_killed_writer_and_never_reads_it(history: History) -> None:
    folder = history.columns_folder
    assert folder is not None
    folder.mkdir()
    dead = folder / f"{file_name('run-b', 644)}{TMP_MARK}999999999"  # no such process
    dead.write_bytes(b"half a file")
    done = history.migrate_columns()
    assert (done.written, done.abandoned) == (3, 1) and not dead.exists()
    pd.testing.assert_frame_equal(read_rows(history, ["run-b"]), _old_read(history, "run-b"), check_exact=True)


def test_a_history_in_memory_reads_its_rows_from_sqlite(reference: pd.DataFrame, seed_rows: list[ResultRow]) -> None:
    h = History(":memory:")
    _fill(h, reference, seed_rows)
    assert h.columns_folder is None and not Path(":memory:.columns").exists()
    pd.testing.assert_frame_equal(read_rows(h, ["run-b"]), _old_read(h, "run-b"), check_exact=True)
    assert h.migrate_columns().written == 0
    h.close()


@pytest.mark.slow
def test_a_migration_killed_part_way_leaves_no_run_taken_for_whole_and_the_next_finishes(
        reference: pd.DataFrame, tmp_path: Path) -> None:
    """``fleetctl history migrate`` in a real process, SIGKILLed once some files are written: every recorded file
    is whole, the runs without one read from SQLite; the next migration writes the rest; every row compared."""
    import os
    import signal
    import subprocess
    import sys
    import time

    path = tmp_path / "history.sqlite"
    h = History(path)
    runs = [f"run-{i:03d}" for i in range(80)]
    for i, run_id in enumerate(runs):
        h.create_run(run_id, release="1.4.2", modules=MODULES, state="done")
        h.upsert_rows(frame_to_rows(fleet(reference, modules=MODULES, seed=i, run_id=run_id)))
    h.close()
    env = {**os.environ, "FLEET_HISTORY": str(path)}
    proc = subprocess.Popen([sys.executable, "-m", "controller", "history", "migrate"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    folder = tmp_path / "history.sqlite.columns"
    deadline = time.monotonic() + 60
    while not (folder.is_dir() and len(list(folder.glob("*.arrow"))) >= 5):
        assert proc.poll() is None and time.monotonic() < deadline, "the migration ended before it was killed"
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    h = History(path)
    recorded = h.conn.execute("SELECT COUNT(*) FROM row_files").fetchone()[0]
    # a file is renamed into place, then recorded: the kill may fall between the 5th file and its record
    assert 4 <= recorded < len(runs)
    for run_id in runs:  # whatever the kill left: every run reads whole (its file, or SQLite)
        assert len(read_rows(h, [run_id])) == len(MODULES) * len(reference)
    shutil.rmtree(folder)  # and once more from the state the kill left, files and all
    h.close()
    proc = subprocess.Popen([sys.executable, "-m", "controller", "history", "migrate"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not (folder.is_dir() and len(list(folder.glob("*.arrow"))) >= 3):
        assert proc.poll() is None and time.monotonic() < deadline, "the migration ended before it was killed"
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    h = History(path)
    done = h.migrate_columns()
    assert done.written + done.current == len(runs) and done.running == 0 and done.written > 0
    assert len(list(folder.glob("*.arrow"))) == len(runs) and not list(folder.glob(f"*{TMP_MARK}*"))
    for run_id in runs:
        pd.testing.assert_frame_equal(read_rows(h, [run_id]), _old_read(h, run_id), check_exact=True)
    h.close()


def test_modules_with_rows_come_from_the_file_record_while_it_is_current(history: History) -> None:
    """The previous-run lookup's modules: recorded with a current file (no scan of rows), from the rows once a
    module's rows went (the generation moved); the same pairs either way."""
    def pairs() -> list[tuple[str, str]]:
        return sorted(map(tuple, history.modules_of_rows(["run-a", "run-b"]).to_numpy().tolist()))

    from_rows = pairs()
    assert from_rows == [(r, m) for r in ("run-a", "run-b") for m in MODULES]
    read_rows(history, ["run-a", "run-b"])
    recorded = dict(history.conn.execute("SELECT run_id, modules FROM row_files").fetchall())
    assert recorded == {r: '["' + '", "'.join(MODULES) + '"]' for r in ("run-a", "run-b")}
    assert pairs() == from_rows
    history.replace_rows("run-b", "m06", [])  # m06's rows of run-b go: the record is stale
    assert pairs() == [(r, m) for r in ("run-a", "run-b") for m in MODULES if (r, m) != ("run-b", "m06")]


def test_distinct_sorted_of_a_categorical_equals_the_sorted_set_of_its_values() -> None:
    from controller.report.load import distinct_sorted

    col = pd.Series(pd.Categorical(["m2", "m0", "m2", "m10"], categories=["m0", "m1", "m10", "m2"]))
    assert distinct_sorted(col) == sorted(set(col)) == ["m0", "m10", "m2"]  # m1: a category of no row
    assert distinct_sorted(pd.Series(["b", "a", "b"])) == ["a", "b"]
    assert distinct_sorted(pd.Series(pd.Categorical([], categories=["a"]))) == []


# --------------------------------------------------------------------------- frames kept (fleetctl serve)
def _kept(history: History, max_bytes: int = 1 << 30) -> FrameCache:
    history.frames = FrameCache(max_bytes)
    return history.frames


def test_a_kept_frame_is_the_frame_its_files_give_and_a_change_to_it_never_reaches_the_kept_one(
        history: History) -> None:
    cache = _kept(history)
    first = read_rows(history, ["run-b"])  # from SQLite, the file written: not kept (no file when it began)
    assert (cache.hits, cache.misses, cache.bytes) == (0, 0, 0)
    second = read_rows(history, ["run-b"])  # from the file: kept
    assert (cache.hits, cache.misses) == (0, 1) and cache.bytes > 0
    third = read_rows(history, ["run-b"])
    assert (cache.hits, cache.misses) == (1, 1)
    for got in (second, third):
        pd.testing.assert_frame_equal(got, first, check_exact=True)
    third["decode_tps"] = -1.0  # a caller's change (copy-on-write): not the kept frame's
    third.loc[0, "ttft_ms"] = -1.0
    pd.testing.assert_frame_equal(read_rows(history, ["run-b"]), first, check_exact=True)


def test_a_kept_frame_is_keyed_by_the_runs_files_the_fields_and_the_model_keys(history: History) -> None:
    cache = _kept(history)
    read_rows(history, ["run-a", "run-b"])  # the files written
    asks = [dict(run_ids=["run-a", "run-b"]), dict(run_ids=["run-b"]), dict(run_ids=["run-b"], only=FIELDS),
            dict(run_ids=["run-b"], only=FIELDS[::-1]), dict(run_ids=["run-b"], model_keys=["qwen3"])]
    for ask in asks:
        read_rows(history, **ask)
    assert (cache.hits, cache.misses) == (0, len(asks))
    for ask in asks:
        got = read_rows(history, **ask)
        assert list(got.columns) == list(ask.get("only", ROW_FIELDS))
        assert set(got["run_id"]) == set(ask["run_ids"])
    assert (cache.hits, cache.misses) == (len(asks), len(asks))


def test_rows_changed_after_a_frame_was_kept_are_read_again(history: History) -> None:
    cache = _kept(history)
    read_rows(history, ["run-b"])
    read_rows(history, ["run-b"])  # kept
    row = history.rows("run-b", "m00")[0]
    history.upsert_rows([row.model_copy(update={"decode_tps": 1.0})])  # a late rewrite: another generation
    got = read_rows(history, ["run-b"])  # from SQLite (the file written again), never the kept frame
    pd.testing.assert_frame_equal(got, _old_read(history, "run-b"), check_exact=True)
    assert (cache.hits, cache.misses) == (0, 1)
    again = read_rows(history, ["run-b"])  # the new file's frame: kept under its own record
    assert (cache.hits, cache.misses) == (0, 2)
    pd.testing.assert_frame_equal(again, got, check_exact=True)


def test_a_running_run_is_never_kept(history: History) -> None:
    cache = _kept(history)
    history.set_run_state("run-b", "running")
    for _ in range(2):
        read_rows(history, ["run-b"])
    assert (cache.hits, cache.misses, cache.bytes) == (0, 0, 0)


def test_kept_frames_stay_within_their_bytes_the_least_recently_used_going_first(history: History) -> None:
    read_rows(history, ["run-a", "run-b"])
    one = int(read_rows(history, ["run-a"]).memory_usage(index=True, deep=False).sum())
    every_key = sorted(set(read_rows(history, ["run-a"])["model_key"]))  # the same rows, under another key
    cache = _kept(history, max_bytes=int(one * 2.5))  # room for two frames of one run
    for run, keys in (("run-a", None), ("run-b", None), ("run-a", None), ("run-a", every_key), ("run-b", None)):
        read_rows(history, [run], model_keys=keys)
        assert cache.bytes <= cache.max_bytes
    # run-a was used after run-b, so run-b went when the third frame came; run-a went when run-b came back
    assert (cache.hits, cache.misses) == (1, 4)
    read_rows(history, ["run-a"], model_keys=every_key)
    read_rows(history, ["run-a"])
    assert (cache.hits, cache.misses) == (2, 5)
    small = _kept(history, max_bytes=one // 2)  # a frame larger than the whole cache is not kept
    read_rows(history, ["run-a"])
    assert small.bytes == 0


def _report_text(history: History, run: str = "run-b", **kw: Any) -> tuple[str, str]:
    rep = build_report(history, run, **kw)
    return to_json(rep), to_markdown(rep)


@pytest.mark.slow  # over the fast tier's 2 s CPU budget with a neighbour on the other core
def test_a_kept_analysis_gives_the_report_made_without_one_and_what_is_read_fresh_stays_fresh(
        history: History) -> None:
    plain = _report_text(history)  # no cache: the files written
    lenient = _report_text(history, thresholds=Thresholds(tolerance=0.5))
    cache = _kept(history)
    assert _report_text(history) == plain and cache.recalled == 0
    assert _report_text(history) == plain and cache.recalled == 1
    assert _report_text(history, thresholds=Thresholds(tolerance=0.5)) == lenient and cache.recalled == 1
    assert _report_text(history, thresholds=Thresholds(tolerance=0.5)) == lenient and cache.recalled == 2
    assert '"verdict": "regressed"' in plain[0] and '"verdict": "pass"' in lenient[0]
    # notes read each time: a module's golden drift recorded after the analysis was kept
    history.add_module_event("m01", f"{GOLDEN_DRIFT_EVENT}: decode 5 % worse")
    drifted = _report_text(history)
    assert cache.recalled == 3 and "module m01 failed its golden check" in drifted[1]
    history.frames = None
    assert _report_text(history) == drifted


@pytest.mark.slow  # over the fast tier's 2 s CPU budget with a neighbour on the other core
def test_a_kept_analysis_is_never_given_for_changed_inputs(history: History) -> None:
    _report_text(history)  # the files written
    cache = _kept(history)
    _report_text(history)
    # the previous run's rows change: its file's record changes, and so does the key
    row = history.rows("run-a", "m00")[0]
    assert row.decode_tps is not None
    history.upsert_rows([row.model_copy(update={"decode_tps": row.decode_tps * 3})])
    _report_text(history)  # run-a read from SQLite (its file written again): nothing kept, nothing recalled
    got = _report_text(history)
    assert cache.recalled == 0
    history.frames = None
    assert got == _report_text(history)
    # the run's own record changes (its state)
    history.frames = cache
    history.set_run_state("run-b", "failed")
    failed = _report_text(history)
    assert cache.recalled == 0 and '"verdict": "failed"' in failed[0]
    history.frames = None
    assert failed == _report_text(history)
    # a running run gaining rows: read from SQLite (no current file), never kept
    history.frames = cache
    history.set_run_state("run-b", "running")
    row = history.rows("run-b", "m00")[0]
    assert row.decode_tps is not None
    for factor in (2, 3):
        history.upsert_rows([row.model_copy(update={"decode_tps": row.decode_tps * factor})])
        got = _report_text(history)
        assert cache.recalled == 0 and history.frame_key(["run-b"]) is None
    history.frames = None
    assert got == _report_text(history)


def test_kept_analyses_count_in_the_same_bytes_as_the_frames(history: History) -> None:
    _report_text(history)  # the files written
    one = int(read_rows(history, ["run-b"]).memory_usage(index=True, deep=False).sum())
    cache = _kept(history, max_bytes=one * 4)  # the analysis (the run's rows, its summary...) fits, frames go
    for _ in range(2):
        _report_text(history)
    assert cache.recalled == 1 and cache.bytes <= cache.max_bytes
    tight = _kept(history, max_bytes=one // 2)  # the analysis holds the run's rows: larger than this, not kept
    for _ in range(2):
        _report_text(history)
    assert tight.recalled == 0 and tight.bytes <= tight.max_bytes


def test_some_modules_of_a_file_are_the_rows_of_those_modules_decompressing_their_batches_only(
        history: History, monkeypatch: pytest.MonkeyPatch) -> None:
    """ADR 0043: each module's previous run of a run of a few modules is read without the rest of a fleet-wide run."""
    import controller.history.columns as columns

    monkeypatch.setattr(columns, "FILE_BATCH_ROWS", 92)  # a batch a module (7 modules x 92 rows): files of 7
    whole = read_rows(history, ["run-a"])  # written now, from SQLite, in batches of 92 rows
    some = ["m05", "m01"]
    expected = whole[whole["module"].astype(str).isin(some)].reset_index(drop=True)
    decoded: list[int] = []
    import pyarrow.ipc as ipc

    real = ipc.RecordBatchFileReader.get_batch

    def counted(self: ipc.RecordBatchFileReader, i: int):
        got = real(self, i)
        decoded.append(got.num_columns)
        return got

    monkeypatch.setattr(ipc.RecordBatchFileReader, "get_batch", counted)
    got = read_rows(history, ["run-a"], modules=some).reset_index(drop=True)
    pd.testing.assert_frame_equal(got, expected)
    assert sorted(n for n in decoded if n > 1) == [len(ROW_FIELDS)] * 2  # every field of 2 batches of 7
    # no file store: SQLite's rows, of those modules too
    monkeypatch.setattr(History, "column_store", property(lambda _: None))
    other = read_rows(history, ["run-b"], modules=some)
    assert sorted(set(other["module"].astype(str))) == sorted(some) and len(other) == 2 * 92
