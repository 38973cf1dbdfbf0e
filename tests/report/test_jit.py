"""Kernels compiled while measuring in reports (controller.report.jit): the note, the JSON, Markdown and HTML, from
rows stored in a real history (and rows from before the field)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pandas as pd

from contract.records import ResultRow
from controller.history import History
from controller.report import build_report
from controller.report.jit import jit_compiled, jit_note
from controller.report.model import JitCompiled
from controller.report.render import to_json, to_markdown
from controller.report.render.html import to_html
from controller.report.synth import fleet
from tests.support.frames import frame_to_rows

MODULES = [f"m{i:02d}" for i in range(4)]
NOTE = "kernels compiled while measuring: qwen35 — 3 (m01), the figures include compile time"


def _lazy(r: ResultRow) -> ResultRow:
    """m01's qwen35 benchmark compiled 3 kernels (every release row of the key says so)."""
    if (r.module, r.model_key) != ("m01", "qwen35"):
        return r
    return r.model_copy(update={"jit_kernels": 3, "jit_first_s": 0.4,
                                "jit_kernel_names": "a/kernel_lib.so; b/kernel_lib.so; c/kernel_lib.so"})


def test_the_report_names_the_key_that_compiled_while_measuring(tmp_path: Path, reference: pd.DataFrame) -> None:
    ref = reference[reference["model_key"] == "qwen35"]  # one key: a fast-tier report
    df = fleet(ref, modules=MODULES, seed=1, run_id="run-1", release="1.4.1")
    h = History(tmp_path / "history.sqlite")
    try:
        h.create_run("run-1", release="1.4.1", models=["qwen35"], modules=MODULES)
        h.upsert_rows(_lazy(r) for r in frame_to_rows(df))
        h.set_run_state("run-1", "done")
        time.sleep(0.01)
        rep = build_report(h, "run-1", previous=False)
    finally:
        h.close()
    assert rep.jit_compiled == (JitCompiled(model_key="qwen35", kernels=3, modules=("m01",), names=(
        "a/kernel_lib.so", "b/kernel_lib.so", "c/kernel_lib.so")),)
    assert rep.notes[0] == NOTE and sum(n == NOTE for n in rep.notes) == 1
    assert f"- {NOTE}" in to_markdown(rep)
    assert NOTE in to_html(rep)
    data = json.loads(to_json(rep))
    assert data["jit_compiled"] == [{"model_key": "qwen35", "kernels": 3, "modules": ["m01"],
                                     "names": ["a/kernel_lib.so", "b/kernel_lib.so", "c/kernel_lib.so"]}]
    assert NOTE in data["notes"]


def test_counts_add_up_over_modules_and_probe_rows_and_old_rows_count_none() -> None:
    frame = pd.DataFrame({
        "model_key": ["qwen35", "qwen35", "qwen35", "qwen3vl", "qwen3", "qwen3"],
        "module": ["m1", "m1", "m2", "m3", "m1", "m2"],
        "source": ["release", "release", "release", "release", "probe", "release"],
        "jit_kernels": [3, 3, 1, 2, 5, None],
        "jit_kernel_names": ["a.so; b.so; c.so", "a.so; b.so; c.so", "d.so", "e.so; f.so", "x.so", None],
    })
    found = jit_compiled(frame)
    assert found == (JitCompiled(model_key="qwen35", kernels=4, modules=("m1", "m2"),
                                 names=("a.so", "b.so", "c.so", "d.so")),
                     JitCompiled(model_key="qwen3vl", kernels=2, modules=("m3",), names=("e.so", "f.so")))
    assert jit_note(found) == ("kernels compiled while measuring: qwen35 — 4 (m1, m2), qwen3vl — 2 (m3), "
                               "the figures include compile time")
    assert jit_compiled(frame.drop(columns=["jit_kernels", "jit_kernel_names"])) == ()
    # text as the history reads it (categoricals, compared on their codes), and a category of no row: the same
    as_read = frame.astype({"source": pd.CategoricalDtype(["probe", "release", "stale"]), "module": "category"})
    assert jit_compiled(as_read) == found
    assert jit_compiled(as_read.assign(source=pd.Categorical(["probe"] * 6, categories=["probe"]))) == ()
    assert jit_compiled(frame.assign(jit_kernels=0)) == () and jit_note(()) == ""


def test_rows_of_a_history_from_before_the_fields_read_back_with_none_compiled(tmp_path: Path) -> None:
    """An older history gains the columns (NULL in its rows); those rows read back as compiling nothing."""
    import sqlite3

    from controller.history import ROW_FIELDS

    path = tmp_path / "old.sqlite"
    old = [f for f in ROW_FIELDS if not f.startswith("jit_")]
    conn = sqlite3.connect(path)
    conn.executescript(f"CREATE TABLE rows ({', '.join(repr(f) for f in old)}, PRIMARY KEY (run_id, module,"
                       " model_key, profile, source));")
    conn.execute("INSERT INTO rows (schema_version, run_id, module, model_key, \"table\", profile, model, extra, "
                 "flags, source) VALUES (1, 'run-0', 'm00', 'qwen3', 'sweep', '128:128', 'm', '{}', '[]', 'release')")
    conn.commit()
    conn.close()
    h = History(path)
    try:
        (row,) = h.rows("run-0")
    finally:
        h.close()
    assert (row.jit_kernels, row.jit_kernel_names, row.jit_first_s) == (0, "", None)
