"""The run browser of ``fleetctl serve``: server-rendered pages under ``/ui`` beside the HTTP API (issue 52).

Runs (filtered by release, verdict, state, module, user, date), a run (its modules' states and steps as they
change, each key's outcome and logs, the verdict, its report, retry and cancel), modules (health, reservations,
last golden check, agent version) and a module's history and events, releases (verdicts across runs, the change
points ``fleetctl trend`` names per key), the queue and the reservations. Jinja2 templates rendered here from the
service layer the API's JSON routes read (:mod:`controller.serve.pages.data`); no JavaScript build chain and no
file from elsewhere: one inline script (under a per-response CSP nonce) polls a small JSON route of the page
every 2 s while something on it runs, and puts the new texts in place (ADR 0049). Who may see and do what:
:mod:`controller.serve.pages.auth` (the API's tokens and roles, in a cookie). The routes are
routers on the API's app, sharing its session pool (:mod:`controller.serve.routes.common`):
:mod:`~controller.serve.pages.runs` (runs, a run, its logs; logging in) and :mod:`~controller.serve.pages.fleet`
(modules, releases, the queue), over :mod:`~controller.serve.pages.view` (templates, page errors).
"""

from __future__ import annotations

from fastapi import FastAPI

from controller.serve.pages import fleet, runs
from controller.serve.pages.auth import PAGES, undeclared_pages
from controller.serve.pages.view import add_page_handlers

__all__ = ["PAGES", "mount"]


def mount(app: FastAPI) -> None:
    """The pages' routes on ``app`` (the API's: its tokens, sessions and link secret in ``app.state``)."""
    add_page_handlers(app)
    app.include_router(runs.router)
    app.include_router(fleet.router)
    missing = undeclared_pages(app.routes)
    # a page every token (or none) could open by omission: refused before anything is served
    if missing:
        raise RuntimeError(f"pages without a declared role: {', '.join(missing)}")
