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
The routes live in :mod:`controller.serve.routes` (one router per area) and the run browser's pages in
:mod:`controller.serve.pages`; this module makes the app, its shared state and its middleware.
Errors are ``{"detail": "<one line>"}`` with 400 (bad input), 401 (no or wrong token), 403 (the token's
user lacks the route's role; both named), 404 (no
such run or module), 409 (run id already used), 413 (body too large), 422 (a field out of bounds
or of the wrong type, named; a release URL that is bad, unreachable or too big, or a sha256
mismatch), 503 (broker or run history unreachable): each error's own ``http_status`` (:mod:`controller.errors`).
A user's value is never said back or logged beyond ~200 characters.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from controller import service
from controller.history import FrameCache
from controller.serve import links
from controller.serve.access import publish, undeclared
from controller.serve.guard import MAX_BODY_BYTES, Guard
from controller.serve.health import Health, add_health
from controller.serve.pages import mount as mount_pages
from controller.serve.routes import fleet, public, runs, trend
from controller.serve.routes.common import SessionPool, add_error_handlers, one_line, validation_line
from controller.serve.routes.trend import DEFAULT_MAX_PVALUE, DEFAULT_MIN_MAGNITUDE
from controller.serve.tokens import Identity, Role, Tokens
from controller.serve.wire import PREFIX, run_page
from controller.service import Judgement, Session
from controller.settings import ControllerSettings

__all__ = ["DEFAULT_MAX_PVALUE", "DEFAULT_MIN_MAGNITUDE", "PREFIX", "Identity", "Role", "Tokens", "create_app",
           "one_line", "summary_of", "validation_line"]

DOCS_PATH = "/docs"  # Swagger UI (no token), its files under /docs/static
ROUTERS = (public.router, runs.router, trend.router, fleet.router)  # in the schema's order


def _protected(path: str) -> bool:
    return (path == PREFIX or path.startswith(PREFIX + "/")) and path != f"{PREFIX}/openapi.json"


def create_app(settings: ControllerSettings, tokens: Tokens, frames: FrameCache | None = None,
               health: Health | None = None) -> FastAPI:
    """The API over the service, one session per worker thread (:class:`SessionPool`); ``frames``: the run frames
    they share with the rest of ``fleetctl serve`` (:class:`controller.history.FrameCache`); ``health``: its parts'
    states (``GET /health``, 503 at once while the history is down: ADR 0050). The routes read the settings, the
    tokens, the sessions and the link secret from ``app.state``."""
    sessions = SessionPool(settings, frames)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> Any:
        yield
        sessions.close()

    from fastapi_offline import FastAPIOffline

    app = FastAPIOffline(title="m1000-fleet controller", version="1", lifespan=lifespan,
                         openapi_url=f"{PREFIX}/openapi.json", docs_url=DOCS_PATH, redoc_url=None,
                         static_url=f"{DOCS_PATH}/static",
                         swagger_ui_parameters={"validatorUrl": None, "persistAuthorization": False},
                         description="Validate SGLang-MUSA releases on a fleet of M1000 modules (for CI systems).")
    app.state.settings, app.state.tokens, app.state.sessions = settings, tokens, sessions
    app.state.link_secret = links.load_secret(settings.data_dir)
    # its gate inside the token check below (added later: the outer one)
    if health is not None:
        add_health(app, health, PREFIX)
    # the token and the body's size, checked before the body is read (each route's role check stays, for the schema)
    app.add_middleware(Guard, check_token=tokens.check, protected=_protected,
                       max_body=MAX_BODY_BYTES)
    add_error_handlers(app)
    for router in ROUTERS:
        publish(router.routes)  # each route's role in the schema: x-role
        app.include_router(router)
    missing = undeclared(app.routes, _protected)
    # a route every token could call by omission: refused before the app serves anything
    if missing:
        raise RuntimeError(f"API routes without a declared role: {', '.join(missing)}")
    # the run browser under /ui
    mount_pages(app)
    return app


def summary_of(s: Session, j: Judgement) -> dict[str, Any]:
    """The webhook body of a verdict: the run as the API shows it, with the verdict line (and its page)."""
    d = service.describe_run(s, j.run_id, live=False)
    page = run_page(s.settings.serve_url, j.run_id)  # the run's page (serve_url set): a person opens it
    return {"event": "run.verdict", **service.run_summary(d.info, d.view, rows=d.rows, judgement=j),
            **({"page_url": page} if page else {})}
