"""Who is looking at a page: the API's tokens and roles, carried by a cookie instead of a header.

A browser cannot add ``Authorization: Bearer`` to a link it follows, so the login page takes a token from the
tokens file once and keeps it in a cookie (``HttpOnly``: no script reads it; ``SameSite=Strict``: no other site's
page sends it, so no other site can post a cancel form; ``Path=/ui``: the API never sees it). Each request
identifies the token again (:meth:`controller.serve.tokens.Tokens.identify`): a token removed from the file stops
the pages at the next request, as it stops the API. Each page route declares the role it needs
(:class:`PageRole`): ``read`` to look, ``trigger`` to retry or cancel the user's own runs, ``admin`` for another's
(the API's rules, :func:`controller.serve.access.may_act_on`). A form post whose ``Origin`` is another site's is
refused too (browsers without SameSite).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import quote, urlsplit

from fastapi import HTTPException, Request
from fastapi.routing import APIRoute, RouteContext

from controller.serve.access import declared_of, refusal, tokens_of, undeclared
from controller.serve.tokens import Identity, Role
from controller.serve.wire import PAGES

COOKIE = "fleet_ui"
COOKIE_AGE = 12 * 3600  # s: a day's work, then the token is asked for again


class LoginNeeded(Exception):
    """No token, or one the tokens file no longer holds: a page goes to the login page, a post gets 401."""

    def __init__(self, next_path: str) -> None:
        super().__init__("log in with a token of the API's tokens file")
        self.next_path = next_path


def login_url(next_path: str) -> str:
    return f"{PAGES}/login?next={quote(next_path, safe='/')}"


def safe_next(next_path: str) -> str:
    """Where to go after logging in: a page of this server only (never another site's address)."""
    parts = urlsplit(next_path)
    if parts.scheme or parts.netloc or not next_path.startswith(PAGES + "/") or "\\" in next_path:
        return f"{PAGES}/runs"
    return next_path


def same_origin(request: Request) -> bool:
    """Whether a post comes from this server's own page (no ``Origin``: a client that sends none, not a browser's
    cross-site form)."""
    origin = request.headers.get("origin")
    if origin is None or origin == "null" and request.headers.get("sec-fetch-site") == "same-origin":
        return True
    host = request.headers.get("host", "")
    return urlsplit(origin).netloc == host


@dataclass(frozen=True)
class PageRole:
    """A page route's declared role, as a FastAPI dependency: the viewer's :class:`Identity`, else
    :class:`LoginNeeded` (no or a stale cookie) or 403 naming both roles (:func:`controller.serve.access.refusal`)."""

    role: Role
    others: Role | None = None

    def __call__(self, request: Request) -> Identity:
        token = request.cookies.get(COOKIE)
        who = tokens_of(request).identify(token) if token else None
        if who is None:
            raise LoginNeeded(request.url.path + (f"?{request.url.query}" if request.url.query else ""))
        if request.method == "POST" and not same_origin(request):
            raise HTTPException(403, "a form posted from another site: refused")
        if not who.role.allows(self.role):
            raise HTTPException(403, refusal(who, self.role))
        return who


def page_roles(route: APIRoute | RouteContext) -> list[PageRole]:
    """The page roles ``route`` declares (the tests walk every page route with each role)."""
    return declared_of(route, PageRole)


PUBLIC_PAGES = frozenset({f"{PAGES}/login", f"{PAGES}/logout", PAGES, f"{PAGES}/"})


def undeclared_pages(routes: Sequence[object]) -> list[str]:
    """``METHOD path`` of each page route (but login and logout) that declares no role or more than one."""
    return undeclared(routes, lambda path: path.startswith(PAGES) and path not in PUBLIC_PAGES, PageRole)
