"""The release's benchmark against the agent's probe: rows split by source, figures that disagree.

Probe rows never enter the verdict: they are only compared with the release's rows of the same
module, key and profile.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from contract.vocab import CAPACITY_PREFIX, COMPARED, Capacity, Disagreement, ProbeInterval
from controller.report.analysis.frame import IDS
from controller.report.model import profile_key


def split_sources(df: pd.DataFrame | None) -> tuple[pd.DataFrame | None, pd.DataFrame | None]:
    """(rows the release's benchmark measured, rows the agent's probe measured); frames without a
    ``source`` column are all the release's."""
    if df is None or "source" not in df.columns:
        return df, None
    # a missing source: the release's
    probe = (df["source"] == "probe").to_numpy(dtype=bool, na_value=False)
    if not probe.any():
        return df, None
    return df[~probe].reset_index(drop=True), df[probe].reset_index(drop=True)


# agent.probe.compare.FLAG: the agent judged the row against measured noise
FLAG = "release_benchmark_disagrees"
BASE = {"ttft_ms": "ttft_ms", "prefill_tps": "ttft_ms", "tpot_ms": "tpot_ms", "decode_tps": "tpot_ms"}


def _extra(value: object) -> dict[str, str]:
    if isinstance(value, dict):
        return value
    try:
        out = json.loads(value) if isinstance(value, str) and value else {}
    except ValueError:
        return {}
    return out if isinstance(out, dict) else {}


def _flagged(value: object) -> bool:
    if isinstance(value, str):
        return FLAG in value
    try:
        return FLAG in list(value)  # type: ignore[call-overload]
    except TypeError:
        return False


def probe_disagreements(rows: pd.DataFrame, probe: pd.DataFrame | None,
                        tol: float) -> tuple[tuple[Disagreement, ...], int]:
    """Figures of release rows outside the band of the probe row of the same (module, key, profile); and how
    many release rows have a probe row. The band is the one the agent measured (``probe_band_<figure>`` in the
    probe row's extra: the noise of both clients), and then only rows the agent flagged count (it may have
    explained a difference, agent.probe.compare); probe rows from before: ``tol``, relative."""
    ids = list(IDS)
    if probe is None or not len(probe) or not len(rows):
        return (), 0
    metrics = [m for m in COMPARED if m in rows.columns and m in probe.columns]
    left = rows[ids + metrics + [c for c in ("flags",) if c in rows.columns]].astype({c: str for c in ids})
    right = probe[ids + metrics + [c for c in ("extra",) if c in probe.columns]].astype({c: str for c in ids})
    both = left.merge(right.drop_duplicates(ids), on=ids, suffixes=("", "__probe"))
    extras = [_extra(x) for x in both["extra"]] if "extra" in both.columns else [{} for _ in range(len(both))]
    flagged = np.array([_flagged(x) for x in both["flags"]] if "flags" in both.columns else [False] * len(both),
                       dtype=bool)
    found: list[Disagreement] = []
    for m in metrics:
        a = pd.to_numeric(both[m], errors="coerce").to_numpy(dtype=float)
        b = pd.to_numeric(both[f"{m}__probe"], errors="coerce").to_numpy(dtype=float)
        band = np.array([_num(e.get(f"probe_band_{BASE[m]}")) for e in extras], dtype=float)
        judged = ~np.isnan(band)
        limit = np.where(judged, band, tol)
        with np.errstate(invalid="ignore", divide="ignore"):
            change = a / b - 1
            hit = (a > 0) & (b > 0) & (np.abs(change) > limit) & (~judged | flagged)
        for i in np.flatnonzero(hit):
            found.append(Disagreement(module=str(both["module"].iat[i]), model_key=str(both["model_key"].iat[i]),
                                      profile=str(both["profile"].iat[i]), metric=m, release=float(a[i]),
                                      probe=float(b[i]), change=float(change[i]),
                                      noise=float(band[i]) if judged[i] else None))
    order = {m: i for i, m in enumerate(COMPARED)}
    found.sort(key=lambda d: (d.model_key, d.module, profile_key(d.profile), order[d.metric]))
    return tuple(found), len(both)


def capacities(probe: pd.DataFrame | None) -> tuple[Capacity, ...]:
    """The SLO sweep's rows (profile ``capacity:<profile>``): each module's capacity at SLO, by key and module."""
    if probe is None or not len(probe) or "profile" not in probe.columns:
        return ()
    sel = probe[probe["profile"].astype(str).str.startswith(CAPACITY_PREFIX)]
    out: list[Capacity] = []
    for r in sel.itertuples(index=False):  # one per module and key
        extra = r.extra if isinstance(r.extra, dict) else json.loads(r.extra or "{}")

        def num(name: str, extra: dict[str, str] = extra) -> float | None:
            try:
                return float(extra[name])
            except (KeyError, ValueError):
                return None

        batch = pd.to_numeric(pd.Series([r.batch]), errors="coerce").iat[0]
        out.append(Capacity(module=str(r.module), model_key=str(r.model_key),
                            profile=str(r.profile)[len(CAPACITY_PREFIX):], slo=str(extra.get("sweep_slo", "")),
                            concurrency=None if pd.isna(batch) else int(batch), output_tps=num("output_tps"),
                            request_rps=num("request_rps"), ttft_p90_ms=num("ttft_p90_ms"),
                            tpot_p90_ms=num("tpot_p90_ms"), stop=str(extra.get("sweep_stop", "")),
                            levels=str(extra.get("sweep_levels", ""))))
    out.sort(key=lambda c: (c.model_key, profile_key(c.profile), c.module))
    return tuple(out)


def _num(text: object) -> float:
    try:
        return float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return float("nan")


def probe_intervals(probe: pd.DataFrame | None) -> tuple[ProbeInterval, ...]:
    """The 95 % intervals of probe rows measured over several rounds (``probe_repeat``; ``<figure>_ci95`` in
    their extra), by key, profile, module and figure."""
    if probe is None or not len(probe) or "extra" not in probe.columns:
        return ()
    out: list[ProbeInterval] = []
    for r in probe[~probe["profile"].astype(str).str.startswith(CAPACITY_PREFIX)].itertuples(index=False):
        extra = _extra(r.extra)
        repeats = extra.get("probe_repeats", "")
        for name, value in extra.items():
            low, _, high = str(value).partition(",")
            if not name.endswith("_ci95") or not repeats.isdigit() or math.isnan(_num(low) + _num(high)):
                continue
            out.append(ProbeInterval(module=str(r.module), model_key=str(r.model_key), profile=str(r.profile),
                                     figure=name.removesuffix("_ci95"), low=_num(low), high=_num(high),
                                     repeats=int(repeats)))
    out.sort(key=lambda x: (x.model_key, profile_key(x.profile), x.module, x.figure))
    return tuple(out)
