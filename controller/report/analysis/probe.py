"""The release's benchmark against the agent's probe: rows split by source, figures that disagree.

Probe rows never enter the verdict: they are only compared with the release's rows of the same
module, key and profile.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from agent.probe.compare import COMPARED, Disagreement
from controller.report.analysis.frame import IDS


def split_sources(df: pd.DataFrame | None) -> tuple[pd.DataFrame | None, pd.DataFrame | None]:
    """(rows the release's benchmark measured, rows the agent's probe measured); frames without a
    ``source`` column are all the release's."""
    if df is None or "source" not in df.columns:
        return df, None
    probe = (df["source"] == "probe").to_numpy(dtype=bool, na_value=False)  # a missing source: the release's
    if not probe.any():
        return df, None
    return df[~probe].reset_index(drop=True), df[probe].reset_index(drop=True)


def probe_disagreements(rows: pd.DataFrame, probe: pd.DataFrame | None,
                        tol: float) -> tuple[tuple[Disagreement, ...], int]:
    """Figures of release rows farther than ``tol`` (relative) from the probe row of the same
    (module, key, profile); and how many release rows have a probe row."""
    ids = list(IDS)
    if probe is None or not len(probe) or not len(rows):
        return (), 0
    metrics = [m for m in COMPARED if m in rows.columns and m in probe.columns]
    both = rows[ids + metrics].astype({c: str for c in ids}).merge(
        probe[ids + metrics].astype({c: str for c in ids}).drop_duplicates(ids), on=ids, suffixes=("", "__probe"))
    found: list[Disagreement] = []
    for m in metrics:
        a = pd.to_numeric(both[m], errors="coerce").to_numpy(dtype=float)
        b = pd.to_numeric(both[f"{m}__probe"], errors="coerce").to_numpy(dtype=float)
        with np.errstate(invalid="ignore", divide="ignore"):
            change = a / b - 1
            hit = (a > 0) & (b > 0) & (np.abs(change) > tol)
        for i in np.flatnonzero(hit):  # findings only
            found.append(Disagreement(module=str(both["module"].iat[i]), model_key=str(both["model_key"].iat[i]),
                                      profile=str(both["profile"].iat[i]), metric=m, release=float(a[i]),
                                      probe=float(b[i]), change=float(change[i])))
    order = {m: i for i, m in enumerate(COMPARED)}
    found.sort(key=lambda d: (d.model_key, d.module, d.profile, order[d.metric]))
    return tuple(found), len(both)
