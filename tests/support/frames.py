"""The seed's reference tables as rows and as a rows frame (fixtures), and a synthetic frame back into rows."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from agent.tables import parse_seed
from contract.records import ResultRow
from controller.report.synth import rows_frame


@pytest.fixture(scope="session")
def seed_rows(seed_text: str) -> list[ResultRow]:
    return [r for rows in parse_seed(seed_text).values() for r in rows]


@pytest.fixture(scope="session")
def reference(seed_rows: list[ResultRow]) -> pd.DataFrame:
    """The seed's reference tables as a rows frame (the baseline, module '')."""
    return rows_frame(seed_rows)


def frame_to_rows(df: pd.DataFrame) -> list[ResultRow]:
    """A synthetic rows frame back into ResultRows (to store it in a real run history)."""
    fields = list(ResultRow.model_fields)
    out = []
    for rec in df[fields].to_dict(orient="records"):
        d = {k: (None if isinstance(v, float) and v != v else v) for k, v in rec.items()}
        d["flags"] = tuple(json.loads(d["flags"].replace("'", '"'))) if d["flags"] else ()
        d["extra"] = {}
        for k in ("prefill_len", "batch", "nchip", "input_tokens", "output_tokens", "prefix_tokens",
                  "measured_output", "prompt_index", "schema_version"):
            if (v := d[k]) is not None:
                d[k] = int(v)
        out.append(ResultRow.model_validate(d))
    return out
