"""The HTTP API for CI systems, served by ``fleetctl serve --api-port PORT`` (FastAPI).

Every route is a thin shell over :mod:`controller.service`, like the CLI verbs. Every route
under ``/api/v1`` but the schema needs ``Authorization: Bearer <token>`` with a token from the
tokens file (compared in constant time; tokens are never logged), checked before the body is
read; bodies are bounded (``MAX_BODY_BYTES``) and so is every field (:mod:`controller.serve.guard`).
Outside ``/api/v1``: Swagger UI at ``/docs``, from the files ``fastapi-offline`` ships (no CDN: labs
are offline; the page needs no token, the calls its "Try it out" makes do: its Authorize button
keeps one in the page's memory, never stored) and the signed, expiring links to a run's
HTML report that a bearer-authenticated caller mints (:mod:`controller.serve.links`).
Each token is a named user's, with a role; each route declares the role it needs
(:mod:`controller.serve.access`), and the runs and cancels a route makes record the token's user.
Errors are ``{"detail": "<one line>"}`` with 400 (bad input), 401 (no or wrong token), 403 (the token's
user lacks the route's role; both named), 404 (no
such run or module), 409 (run id already used), 413 (body too large), 422 (a field out of bounds
or of the wrong type, named; a release URL that is bad, unreachable or too big, or a sha256
mismatch), 503 (broker or run history unreachable): each error's own ``http_status`` (:mod:`controller.errors`).
A user's value is never said back or logged beyond ~200 characters.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from enum import Enum
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from contract.priority import Priority
from contract.records import parse_model_keys
from controller import service
from controller.errors import http_status_of
from controller.fleet.reservations import OnReserved
from controller.history import FrameCache
from controller.serve import links
from controller.serve.access import RoleCheck, may_act_on, publish, refusal, undeclared
from controller.serve.health import Health, add_health
from controller.serve.tokens import Identity, Role, Tokens
from controller.serve.trend_record import TrendRecord
from controller.serve.wire import PREFIX, REACH_HEADER, RELEASES_HEADER, page_path, report_headers, run_page
from controller.service import Judgement, Session
from controller.service.release_url import MAX_SHOWN, clip
from controller.settings import ControllerSettings

DEFAULT_MIN_MAGNITUDE = 0.03  # fleetctl trend's and the detector's (tests/api/test_trend.py checks they agree)
DEFAULT_MAX_PVALUE = 0.002

log = logging.getLogger("fleet.api")

DOCS_PATH = "/docs"  # Swagger UI (no token), its files under /docs/static
# field bounds: a release is a path (PATH_MAX) or a URL (a signed one is a few KiB); a run id is 1-128 characters
MAX_RELEASE = 4096
MAX_SELECTOR = 1024
MAX_NAME = 128
MAX_MODELS = 64
MAX_DETAIL = 500  # characters of an error's one line, at most


# --------------------------------------------------------------------------- wire models
class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Problem(_Model):
    detail: str


ModelKey = Annotated[str, StringConstraints(min_length=1, max_length=MAX_NAME)]


class RunCreate(_Model):
    release: str = Field(..., min_length=1, max_length=MAX_RELEASE,
                         description="the release tarball: a path as the controller sees it, or an http/https URL "
                                     "the controller downloads (no credentials in it)")
    sha256: str | None = Field(None, pattern="^[0-9a-fA-F]{64}$",
                               description="sha256 the release must have (checked before dispatch)")
    models: list[ModelKey] | Annotated[str, StringConstraints(min_length=1, max_length=MAX_SELECTOR)] = Field(
        "all", max_length=MAX_MODELS, description="model keys, or 'all'")
    devices: str = Field("all", min_length=1, max_length=MAX_SELECTOR,
                         description="'all', module names, label=value; comma separated")
    baseline: str | None = Field(None, min_length=1, max_length=MAX_NAME,
                                 description="baseline: release, release@vN or a run id")
    run_id: str | None = Field(None, min_length=1, max_length=MAX_NAME, description="run id (default: generated)")
    resume: bool = Field(False, description="run_id names an existing run: resume it")
    priority: Priority = Field("normal", description="urgent, high, normal or low: a module that frees up starts "
                                                     "the highest first; a run waiting long is raised a level")
    preempt: bool = Field(False, description="with priority urgent: the modules' running runs stop for it at once "
                                             "and resume from their passed keys after it")
    on_reserved: OnReserved = Field("skip", description="a selected module another user reserved: skip it (the run "
                                    "waits there only when every selected module is reserved) or wait there")


class RunCreated(_Model):
    run_id: str = Field(description="the run's id (generated unless the request named one)")
    release: str = Field(description="the release's version, from the tarball's name")
    sha256: str = Field(description="the tarball's sha256")
    models: list[str] = Field(description="the model keys the run validates")
    modules: dict[str, str] = Field(description="module -> 'queued' or why it was not")
    queued: int = Field(description="modules the run was queued on")
    resumed: bool = Field(description="the request resumed an existing run")


class Run(_Model):
    run_id: str
    release: str = Field(description="the release's version")
    sha256: str = Field(description="the tarball's sha256")
    tarball: str = Field(description="the tarball's path on the controller (a downloaded release: where it was staged)")
    models: list[str] = Field(description="the model keys the run validates")
    modules: list[str] = Field(description="the modules it was sent to")
    created_at: float = Field(description="when it was created, Unix time")
    finished_at: float | None = Field(description="when it ended, Unix time; null while it runs")
    state: str = Field(description="running, done, failed or cancelled")
    verdict: str | None = Field(description="pass, regressed, incomplete, failed; null until judged")
    verdict_line: str | None = Field(None, description="the verdict's one line, as recorded when the run was judged")
    started_by: str = Field("", description="the user who started it: an API token's user or a fleetctl user "
                                            "($FLEET_USER, else the OS user); '' when not recorded")
    rows: int | None = Field(None, description="result rows in the history (one run only)")
    module_states: dict[str, dict[str, Any]] | None = Field(
        None, description="module -> its state, step, model key, progress, keys, rows and error (one run only)")


class Cancelled(_Model):
    run_id: str
    modules: list[str] = Field(description="the modules the cancel reaches")


class Device(_Model):
    module: str
    host: str
    transport: str = Field(description="ssh or local (the inventory's transport)")
    labels: dict[str, str] = Field(description="the inventory's labels")
    state: str = Field(description="idle, busy, unreachable, offline or bad")
    reason: str = Field(description="why it is in that state, and notes (clock skew, a name conflict, a contract "
                                    "version apart); empty when there is nothing to say")
    agent_version: str | None = Field(description="from its last heartbeat; null when none was seen")
    contract: int | None = Field(description="its agent's contract version, from its last heartbeat (ADR 0051)")
    contract_standing: str | None = Field(description="current, behind or ahead (one version: runs), refused (too far "
                                                      "apart: validate refuses it); null when no heartbeat was seen")
    heartbeat_age_s: float | None = Field(description="age of its last heartbeat by the broker's clock, s")
    clock_skew_s: float | None = Field(description="the module's clock minus the controller's, s (the heartbeat's "
                                                   "age is the broker's)")
    free_disk_bytes: int | None = Field(description="free disk of its workdir, from its last heartbeat")
    run_id: str | None = Field(description="the run it is busy with, from its last heartbeat")


class ReservationOut(_Model):
    module: str
    user: str = Field(description="who holds it: an API token's user or a fleetctl user")
    until: float = Field(description="when it ends, Unix time (it expires by itself)")
    until_local: str = Field(description="when it ends, HH:MM on the controller's clock")
    left_s: float = Field(description="seconds left")
    reason: str
    id: str = Field(description="shared by the modules one reserve took; kept when its user extends it")
    since: float = Field(description="when it was made, Unix time")


class ReserveBody(_Model):
    devices: str = Field(..., min_length=1, max_length=MAX_SELECTOR,
                         description="'all', module names, label=value; comma separated")
    duration: str = Field(..., min_length=2, max_length=16, description="how long: 30m, 2h, 1d")
    reason: str = Field("", max_length=MAX_DETAIL, description="why, shown to the others")


class ReportLink(_Model):
    run_id: str = Field(description="the run's id ('latest' or a prefix resolved when the link is made)")
    url: str = Field(description="opens the run's HTML report in a browser, no token needed, until expires_at")
    expires_at: int = Field(description="unix seconds")


class ReportFormat(str, Enum):
    json = "json"
    md = "md"
    html = "html"
    csv = "csv"


ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": Problem, "description": "bad input"},
    401: {"model": Problem, "description": "no token, or a wrong one"},
    403: {"model": Problem, "description": "the token's user lacks the role the route needs (both named)"},
    404: {"model": Problem, "description": "no such run"},
    413: {"model": Problem, "description": "request body larger than 64 KiB"},
    422: {"model": Problem, "description": "a field out of bounds or of the wrong type (the field named)"},
    503: {"model": Problem, "description": "broker or run history unreachable (which, and since when)"},
}


RunId = Annotated[str, PathParam(min_length=1, max_length=MAX_NAME,
                                  description="run id, unique prefix or 'latest'")]


def one_line(text: str, values: tuple[str, ...] = ()) -> str:
    """The first line of ``text`` with each long user value in it clipped, the line clipped too."""
    lines = text.strip().splitlines()
    line = lines[0] if lines else ""
    for v in sorted((v for v in values if len(v) > MAX_SHOWN), key=len, reverse=True):
        line = line.replace(v, clip(v))
    return clip(line, MAX_DETAIL)


def validation_line(exc: RequestValidationError) -> str:
    """A request that does not fit the schema, in one line naming the field (never its value)."""
    errs = exc.errors()
    if not errs:
        return "request does not fit the schema"
    e = errs[0]
    loc = [str(p) for p in e.get("loc", ()) if not (isinstance(p, str) and ("[" in p or "-" in p))]
    if loc and loc[0] in ("body", "query", "path", "header"):
        where = loc[0]
        loc = loc[1:]
    else:
        where = "body"
    name = ".".join(loc) or where
    return clip(f"{name}: {e.get('msg', 'invalid')}", MAX_DETAIL)


def _protected(path: str) -> bool:
    return (path == PREFIX or path.startswith(PREFIX + "/")) and path != f"{PREFIX}/openapi.json"


# --------------------------------------------------------------------------- the app
def create_app(settings: ControllerSettings, tokens: Tokens, frames: FrameCache | None = None,
               health: Health | None = None) -> FastAPI:
    """The API over the service, one session per worker thread (SQLite connections are per thread); ``frames``:
    the run frames they share with the rest of ``fleetctl serve`` (:class:`controller.history.FrameCache`);
    ``health``: its parts' states (``GET /health``, 503 at once while the history is down: ADR 0050)."""
    local = threading.local()
    sessions: list[Session] = []
    lock = threading.Lock()

    def session() -> Session:
        s: Session | None = getattr(local, "session", None)
        if s is None:
            s = local.session = Session(settings, frames=frames)
            with lock:
                sessions.append(s)
        return s

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> Any:
        yield
        with lock:
            for s in sessions:
                s.close()
            sessions.clear()

    from fastapi_offline import FastAPIOffline

    app = FastAPIOffline(title="m1000-fleet controller", version="1", lifespan=lifespan,
                         openapi_url=f"{PREFIX}/openapi.json", docs_url=DOCS_PATH, redoc_url=None,
                         static_url=f"{DOCS_PATH}/static",
                         swagger_ui_parameters={"validatorUrl": None, "persistAuthorization": False},
                         description="Validate SGLang-MUSA releases on a fleet of M1000 modules (for CI systems).")
    from controller.serve.guard import MAX_BODY_BYTES, Guard

    link_secret = links.load_secret(settings.data_dir)
    if health is not None:  # its gate inside the token check below (added later: the outer one)
        add_health(app, health, PREFIX)

    # the token and the body's size, checked before the body is read (the dependency below stays, for the schema)
    app.add_middleware(Guard, check_token=tokens.check, protected=_protected,  # type: ignore[arg-type]
                       max_body=MAX_BODY_BYTES)

    # the role each route needs (its token checked again there, to know whose it is): read, trigger, admin
    reader = RoleCheck(Role.read, tokens)
    trigger = RoleCheck(Role.trigger, tokens)
    canceller = RoleCheck(Role.trigger, tokens, others=Role.admin)

    def errors(fn: Callable[[], Any], *values: str | None) -> Any:
        try:
            return fn()
        except Exception as exc:
            status = http_status_of(exc)  # the error's own (controller.errors); None: a bug, a 500
            if status is None:
                raise
            line = one_line(str(exc), tuple(v for v in values if v))
            raise HTTPException(status, line or type(exc).__name__) from None

    @app.exception_handler(HTTPException)
    async def _http_error(_: Request, exc: HTTPException) -> JSONResponse:
        return JSONResponse({"detail": clip(str(exc.detail), MAX_DETAIL)}, status_code=exc.status_code,
                            headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": validation_line(exc)}, status_code=422)

    deps = [Depends(reader)]

    @app.get("/favicon.ico", include_in_schema=False)
    def favicon() -> Response:  # browsers opening the HTML report ask for it: no icon, no error
        return Response(status_code=204)

    @app.post(f"{PREFIX}/runs", status_code=201, response_model=RunCreated,
              responses={**ERRORS, 409: {"model": Problem, "description": "run id already used"},
                         422: {"model": Problem, "description": "release URL unusable, sha256 mismatch, or a "
                                                              "field out of bounds (named)"}})
    def create_run(body: RunCreate, who: Identity = Depends(trigger)) -> RunCreated:
        """Validate a release: checks, release made available on each module, dispatch; returns at once."""
        def launch() -> service.Launched:
            req = service.release_request(body.release, sha256=body.sha256, models=parse_model_keys(body.models),
                                          devices=body.devices, baseline=body.baseline, run_id=body.run_id,
                                          resume=body.resume, priority=body.priority, preempt=body.preempt,
                                          on_reserved=body.on_reserved,
                                          user=who.user)
            req = dataclasses.replace(req, preempt_others=who.role.allows(Role.admin))
            return service.validate(session(), req)

        models = body.models if isinstance(body.models, str) else ",".join(body.models)
        got: service.Launched = errors(launch, body.release, body.devices, body.baseline, body.run_id, models)
        log.info("run %s dispatched over HTTP by %s: %d/%d modules queued", got.run_id, who.user, got.queued,
                 len(got.modules))
        return RunCreated(run_id=got.run_id, release=got.release, sha256=got.sha256, models=list(got.models),
                          modules=dict(got.modules), queued=got.queued, resumed=got.resumed)

    @app.get(f"{PREFIX}/runs", response_model=list[Run], dependencies=deps, responses=ERRORS)
    def list_runs(limit: int = Query(20, ge=1, le=500, description="at most this many, newest first")) -> list[Run]:
        """Recent runs, newest first (from the run history; one it holds as running in the state the broker holds)."""
        return [Run(**service.run_summary(r)) for r in errors(lambda: service.runs(session(), limit))]

    @app.get(f"{PREFIX}/runs/{{run_id}}", response_model=Run, dependencies=deps, responses=ERRORS)
    def get_run(run_id: RunId) -> Run:
        """One run with the state of each module; live (the broker's newest progress) while it runs."""
        d = errors(lambda: service.describe_run(session(), run_id), run_id)
        return Run(**service.run_summary(d.info, d.view, rows=d.rows))

    @app.get(f"{PREFIX}/runs/{{run_id}}/report", dependencies=deps,
             responses={**ERRORS, 200: {"description": "the report", "content": {
                 "application/json": {}, "text/markdown": {}, "text/html": {}, "text/csv": {}}}})
    def get_report(run_id: RunId,
                   format: ReportFormat = Query(ReportFormat.json,  # the query's name
                                                description="json, md, html (a self-contained page) or csv (the "
                                                            "rows with their baseline and change)"),
                   baseline: str | None = Query(None, min_length=1, max_length=MAX_NAME,
                                                description="baseline: release, release@vN or a run id (default: "
                                                            "the newest of the run's release, else of any)"),
                   tolerance: float = Query(0.05, gt=0, lt=1,
                                            description="relative change that counts as a regression"),
                   energy_tolerance: float = Query(0.05, gt=0, lt=1, description="the same, of energy per token "
                                                                                  "(J/token, tokens/J)"),
                   startup_tolerance: float | None = Query(None, gt=0, lt=1, description="the same, of a start-up "
                                                                                           "cost (server ready, first "
                                                                                           "request; default 0.15)")) \
            -> Response:
        """The run's report: verdict, regressions, outlier modules. ``format``: json, md, html, csv (rows). Headers
        ``X-Fleet-Run``, ``-Verdict-Line`` (JSON strings), ``-Verdict``, ``-Warnings`` (a JSON list) carry the rest."""
        html = format is ReportFormat.html
        rep = errors(lambda: service.report(session(), run_id, baseline, tolerance=tolerance,
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

    @app.post(f"{PREFIX}/runs/{{run_id}}/report/link", status_code=201, response_model=ReportLink, dependencies=deps,
              responses=ERRORS)
    def report_link(run_id: RunId, request: Request,
                    ttl: int = Query(links.DEFAULT_TTL, ge=links.MIN_TTL, le=links.MAX_TTL,
                                     description="seconds the link is valid")) -> ReportLink:
        """A link to the run's HTML report that a browser opens without a token, until it expires (signed)."""
        info = errors(lambda: service.find_run(session(), run_id), run_id)
        link = links.make_link(link_secret, info.run_id, time.time(), ttl)
        return ReportLink(run_id=info.run_id, url=str(request.base_url).rstrip("/") + link.path,
                          expires_at=link.expires)

    @app.get(f"{links.LINK_PREFIX}/{{run_id}}/report.html", include_in_schema=False)
    def linked_report(run_id: RunId, expires: int = Query(...), sig: str = Query(..., max_length=128)) -> Response:
        """The HTML report behind a signed link (no bearer header: the signature is the credential)."""
        errors(lambda: links.check_link(link_secret, links.report_path(run_id), expires, sig, time.time()))
        rep = errors(lambda: service.report(session(), run_id, with_history=True), run_id)
        from controller.report.render.html import to_html

        return Response(to_html(rep, page_path(rep.run_id)),
                        media_type="text/html; charset=utf-8",
                        headers={"Cache-Control": "private, no-store", "Referrer-Policy": "no-referrer"})

    @app.post(f"{PREFIX}/runs/{{run_id}}/cancel", status_code=202, response_model=Cancelled, responses=ERRORS)
    def cancel_run(run_id: RunId, who: Identity = Depends(canceller),
                   devices: str | None = Query(None, min_length=1, max_length=MAX_SELECTOR,
                                               description="only these modules: 'all', names, label=value")) \
            -> Cancelled:
        """Durable cancel of the run (or of the modules ``devices`` selects): role trigger for a run the token's
        user started, admin for another's."""
        info = errors(lambda: service.find_run(session(), run_id), run_id)
        if not may_act_on(who, info.started_by):
            owner = f"user {info.started_by}" if info.started_by else "a user not recorded"
            raise HTTPException(403, refusal(who, Role.admin, f"cancelling run {info.run_id} (started by {owner})"))
        rid, names = errors(lambda: service.cancel(session(), info.run_id, devices, user=who.user), devices)
        log.info("run %s: cancel sent over HTTP by %s", rid, who.user)
        return Cancelled(run_id=rid, modules=names)

    @app.get(f"{PREFIX}/trend", response_model=list[TrendRecord], dependencies=deps, responses=ERRORS)
    def get_trend(response: Response,
                  models: str = Query("all", min_length=1, max_length=MAX_SELECTOR,
                                      description="model keys, comma separated, or 'all'"),
                  profile: str | None = Query(None, min_length=1, max_length=MAX_NAME, description="only this profile"),
                  metric: str | None = Query(None, min_length=1, max_length=MAX_NAME,
                                             description="only this metric (e.g. decode_tps)"),
                  devices: str = Query("all", min_length=1, max_length=MAX_SELECTOR,
                                       description="'all' or module names, comma separated (per-module series of "
                                                   "those; the fleet series are over every module)"),
                  min_magnitude: float = Query(DEFAULT_MIN_MAGNITUDE, ge=0, lt=1,
                                               description="smallest relative change reported"),
                  max_pvalue: float = Query(DEFAULT_MAX_PVALUE, gt=0, le=1,
                                            description="largest p-value of a change point")) -> list[TrendRecord]:
        """Change points across the releases in the run history: the records of ``fleetctl trend -o json`` (how
        many releases the history holds in the header ``X-Fleet-Releases``; with none, the smallest step it could
        have found in ``X-Fleet-Reach``)."""
        def query() -> Any:
            from controller.report.trend import TrendQuery, settings_of

            names = None if devices == "all" else frozenset(d.strip() for d in devices.split(",") if d.strip())
            return service.trend(session(), TrendQuery(
                models=None if models == "all" else tuple(parse_model_keys(models)), profile=profile, metric=metric,
                devices=names, settings=settings_of(min_magnitude, max_pvalue)))

        got = errors(query, models, profile, metric, devices)
        response.headers[RELEASES_HEADER] = str(got.releases)
        if got.reach is not None:
            response.headers[REACH_HEADER] = json.dumps(got.reach.line())
        return [TrendRecord(**r) for r in got.records]

    @app.get(f"{PREFIX}/devices", response_model=list[Device], dependencies=deps, responses=ERRORS)
    def list_devices(devices: str = Query("all", min_length=1, max_length=MAX_SELECTOR,
                                          description="'all', module names, label=value; comma separated")) \
            -> list[Device]:
        """Modules of the inventory and their state (idle, busy, offline, bad) from their heartbeats."""
        return [Device(**service.device_dict(d))
                for d in errors(lambda: service.devices(session(), devices), devices)]

    @app.get(f"{PREFIX}/reservations", response_model=list[ReservationOut], dependencies=deps, responses=ERRORS)
    def list_reservations(devices: str = Query("all", min_length=1, max_length=MAX_SELECTOR,
                                               description="'all', module names, label=value; comma separated")) \
            -> list[ReservationOut]:
        """Modules reserved now: by whom, until when, why (``fleetctl reservations``)."""
        from controller.service.reservations import reservation_dict, reservations

        return [ReservationOut(**reservation_dict(r)) for r in errors(lambda: reservations(session(), devices),
                                                                      devices)]

    @app.post(f"{PREFIX}/reservations", status_code=201, response_model=list[ReservationOut],
              responses={**ERRORS, 409: {"model": Problem, "description": "another user holds one of the modules"}})
    def create_reservation(body: ReserveBody, who: Identity = Depends(trigger)) -> list[ReservationOut]:
        """Reserve modules for the token's user (``fleetctl reserve``): no other user's run is sent to them until it
        ends; the user's own reservations are extended; 409 naming who holds one when another user does."""
        from controller.fleet.reservations import parse_duration
        from controller.service.reservations import reservation_dict, reserve

        def make() -> list[Any]:
            try:
                seconds = parse_duration(body.duration)
            except ValueError as exc:
                raise service.BadRequest(str(exc)) from None
            return reserve(session(), body.devices, seconds, body.reason, user=who.user)

        got = errors(make, body.devices, body.duration)
        log.info("%d module(s) reserved over HTTP by %s", len(got), who.user)
        return [ReservationOut(**reservation_dict(r)) for r in got]

    @app.delete(f"{PREFIX}/reservations/{{module}}", response_model=ReservationOut, responses=ERRORS)
    def delete_reservation(module: Annotated[str, PathParam(min_length=1, max_length=MAX_NAME)],
                           who: Identity = Depends(canceller)) -> ReservationOut:
        """End a module's reservation: role trigger for the token's user's own, admin for another's."""
        from controller.service.reservations import release, reservation_dict, reservations

        def held() -> Any:
            if module not in {m.name for m in session().inventory().modules}:
                raise service.NotFound(f"no module {module!r} in the inventory")
            found = reservations(session(), module)
            if not found:
                raise service.NotFound(f"{module} is not reserved")
            return found[0]

        r = errors(held, module)
        if not may_act_on(who, r.user):
            raise HTTPException(403, refusal(who, Role.admin, f"releasing {module} (reserved by user {r.user})"))
        errors(lambda: release(session(), module, user=who.user, force=True), module)
        log.info("%s: reservation of %s released over HTTP by %s", module, r.user, who.user)
        return ReservationOut(**reservation_dict(r))

    from controller.serve.power_route import add_power_route

    add_power_route(app, session, errors, RoleCheck(Role.admin, tokens), ERRORS)

    from controller.serve.pages import mount as mount_pages  # the run browser under /ui (issue 52)

    mount_pages(app, settings, tokens, session, link_secret)
    missing = undeclared(app.routes, _protected)
    if missing:  # a route every token could call by omission: refused before the app serves anything
        raise RuntimeError(f"API routes without a declared role: {', '.join(missing)}")
    publish(app.routes)
    return app


def summary_of(s: Session, j: Judgement) -> dict[str, Any]:
    """The webhook body of a verdict: the run as the API shows it, with the verdict line (and its page)."""
    d = service.describe_run(s, j.run_id, live=False)
    page = run_page(s.settings.serve_url, j.run_id)  # the run's page (serve_url set): a person opens it
    return {"event": "run.verdict", **service.run_summary(d.info, d.view, rows=d.rows, judgement=j),
            **({"page_url": page} if page else {})}
