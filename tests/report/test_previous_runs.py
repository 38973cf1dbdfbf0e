"""Which run a report compares each module with (issue 46 item 6): golden checks are never another run's previous run.

A nightly of release 1.4.3 after a scheduled golden check (release 1.4.1) on the same modules is compared with the
nightly before it (1.4.2), not with the golden release; a golden check's previous run is the module's earlier check
of its release, not the nightly between them. Through a real run history (SQLite; the query is the same on
PostgreSQL: tests/history/test_engines.py).
"""

from __future__ import annotations

import time

import pandas as pd

from controller.history import History
from controller.report import build_report
from controller.report.synth import fleet
from tests.support.frames import frame_to_rows

MODULES = ["m00", "m01", "m02"]


def _run(h: History, reference: pd.DataFrame, run_id: str, release: str, note: str = "") -> None:
    h.create_run(run_id, release=release, models=["qwen3"], modules=MODULES)
    if note:
        h.set_run_note(run_id, note)
    df = fleet(reference, modules=MODULES, seed=len(run_id), run_id=run_id)
    h.upsert_rows(frame_to_rows(df[df["model_key"] == "qwen3"].assign(release=release)))
    h.set_run_state(run_id, "done")
    time.sleep(0.002)


def test_a_nightly_after_a_golden_check_is_compared_with_the_nightly_before(reference: pd.DataFrame,
                                                                            tmp_path) -> None:
    h = History(tmp_path / "history.sqlite")
    try:
        _run(h, reference, "golden-a", "1.4.1", "golden check 1.4.1")
        _run(h, reference, "nightly-1", "1.4.2")
        _run(h, reference, "golden-b", "1.4.1", "golden check 1.4.1")
        _run(h, reference, "nightly-2", "1.4.3")
        assert build_report(h, "nightly-2").previous_ids == ("nightly-1",)
        assert build_report(h, "golden-b").previous_ids == ("golden-a",)
        assert build_report(h, "nightly-1").previous_ids == ()  # its modules' only earlier run: a golden check
    finally:
        h.close()
