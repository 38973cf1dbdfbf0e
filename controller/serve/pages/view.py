"""What the run browser's page routes share: the templates and the response headers of a page, the page roles
(:class:`controller.serve.pages.auth.PageRole`), the session pool of the API, and an error shown as a page (or
as JSON to a page's poll)."""

from __future__ import annotations

import secrets
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape

from controller.errors import http_status_of
from controller.serve.access import refusal
from controller.serve.pages.auth import LoginNeeded, PageRole, login_url
from controller.serve.pages.render import filters
from controller.serve.tokens import Identity, Role

POLL_MS = 2000

READER = PageRole(Role.read)
ACTING = PageRole(Role.trigger, others=Role.admin)  # the viewer's own run; another's needs admin

_ENV = Environment(loader=PackageLoader("controller.serve.pages", "templates"),
                   autoescape=select_autoescape(default=True, default_for_string=True))
_ENV.filters.update(filters())


class PageError(Exception):
    """An error shown as a page: its status and one line."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


def render(name: str, who: Identity | None, status: int = 200, **ctx: Any) -> HTMLResponse:
    """The template ``name`` as a page, its one inline script allowed by a nonce of this response only."""
    nonce = secrets.token_urlsafe(12)
    html = _ENV.get_template(name).render(who=who, nonce=nonce, poll_ms=POLL_MS, **ctx)
    return HTMLResponse(html, status_code=status, headers={
        "Cache-Control": "private, no-store", "Referrer-Policy": "same-origin", "X-Content-Type-Options": "nosniff",
        "Content-Security-Policy": f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'unsafe-inline'; "
                                   "connect-src 'self'; img-src 'self' data:; form-action 'self'; "
                                   "frame-ancestors 'none'; base-uri 'none'"})


def shown(fn: Callable[[], Any]) -> Any:
    """``fn()``, its service error a page with the error's own status (controller.errors)."""
    try:
        return fn()
    except PageError:
        raise
    except Exception as exc:
        status = http_status_of(exc)
        if status is None:
            raise
        raise PageError(status, str(exc).strip().splitlines()[0][:500] if str(exc).strip() else
                        type(exc).__name__) from None


def refuse(who: Identity, needed: Role, what: str) -> PageError:
    return PageError(403, refusal(who, needed, what))


async def _login(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, LoginNeeded)
    if request.method != "GET" or request.headers.get("accept", "").startswith("application/json"):
        return JSONResponse({"detail": "log in: no token, or one no longer valid"}, status_code=401)
    return RedirectResponse(login_url(exc.next_path), status_code=303)


async def _page_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, PageError)
    if request.headers.get("accept", "").startswith("application/json"):
        return JSONResponse({"detail": exc.detail}, status_code=exc.status)
    return render("error.html", None, exc.status, title=f"{exc.status}: not shown", detail=exc.detail)


def add_page_handlers(app: FastAPI) -> None:
    """A viewer not logged in goes to the login page (a post or a poll gets 401); a :class:`PageError` is a page."""
    app.add_exception_handler(LoginNeeded, _login)
    app.add_exception_handler(PageError, _page_error)
