"""The API's routes of runs: start (or resume) one, list them, read one, its report and a signed link to it,
cancel it. Thin shells over :mod:`controller.service`, like the CLI's verbs.

Lazy imports: the report's renderers (:mod:`controller.report.render`, its ``html``) load pandas (462 ms of CPU, 88
MiB; the HTML report matplotlib too, 542 ms, 49 MiB: ``bench/import_costs.py``,
bench/results/import_costs_20261207_0346_lazy-libraries.txt) at the first report asked for, not when the API starts.
"""

from __future__ import annotations

import dataclasses
import logging
import time

from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import Response

from contract.records import parse_model_keys
from controller import service
from controller.serve import links
from controller.serve.access import may_act_on, refusal
from controller.serve.routes.common import ACT_ON, READS, TRIGGER, LinkSecret, Pool, RunId, answer
from controller.serve.routes.models import (
    ERRORS,
    MAX_NAME,
    MAX_SELECTOR,
    Cancelled,
    Problem,
    ReportFormat,
    ReportLink,
    Run,
    RunCreate,
    RunCreated,
)
from controller.serve.tokens import Identity, Role
from controller.serve.wire import PREFIX, report_headers

log = logging.getLogger("fleet.api")

router = APIRouter()


@router.post(f"{PREFIX}/runs", status_code=201, response_model=RunCreated,
             responses={**ERRORS, 409: {"model": Problem, "description": "run id already used"},
                        422: {"model": Problem, "description": "release URL unusable, sha256 mismatch, or a "
                                                             "field out of bounds (named)"}})
def create_run(body: RunCreate, pool: Pool, who: Identity = Depends(TRIGGER)) -> RunCreated:
    """Validate a release: checks, release made available on each module, dispatch; returns at once."""
    def launch() -> service.Launched:
        req = service.release_request(body.release, sha256=body.sha256, models=parse_model_keys(body.models),
                                      devices=body.devices, baseline=body.baseline, run_id=body.run_id,
                                      resume=body.resume, priority=body.priority, preempt=body.preempt,
                                      on_reserved=body.on_reserved,
                                      user=who.user)
        req = dataclasses.replace(req, preempt_others=who.role.allows(Role.admin))
        return service.validate(pool(), req)

    models = body.models if isinstance(body.models, str) else ",".join(body.models)
    got: service.Launched = answer(launch, body.release, body.devices, body.baseline, body.run_id, models)
    log.info("run %s dispatched over HTTP by %s: %d/%d modules queued", got.run_id, who.user, got.queued,
             len(got.modules))
    return RunCreated(run_id=got.run_id, release=got.release, sha256=got.sha256, models=list(got.models),
                      modules=dict(got.modules), queued=got.queued, resumed=got.resumed)


@router.get(f"{PREFIX}/runs", response_model=list[Run], dependencies=READS, responses=ERRORS)
def list_runs(pool: Pool, limit: int = Query(20, ge=1, le=500, description="at most this many, newest first")) \
        -> list[Run]:
    """Recent runs, newest first (from the run history; one it holds as running in the state the broker holds)."""
    return [Run(**service.run_summary(r)) for r in answer(lambda: service.runs(pool(), limit))]


@router.get(f"{PREFIX}/runs/{{run_id}}", response_model=Run, dependencies=READS, responses=ERRORS)
def get_run(run_id: RunId, pool: Pool) -> Run:
    """One run with the state of each module; live (the broker's newest progress) while it runs."""
    d = answer(lambda: service.describe_run(pool(), run_id), run_id)
    return Run(**service.run_summary(d.info, d.view, rows=d.rows))


@router.get(f"{PREFIX}/runs/{{run_id}}/report", dependencies=READS,
            responses={**ERRORS, 200: {"description": "the report", "content": {
                "application/json": {}, "text/markdown": {}, "text/html": {}, "text/csv": {}}}})
def get_report(run_id: RunId, pool: Pool,
               format: ReportFormat = Query(ReportFormat.json,  # the query's name
                                            description="json, md, html (a self-contained page) or csv (the "
                                                        "rows with their baseline and change)"),
               baseline: str | None = Query(None, min_length=1, max_length=MAX_NAME,
                                            description="baseline: release, release@vN or a run id (default: "
                                                        "the newest of the run's release, else of any)"),
               tolerance: float = Query(0.05, gt=0, lt=1,
                                        description="relative change that counts as a regression (of every "
                                                    "metric but energy per token and start-up costs, which have "
                                                    "their own)"),
               energy_tolerance: float = Query(0.05, gt=0, lt=1,
                                               description="relative change of energy per token (J/token, "
                                                           "tokens/J) that counts as a regression"),
               startup_tolerance: float | None = Query(None, gt=0, lt=1,
                                                       description="relative change of a start-up cost (server "
                                                                   "ready, first request, precompile) that counts "
                                                                   "as a regression (default 0.15)")) \
        -> Response:
    """The run's report: verdict, regressions, outlier modules. ``format``: json, md, html, csv (rows). What
    ``fleetctl report --service`` prints besides the body comes in the headers ``X-Fleet-Run`` and
    ``X-Fleet-Verdict-Line`` (JSON strings), ``X-Fleet-Verdict`` and ``X-Fleet-Warnings`` (a JSON list)."""
    html = format is ReportFormat.html
    rep = answer(lambda: service.report(pool(), run_id, baseline, tolerance=tolerance,
                                        energy_tolerance=energy_tolerance, startup_tolerance=startup_tolerance,
                                        with_history=html), run_id, baseline)
    from controller.report.render import rows_with_baseline, to_json, to_markdown, verdict_line

    headers = report_headers(rep.run_id, rep.verdict, verdict_line(rep), rep.environment_changes)
    if format is ReportFormat.json:
        return Response(to_json(rep), media_type="application/json", headers=headers)
    if format is ReportFormat.md:
        return Response(to_markdown(rep), media_type="text/markdown; charset=utf-8", headers=headers)
    if format is ReportFormat.html:
        from controller.report.render.html import to_html

        return Response(to_html(rep), media_type="text/html; charset=utf-8", headers=headers)
    return Response(rows_with_baseline(rep).to_csv(index=False), media_type="text/csv; charset=utf-8",
                    headers=headers)


@router.post(f"{PREFIX}/runs/{{run_id}}/report/link", status_code=201, response_model=ReportLink,
             dependencies=READS, responses=ERRORS)
def report_link(run_id: RunId, request: Request, pool: Pool, secret: LinkSecret,
                ttl: int = Query(links.DEFAULT_TTL, ge=links.MIN_TTL, le=links.MAX_TTL,
                                 description="seconds the link is valid")) -> ReportLink:
    """A link to the run's HTML report that a browser opens without a token, until it expires (signed)."""
    info = answer(lambda: service.find_run(pool(), run_id), run_id)
    link = links.make_link(secret, info.run_id, time.time(), ttl)
    return ReportLink(run_id=info.run_id, url=str(request.base_url).rstrip("/") + link.path,
                      expires_at=link.expires)


@router.post(f"{PREFIX}/runs/{{run_id}}/cancel", status_code=202, response_model=Cancelled, responses=ERRORS)
def cancel_run(run_id: RunId, pool: Pool, who: Identity = Depends(ACT_ON),
               devices: str | None = Query(None, min_length=1, max_length=MAX_SELECTOR,
                                           description="only these modules: 'all', names, label=value")) \
        -> Cancelled:
    """Durable cancel of the run (or of the modules ``devices`` selects): role trigger for a run the token's
    user started, admin for another's."""
    info = answer(lambda: service.find_run(pool(), run_id), run_id)
    if not may_act_on(who, info.started_by):
        owner = f"user {info.started_by}" if info.started_by else "a user not recorded"
        raise HTTPException(403, refusal(who, Role.admin, f"cancelling run {info.run_id} (started by {owner})"))
    rid, names = answer(lambda: service.cancel(pool(), info.run_id, devices, user=who.user), devices)
    log.info("run %s: cancel sent over HTTP by %s", rid, who.user)
    return Cancelled(run_id=rid, modules=names)
