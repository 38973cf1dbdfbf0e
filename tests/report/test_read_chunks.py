"""Rows read from a real SQLite history in chunks give the same frame and the same report as one read."""

from __future__ import annotations

import pandas as pd
import pytest

from contract.records import ResultRow
from controller.history import ROW_FIELDS, History
from controller.report import analyse
from controller.report.load import read_rows
from controller.report.render import rows_with_baseline, to_json, to_markdown
from controller.report.synth import fleet
from tests.support.frames import frame_to_rows

MODULES = [f"m{i:02d}" for i in range(7)]


@pytest.fixture(scope="module")
def history(reference: pd.DataFrame, seed_rows: list[ResultRow], tmp_path_factory: pytest.TempPathFactory):
    h = History(tmp_path_factory.mktemp("chunks") / "history.sqlite")
    h.add_baseline("1.4.1", seed_rows, "seed")
    for run_id, seed, regress in (("run-a", 1, {}), ("run-b", 2, {("qwen3", "decode_tps"): 0.08})):
        h.create_run(run_id, release="1.4.2", modules=MODULES)
        h.upsert_rows(frame_to_rows(fleet(reference, modules=MODULES, module_factor={"m03": 0.88}, regress=regress,
                                          seed=seed, run_id=run_id)))
    yield h
    h.close()


def _one_read(h: History, run_id: str) -> pd.DataFrame:
    """The rows as a single ``read_sql_query`` gives them (how the report read them before chunks)."""
    cols = ", ".join(f'"{f}"' for f in ROW_FIELDS)
    return pd.read_sql_query(f"SELECT {cols} FROM rows WHERE run_id IN (?)", h.conn, params=[run_id])


def _texts(col: pd.Series) -> list[str | None]:
    return [None if v is None or v != v else str(v) for v in col.astype(object)]


@pytest.mark.parametrize("chunk", [13, 200, 10**6])
def test_chunked_read_is_one_frame(history: History, chunk: int) -> None:
    """Chunk boundaries anywhere (some chunks without any MTP or vision figure, i.e. all-NULL number
    columns) give the same frame as one chunk, and the same values and dtypes' kinds as one read."""
    got = read_rows(history, ["run-b"], chunk_rows=chunk)
    whole = read_rows(history, ["run-b"], chunk_rows=10**6)
    pd.testing.assert_frame_equal(got, whole, check_exact=True)
    raw = _one_read(history, "run-b")
    assert list(got.columns) == list(raw.columns) and len(got) == len(raw) == 7 * 92
    text = [c for c in got.columns if isinstance(got[c].dtype, pd.CategoricalDtype)]
    assert {"module", "model_key", "profile", "flags", "prediction"} <= set(text)
    for c in got.columns:
        if c in text:
            assert _texts(got[c]) == _texts(raw[c]), c
        else:
            pd.testing.assert_series_equal(got[c].astype(float), pd.to_numeric(raw[c]).astype(float),
                                           check_exact=True, check_names=False)


def test_report_from_chunks_equals_report_from_one_read(history: History) -> None:
    base = read_rows(history, ["baseline:1.4.1:v1"], chunk_rows=50)
    chunked = analyse(read_rows(history, ["run-b"], chunk_rows=50), run_id="run-b", baseline=base,
                      previous=read_rows(history, ["run-a"], chunk_rows=50))
    one = analyse(_one_read(history, "run-b"), run_id="run-b", baseline=_one_read(history, "baseline:1.4.1:v1"),
                  previous=_one_read(history, "run-a"))
    assert chunked.verdict == "regressed" and [o.module for o in chunked.outliers] == ["m03"]
    assert to_json(chunked) == to_json(one)
    assert to_markdown(chunked) == to_markdown(one)
    pd.testing.assert_frame_equal(chunked.summary, one.summary, check_exact=True)
    assert rows_with_baseline(chunked).to_csv(index=False) == rows_with_baseline(one).to_csv(index=False)
