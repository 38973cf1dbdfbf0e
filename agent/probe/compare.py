"""Probe results as result rows, and the cross-check against the release's own rows (pure).

A probe row has the identity of the release's row of the same profile (run, module, model
key, profile) with ``source="probe"``; its figures follow the seed's definitions from the
probe's medians: ``ttft_ms`` = TTFT p50, ``tpot_ms`` = TPOT p50, ``prefill_tps`` =
prefill_len / TTFT, ``decode_tps`` = 1000 / TPOT.

**The cross-check judges a difference against measured noise** (docs/adr/0036-probe-sends-text-judged-by-noise.md).
For TTFT and TPOT (the tok/s figures are their inverses and share their relative band):

- the probe's *first* request (right after the release's benchmark, as the release's first measured request
  comes right after its warm-up) is kept apart; the others are the *usual* requests;
- the **noise** is the standard error of the difference of two medians, from the spread s of the usual requests
  (of every round, with ``repeat`` >= 2): the probe's median of n, 1.2533 s / sqrt(n); the release's median of
  m >= 2 requests of one round, at most s / sqrt(2), or s over rounds (their drift is in s and a median does not
  average it away);
- the **band** is t(0.9995, n - 1) times that noise (two-sided 0.1 % by chance per figure: a run judges some
  forty) plus a floor (``tolerance`` of the probe's figure, at least the clock's and transport's resolution): a
  release figure inside the band agrees;
- a figure outside the band and on the side of the probe's first request is **explained** (not flagged) when
  the first request stands out (beyond the band from the usual ones) and a median of two that includes it
  falls within the band of the release's figure: "the first request after warm-up is 1.7x the others: a
  median of 2 that includes it is 1.35x, the release's is 1.33x";
- otherwise the release row is flagged ``release_benchmark_disagrees`` and the disagreement says which of
  the two moved and by how much beyond the noise.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence

from agent.probe.intervals import t9995
from agent.probe.records import ProfileResult, RequestResult, Stat
from agent.probe.sweep import SweepResult
from contract.records import ResultRow
from contract.vocab import CAPACITY_PREFIX
from contract.vocab import COMPARED as COMPARED
from contract.vocab import Disagreement as Disagreement

FLAG = "release_benchmark_disagrees"
# the least relative band: below it a difference is not told apart from rounding
DEFAULT_TOLERANCE = 0.02
FLOOR_MS = {"ttft_ms": 0.5, "tpot_ms": 0.02}  # clock and transport resolution of one figure (two clients)
BASE = {"ttft_ms": "ttft_ms", "prefill_tps": "ttft_ms", "tpot_ms": "tpot_ms", "decode_tps": "tpot_ms"}
_MEDIAN_SE = math.sqrt(math.pi / 2)  # the median of n normal values: sd x 1.2533 / sqrt(n)


def _fmt(v: float | None) -> str:
    return "" if v is None else f"{v:.6g}"


def _values(rs: Iterable[RequestResult], metric: str) -> list[float]:
    name = metric.removesuffix("_ms") + "_ms"
    return [v for r in rs if r.ok and (v := getattr(r, name)) is not None]


def _band(r: ProfileResult, metric: str, centre: float, tolerance: float) -> tuple[float, str]:
    """The half-width of the band around the probe's ``metric`` (ms), and how it was measured."""
    floor = max(FLOOR_MS[metric], tolerance * centre)
    usual = _values(r.samples[1:], metric)
    if len(usual) < 2:
        return floor, "no spread measured"
    sd = statistics.stdev(usual)
    # the release's figure: a median of m >= 2 requests of one round (at most sd / sqrt(2)); over rounds, the
    # spread seen includes their drift, which a median does not average away: sd
    release = 1.0 if r.repeats > 1 else 0.5
    se = sd * math.sqrt(_MEDIAN_SE**2 / len(usual) + release)
    how = f"{r.repeats} rounds, {len(usual)} requests" if r.repeats > 1 else f"{len(usual)} requests"
    return t9995(len(usual) - 1) * se + floor, how


def noise_bands(r: ProfileResult, tolerance: float = DEFAULT_TOLERANCE) -> dict[str, float]:
    """Each compared figure's band, relative to the probe's figure (for the row's ``extra``)."""
    out: dict[str, float] = {}
    for metric, stat in (("ttft_ms", r.ttft_ms), ("tpot_ms", r.tpot_ms)):
        if stat is not None and stat.p50 > 0:
            out[metric] = _band(r, metric, stat.p50, tolerance)[0] / stat.p50
    return out


def _extra(r: ProfileResult, tolerance: float) -> dict[str, str]:
    out = {"probe_requests": str(r.requests), "probe_ok": str(r.ok), "probe_load": r.load.label,
           "probe_api": r.api, "probe_prompt": r.prompt, "probe_tolerance": f"{tolerance:g}",
           "probe_time_scale": f"{r.time_scale:g}", "probe_engine_fields": "yes" if r.engine_fields else "no",
           "probe_cache": r.cache}
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
    for metric, rel in noise_bands(r, tolerance).items():
        out[f"probe_band_{metric}"] = f"{rel:.4g}"  # relative half-width the cross-check allowed
    for name, v in (("output_tps", r.output_throughput_tps), ("request_rps", r.request_throughput_rps),
                    ("goodput_rps", r.goodput_rps), ("tokens_per_chunk", r.tokens_per_chunk),
                    ("accept_length", r.accept_length)):
        if v is not None:
            out[name] = _fmt(v)
    # each request in the order sent (first: right after the release's benchmark): ms, 4 significant digits
    for name, attr in (("ttft", "ttft_ms"), ("tpot", "tpot_ms"), ("first_byte", "first_byte_ms")):
        each = [getattr(x, attr) for x in r.samples]
        if any(v is not None for v in each):
            out[f"probe_{name}_each_ms"] = ",".join("" if v is None else f"{v:.4g}" for v in each)
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


def judge(release: ResultRow, r: ProfileResult, tolerance: float = DEFAULT_TOLERANCE
          ) -> tuple[list[Disagreement], list[str]]:
    """The release row's figures against the probe's result of the same profile: (disagreements beyond the
    noise, explanations of differences that are not flagged)."""
    found: list[Disagreement] = []
    notes: list[str] = []
    probe = probe_row(r, release, tolerance=tolerance)
    for base in ("ttft_ms", "tpot_ms"):
        stat = getattr(r, base)
        a = getattr(release, base)
        if stat is None or a is None or a <= 0 or stat.p50 <= 0:
            continue
        b = stat.p50
        half, how = _band(r, base, b, tolerance)
        if abs(a - b) <= half:
            continue
        first = _values(r.samples[:1], base)
        usual = _values(r.samples[1:], base)
        name = base.removesuffix("_ms").upper()
        where = f"{release.model_key} {release.profile}".strip()
        if first and usual:
            f = first[0] / statistics.median(usual)
            both = b * (1 + f) / 2  # a median of two that includes such a first request
            if abs(first[0] - statistics.median(usual)) > half and abs(a - both) <= half:
                notes.append(f"{where} {name}: the first request after warm-up is "
                             f"{f:.2f}x the others (the probe's first, right after the release's benchmark): a "
                             f"median of 2 that includes it is {both / b:.2f}x the probe's, the release's is "
                             f"{a / b:.2f}x; not flagged")
                continue
        lo, hi = (min(usual), max(usual)) if usual else (b, b)
        who = ("the release moved: its figure is outside every usual probe request "
               f"({lo:.4g}-{hi:.4g} ms)") if not lo <= a <= hi else "both spread: the release's figure is among " \
            "the probe's requests but not near their median"
        why = (f"{name} {abs(a - b) - half:.3g} ms beyond the noise band of +-{half:.3g} ms ({how}, release "
               f"{a:.4g} ms, probe {b:.4g} ms); {who}")
        for m in (base, *(k for k, v in BASE.items() if v == base and k != base)):
            x, y = getattr(release, m), getattr(probe, m)
            if x is None or y is None or x <= 0 or y <= 0:
                continue
            found.append(Disagreement(module=release.module, model_key=release.model_key, profile=release.profile,
                                      metric=m, release=x, probe=y, change=x / y - 1, noise=half / b, why=why))
    order = {m: i for i, m in enumerate(COMPARED)}
    found.sort(key=lambda d: order.get(d.metric, 99))
    return found, notes


def cross_check(release_rows: Sequence[ResultRow], results: Iterable[ProfileResult],
                tolerance: float = DEFAULT_TOLERANCE) -> tuple[list[ResultRow], list[Disagreement], list[str]]:
    """Release rows (flagged where the probe disagrees beyond the noise), every disagreement and every
    explained difference, in row order. ``results``: the probe's, by profile."""
    by_profile = {r.profile: r for r in results}
    rows: list[ResultRow] = []
    found: list[Disagreement] = []
    notes: list[str] = []
    for row in release_rows:
        p = by_profile.get(row.profile) if row.source == "release" and row.table == "sweep" else None
        d, n = judge(row, p, tolerance) if p is not None else ([], [])
        if d and FLAG not in row.flags:
            row = row.model_copy(update={"flags": (*row.flags, FLAG)})
        if n:
            row = row.model_copy(update={"extra": {**row.extra, "probe_note": "; ".join(n)}})
        rows.append(row)
        found.extend(d)
        notes.extend(n)
    return rows, found, notes


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
