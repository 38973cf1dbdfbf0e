"""How the paired verdict of ``fleetctl ab`` reads: a verdict line, a table's records, JSON."""

from __future__ import annotations

import math
from typing import Any

from contract.records import STARTUP_METRICS, WINDOW_METRICS
from controller.report.model import PairedChange, PairedReport
from controller.report.render.numbers import pct


def mag(x: float) -> str:
    """A magnitude (a tolerance, a detectable change) as an unsigned percentage (``1.5%``)."""
    return f"{x:.1%}"


def _windows(c: PairedChange) -> str:
    return "starts" if c.metric in STARTUP_METRICS else "windows"


def change_text(c: PairedChange) -> str:
    """``decode_tps -2.1 % [-2.9 %, -1.5 %] (p 0.0005; detectable from 1.5 %)``; a start-up or energy figure's with
    its own tolerance and how many starts (windows) it was tested over."""
    window = c.metric in WINDOW_METRICS
    if c.ci_low is not None and c.ci_high is not None:
        ci = f" [{pct(c.ci_low)}, {pct(c.ci_high)}]"
    else:
        ci = f" [{c.pairs} {_windows(c)}, too few for an interval]" if window else ""
    if window:
        mdc = f"tolerance {mag(c.tolerance)}, " if c.tolerance is not None else ""
        mdc += f"t-test over {c.pairs} {_windows(c)}"
    else:
        mdc = f"detectable from {mag(c.mdc)}" if c.mdc is not None else "too few profiles to detect any change"
    return f"{c.metric} {pct(c.change)}{ci} (p {c.p_value:.2g}; {mdc})"


def tolerances(rep: PairedReport) -> str:
    """``tolerance 1.0%``, and the start-up and energy figures' own where the comparison judged any
    (``tolerance 1.0% (start-up 15.0%, energy 5.0%)``)."""
    own = {("start-up" if c.metric in STARTUP_METRICS else "energy"): c.tolerance for c in rep.changes
           if c.metric in WINDOW_METRICS and c.tolerance is not None}
    extra = ", ".join(f"{k} {mag(v)}" for k, v in sorted(own.items(), reverse=True))
    return f"tolerance {mag(rep.tolerance)}" + (f" ({extra})" if extra else "")


def more_pairs(rounds: int, mdc: float, tolerance: float, most: int = 20) -> str:
    """What would make a change of ``tolerance`` detectable where ``mdc`` is: the detectable change falls with the
    square root of the pairs, so about ``rounds * (mdc / tolerance)**2`` rounds on these modules; beyond ``most``
    rounds (fleetctl ab's limit), more modules."""
    need = math.ceil(rounds * (mdc / tolerance) ** 2)
    if need <= most:
        return f"to detect {mag(tolerance)}: about --rounds {need}, or more modules"
    return f"to detect {mag(tolerance)}: more modules (about {need / most:.0f}x these, at --rounds {most})"


def paired_verdict_line(rep: PairedReport) -> str:
    """One line: the verdict, what was compared, the regressions with their intervals, the smallest change the
    comparison could name."""
    head = (f"{rep.verdict.upper()} {rep.release_b} vs {rep.release_a}: {rep.rounds} round(s) A B B A on "
            f"{len(rep.modules)} module(s), {tolerances(rep)}")
    mdcs = [c.mdc for c in rep.changes if c.mdc is not None and c.metric == "decode_tps"]
    floor = f"; decode detectable from {mag(max(mdcs))}" if mdcs else ""
    # too coarse for its tolerance
    if mdcs and max(mdcs) > rep.tolerance and mag(max(mdcs)) != mag(rep.tolerance):
        floor += f" ({more_pairs(rep.rounds, max(mdcs), rep.tolerance)})"
    regs = "; ".join(f"{r.model_key} {change_text(r)}" for r in rep.regressions)
    notes = "; ".join(rep.notes)
    return head + floor + (f": regressed {regs}" if regs else "") + (f" ({notes})" if notes else "")


def paired_records(rep: PairedReport) -> list[dict[str, Any]]:
    """One record per key-level change (the table's rows and the CSV's)."""
    return [{"model_key": c.model_key, "metric": c.metric, "change": pct(c.change),
             "interval": (f"{pct(c.ci_low)} .. {pct(c.ci_high)}" if c.ci_low is not None else
                         f"{c.pairs} {_windows(c)}, too few" if c.metric in WINDOW_METRICS else ""),
             "p": f"{c.p_value:.2g}", "detectable": mag(c.mdc) if c.mdc is not None else "",
             "tolerance": mag(c.tolerance) if c.tolerance is not None else mag(rep.tolerance),
             "profiles": "" if c.metric in WINDOW_METRICS else c.profiles, "pairs": c.pairs,
             "status": c.status} for c in rep.changes]


PAIRED_COLUMNS = ("model_key", "metric", "change", "interval", "p", "detectable", "tolerance", "profiles", "pairs",
                  "status")


def paired_json(rep: PairedReport) -> dict[str, Any]:
    return rep.model_dump(mode="json")
