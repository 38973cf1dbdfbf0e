"""A run history of 12 releases with a planted change (the trend tests of the API, the report, the webhook
and the metrics share it)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pandas as pd

from controller.history import History
from controller.report.synth import fleet
from tests.support.frames import frame_to_rows

MODULES = ["m00", "m01", "m02"]


def add_release(h: History, reference: pd.DataFrame, i: int, **change: Any) -> str:
    """Run ``run-{i}`` of release ``1.{i}.0``: qwen3 on 3 modules, 1 % noise (``change``: fleet()'s keywords)."""
    ref = reference[reference["model_key"] == "qwen3"]
    rel = f"1.{i}.0"
    df = fleet(ref, modules=3, noise=0.01, seed=i, run_id=f"run-{i}", release=rel, **change)
    h.create_run(f"run-{i}", release=rel, models=["qwen3"], modules=MODULES)
    h.upsert_rows(frame_to_rows(df))
    h.set_run_state(f"run-{i}", "done")
    time.sleep(0.002)
    return f"run-{i}"


def release_history(path: Path | str, reference: pd.DataFrame, releases: int = 12, at: int = 6,
                    **change: Any) -> History:
    """Releases 1.0.0 .. 1.{releases-1}.0 of qwen3; ``change`` from release ``at`` on."""
    h = History(path)
    for i in range(releases):
        add_release(h, reference, i, **(change if i >= at else {}))
    return h
