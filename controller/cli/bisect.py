"""``fleetctl bisect``: the first bad release between a good and a bad one, k candidates at a time on k modules.

The work is :mod:`controller.service.bisect` (the loop) and :mod:`controller.service.bisect_plan` (the pure
planner); this file parses, prints the evidence as it comes, and the answer.

Lazy imports: :func:`bisect` imports the service's bisection (the run history, the settings: pydantic) when it
runs: ``fleetctl --help`` imports this module with every verb's and costs ~0.14 s of CPU in all
(``bench/cli.py``: bench/results/cli_20261207_0057_defer-plugins.txt).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from controller.cli.invocation import session
from controller.cli.output import Output, emit, output_option, stderr, stdout
from controller.command import fleetctl

if TYPE_CHECKING:
    from controller.service.bisect import Evidence, Outcome

COLUMNS = ["round", "release", "module", "run_id", "change", "outcome", "call"]


def bisect(
    ctx: typer.Context,
    good: str | None = typer.Option(None, "--good", help="the known-good release: a version, path or URL"),
    bad: str | None = typer.Option(None, "--bad", help="the known-bad release: a version, path or URL"),
    releases: str | None = typer.Option(None, "--releases", help="the releases: a folder of tarballs, a file "
                                        "listing one path or URL a line, or a comma-separated list"),
    models: str | None = typer.Option(None, "--models", "-m", help="the model keys the regression shows, comma "
                                      "separated ('all': every key, each round as long as a full validation); "
                                      "needed to start a bisection"),
    metric: str | None = typer.Option(None, "--metric", help="bisect this metric's regression (default: every "
                                      "regression the bad release shows)"),
    devices: str = typer.Option("all", "--devices", "-d", help="the modules it may use: 'all', names, label=value"),
    tolerance: float | None = typer.Option(None, "--tolerance", help="paired tolerance, a fraction (default 0.01)"),
    resume: str | None = typer.Option(None, "--resume", help="go on with this bisection (its id)"),
    cancel: str | None = typer.Option(None, "--cancel", help="cancel this bisection and its runs"),
    output: Output = output_option(),
) -> int:
    """Find the first bad release between --good and --bad: with N usable modules each round validates N
    candidates at once (log_(N+1) rounds), each called against the good release on the same module. Exit 0 when
    the first bad release (or the suspects around a skipped one) is named, 1 otherwise."""
    from contract.records import parse_model_keys
    from controller.service import BadRequest
    from controller.service import bisect as svc

    s = session(ctx)
    err = stderr()
    if cancel:
        rec = svc.cancel(s, cancel)
        err.print(f"bisection {rec.bisect_id}: {rec.status}", highlight=False)
        return 0
    if resume:
        if good or bad or releases:
            raise BadRequest("--resume goes on with the bisection as it started: no --good, --bad or --releases")
        bisect_id = svc.store(s).load(resume).bisect_id
    else:
        if not (good and bad and releases and models):
            raise BadRequest("give --good, --bad, --releases and --models (or --resume ID, or --cancel ID)")
        rec = svc.start(s, good=good, bad=bad, releases=releases, models=parse_model_keys(models), devices=devices,
                        metric=metric, tolerance=tolerance)
        bisect_id = rec.bisect_id
        err.print(f"bisection {bisect_id}: {len(rec.candidates)} releases from {rec.candidates[0].version} to "
                  f"{rec.candidates[-1].version} on {len(rec.modules)} module(s); resume after a stop with "
                  f"{fleetctl('bisect', '--resume', bisect_id)}", highlight=False, markup=False, soft_wrap=True)
    shown: set[str] = set()

    def on_round(out: Outcome) -> None:
        for e in out.evidence:
            if e.run.run_id not in shown and e.outcome != "running":
                shown.add(e.run.run_id)
                err.print(_line(out, e), highlight=False, markup=False, soft_wrap=True)

    def wait(rec: Any, runs: Any) -> None:
        what = ", ".join(f"{rec.candidates[r.index].version}" + (f" on {r.module}" if r.module else "")
                         for r in runs)
        err.print(f"round {max(r.round for r in runs)}: {what}", highlight=False, markup=False, soft_wrap=True)
        svc.follow_runs(s, rec, runs, interval=0.5)

    try:
        out = svc.run(s, bisect_id, wait, on_round)
    except KeyboardInterrupt:
        err.print(f"bisection {bisect_id} stopped; its runs go on ({fleetctl('bisect', '--resume', bisect_id)}, or "
                  f"{fleetctl('bisect', '--cancel', bisect_id)})", markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(130) from None
    on_round(out)
    recs = [_record(out, e) for e in out.evidence]
    if output != Output.table:
        emit(recs, COLUMNS, output, document=document(out))
    else:
        emit(recs, COLUMNS, output, title=f"bisect {bisect_id}")
        stdout().print(answer_line(out), markup=False, highlight=False, soft_wrap=True)
    return 0 if out.suspects and out.record.status == "done" else 1


def _change_text(out: Outcome, e: Evidence) -> str:
    targets = out.record.targets or ()
    parts = []
    for t, m in zip(targets, e.changes, strict=False):
        if m is None:
            continue
        ci = f" [{m.ci_low:+.1%}, {m.ci_high:+.1%}]" if m.ci_low is not None and m.ci_high is not None else ""
        parts.append(f"{t.model_key} {t.metric} {m.change:+.1%}{ci}")
    return "; ".join(parts)


def _call(out: Outcome, e: Evidence) -> str:
    if e.run.role != "probe":
        return e.run.role
    c = out.calls[e.run.index] if out.calls else None
    return c if c is not None else ("unsure" if e.run.index in out.unsure else "")


def _record(out: Outcome, e: Evidence) -> dict[str, Any]:
    return {"round": e.run.round, "release": e.version, "module": e.run.module or "all", "run_id": e.run.run_id,
            "change": _change_text(out, e), "outcome": e.outcome + (" (again)" if e.run.again else ""),
            "call": _call(out, e)}


def _line(out: Outcome, e: Evidence) -> str:
    r = _record(out, e)
    return f"  round {r['round']}: {r['release']} on {r['module']}: {r['change'] or r['outcome']}" + \
        (f" -> {r['call']}" if r["call"] else "")


def answer_line(out: Outcome) -> str:
    """The bisection's answer in one line."""
    rec = out.record
    how = f"{out.rounds} round(s)" + (f" + {out.again} re-run(s)" if out.again else "") + \
        f" on {len(rec.modules)} module(s)"
    skipped = [rec.candidates[i].version for i, c in enumerate(out.calls) if c == "skip"]
    said = f"; skipped (could not run): {', '.join(skipped)}" if skipped else ""
    if rec.status in ("failed", "cancelled"):
        return f"{rec.status.upper()} {rec.bisect_id}: {rec.message}"
    if out.first_bad is not None:
        targets = ", ".join(f"{t.model_key} {t.metric} {t.bad_change:+.1%}" for t in rec.targets or ())
        return (f"first bad release: {out.first_bad} (after {rec.candidates[out.bounds.good].version}"  # type: ignore[union-attr]
                f"; the bad release: {targets}); {how}{said}")
    if out.suspects:
        return f"the first bad release is one of {', '.join(out.suspects)} (skipped ones between); {how}{said}"
    return f"{rec.bisect_id}: not finished ({how})"


def document(out: Outcome) -> dict[str, Any]:
    """The JSON of ``fleetctl bisect -o json``."""
    rec = out.record
    return {
        "bisect_id": rec.bisect_id, "status": rec.status, "message": rec.message,
        "good": rec.candidates[0].version, "bad": rec.candidates[-1].version,
        "first_bad": out.first_bad, "suspects": list(out.suspects), "rounds": out.rounds, "again": out.again,
        "modules": list(rec.modules), "lost": list(rec.lost),
        "refused": {rec.candidates[i].version: why for i, why in rec.refused.items()},
        "targets": [t.model_dump() for t in rec.targets or ()],
        "calls": {c.version: (out.calls[i] if out.calls else None) for i, c in enumerate(rec.candidates)},
        "evidence": [_record(out, e) | {"changes": [None if m is None else
                                                     {"change": m.change, "ci_low": m.ci_low, "ci_high": m.ci_high}
                                                     for m in e.changes]} for e in out.evidence],
        "line": answer_line(out),
    }
