"""Probe results as result rows, and the cross-check against the release's own rows (pure).

A probe row has the identity of the release's row of the same profile (run, module, model
key, profile) with ``source="probe"``; its figures follow the seed's definitions from the
probe's medians: ``ttft_ms`` = TTFT p50, ``tpot_ms`` = TPOT p50, ``prefill_tps`` =
prefill_len / TTFT, ``decode_tps`` = 1000 / TPOT. A release row whose figure differs from
the probe's by more than the tolerance (relative to the probe's) gets the flag
``release_benchmark_disagrees``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from agent.probe.records import ProfileResult, Stat
from agent.probe.sweep import SweepResult
from contract.records import ResultRow
from contract.vocab import CAPACITY_PREFIX
from contract.vocab import COMPARED as COMPARED  # re-exported
from contract.vocab import Disagreement as Disagreement

FLAG = "release_benchmark_disagrees"
DEFAULT_TOLERANCE = 0.05


def _fmt(v: float | None) -> str:
    return "" if v is None else f"{v:.6g}"


def _extra(r: ProfileResult, tolerance: float) -> dict[str, str]:
    out = {"probe_requests": str(r.requests), "probe_ok": str(r.ok), "probe_load": r.load.label,
           "probe_api": r.api, "probe_tolerance": f"{tolerance:g}", "probe_time_scale": f"{r.time_scale:g}",
           "probe_engine_fields": "yes" if r.engine_fields else "no", "probe_cache": r.cache}
    if r.errors:
        out["probe_errors"] = ",".join(f"{k}={v}" for k, v in sorted(r.errors.items()))
    stats: tuple[tuple[str, Stat | None], ...] = (("ttft", r.ttft_ms), ("tpot", r.tpot_ms), ("itl", r.itl_ms),
                                                  ("e2e", r.e2e_ms))
    for name, s in stats:
        if s is not None:
            out.update({f"{name}_p50_ms": _fmt(s.p50), f"{name}_p90_ms": _fmt(s.p90), f"{name}_p99_ms": _fmt(s.p99)})
    if r.repeats > 1:
        out["probe_repeats"] = str(r.repeats)
    for name, iv in r.intervals.items():
        out[f"{name}_ci95"] = f"{_fmt(iv.low)},{_fmt(iv.high)}"
    for name, v in (("output_tps", r.output_throughput_tps), ("request_rps", r.request_throughput_rps),
                    ("goodput_rps", r.goodput_rps), ("tokens_per_chunk", r.tokens_per_chunk),
                    ("accept_length", r.accept_length)):
        if v is not None:
            out[name] = _fmt(v)
    return out


def probe_row(r: ProfileResult, like: ResultRow | None = None, *, tolerance: float = DEFAULT_TOLERANCE) -> ResultRow:
    """The probe's row for one profile, with the identity (and descriptive columns) of ``like``."""
    ttft = r.ttft_ms.p50 if r.ttft_ms else None
    tpot = r.tpot_ms.p50 if r.tpot_ms else None
    ids: dict[str, object] = {"model": "probe"}
    if like is not None:
        ids = {k: getattr(like, k) for k in ("run_id", "module", "release", "model_key", "model", "size", "ctx_k",
                                             "nchip")}
    return ResultRow(
        **ids,  # type: ignore[arg-type]
        source="probe", table="sweep", profile=r.profile,
        prefill_len=r.prefill_len, batch=r.load.concurrency or 1, input_tokens=r.input_len,
        output_tokens=r.output_len, ttft_ms=ttft, tpot_ms=tpot,
        prefill_tps=r.prefill_len / ttft * 1000 if ttft else None, decode_tps=1000 / tpot if tpot else None,
        prefix_tokens=round(r.cached_tokens) if r.cached_tokens is not None else None,
        measured_output=round(r.output_tokens / r.ok) if r.ok else None, extra=_extra(r, tolerance),
        flags=("probe_errors",) if r.errors else (),
    )


def disagreements(release: ResultRow, probe: ResultRow, tolerance: float = DEFAULT_TOLERANCE) -> list[Disagreement]:
    """The figures of ``release`` farther than ``tolerance`` from the probe's (relative to the probe's)."""
    out: list[Disagreement] = []
    for m in COMPARED:
        a, b = getattr(release, m), getattr(probe, m)
        if a is None or b is None or b <= 0 or a <= 0:
            continue
        change = a / b - 1
        if abs(change) > tolerance:
            out.append(Disagreement(module=release.module, model_key=release.model_key, profile=release.profile,
                                    metric=m, release=a, probe=b, change=change))
    return out


def cross_check(release_rows: Sequence[ResultRow], probe_rows: Iterable[ResultRow],
                tolerance: float = DEFAULT_TOLERANCE) -> tuple[list[ResultRow], list[Disagreement]]:
    """Release rows (flagged where the probe disagrees) and every disagreement, in row order."""
    by_profile = {(p.model_key, p.profile): p for p in probe_rows}
    rows: list[ResultRow] = []
    found: list[Disagreement] = []
    for r in release_rows:
        p = by_profile.get((r.model_key, r.profile))
        d = disagreements(r, p, tolerance) if p is not None else []
        if d and FLAG not in r.flags:
            r = r.model_copy(update={"flags": (*r.flags, FLAG)})
        rows.append(r)
        found.extend(d)
    return rows, found


def capacity_row(result: SweepResult, like: ResultRow | None = None) -> ResultRow:
    """The SLO sweep's row (``capacity:<profile>``, source probe): batch = the capacity's concurrency (None when
    no level met the SLO), ttft_ms / tpot_ms its p50s, extra its figures, the SLO, why it stopped and each level."""
    ids: dict[str, object] = {"model": "probe"}
    if like is not None:
        ids = {k: getattr(like, k) for k in ("run_id", "module", "release", "model_key", "model", "size", "ctx_k",
                                             "nchip", "prefill_len", "input_tokens", "output_tokens")}
    cap = result.capacity
    extra = {"sweep_slo": str(result.slo), "sweep_stop": result.stop, "sweep_wall_s": f"{result.wall_s:.1f}",
             "sweep_levels": ",".join(f"{lv.concurrency}:{'met' if lv.met else 'broken'}" for lv in result.levels)}
    if cap is not None:
        extra.update({k: _fmt(v) for k, v in sorted(cap.figures.items())})
        extra.update({"capacity_concurrency": str(cap.concurrency), "output_tps": _fmt(cap.output_tps),
                      "request_rps": _fmt(cap.request_rps)})
    figs = cap.figures if cap is not None else {}
    ttft, tpot = figs.get("ttft_p50_ms"), figs.get("tpot_p50_ms")
    return ResultRow(
        **ids,  # type: ignore[arg-type]
        source="probe", table="sweep", profile=f"{CAPACITY_PREFIX}{result.profile}",
        batch=cap.concurrency if cap is not None else None, ttft_ms=ttft, tpot_ms=tpot,
        decode_tps=1000 / tpot if tpot else None, extra={k: v for k, v in extra.items() if v != ""},
    )
