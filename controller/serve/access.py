"""Which role each route of the HTTP API needs, and the check that enforces it.

Every route under ``/api/v1`` (but the schema) declares a :class:`RoleCheck` among its own dependencies: the
role its caller needs (``read``: look; ``trigger``: start, resume, retry, cancel its own runs; ``admin``:
act on others' work). :func:`undeclared` lists the routes that declare none, and the app refuses to start
with any (a new route cannot be reachable by every token by omission). The routes live on routers
(:mod:`controller.serve.routes`) that the app includes: :func:`api_routes` walks what the app serves, each
route with its path and dependencies as included (an included router is one entry of ``app.routes``). The
token itself was checked before the body was read (:class:`controller.serve.guard.Guard`, 401); this check
runs before the route's query and body are validated, so a caller without the role learns nothing from a 422.
A refusal is 403 with one line naming the role needed and the caller's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import Depends, HTTPException, Request
from fastapi.routing import APIRoute, RouteContext, iter_route_contexts
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from controller.serve.guard import UNAUTHORIZED
from controller.serve.tokens import Identity, Role, Tokens


def refusal(who: Identity, needed: Role, what: str = "") -> str:
    """The one line of a 403 (pure)."""
    return f"{what or 'this'} needs role {needed.value}; user {who.user} has role {who.role.value}"


def may_act_on(who: Identity, owner: str) -> bool:
    """Whether ``who`` may act on work ``owner`` started (cancel a run): its own with ``trigger``, anyone's with
    ``admin``. Work of no recorded owner ('': from before runs recorded it) is others' (pure)."""
    return who.role.allows(Role.admin) or (who.role.allows(Role.trigger) and bool(owner) and owner == who.user)


C = TypeVar("C")

BEARER = HTTPBearer(auto_error=False, description="a token from the controller's API tokens file")


def tokens_of(request: Request) -> Tokens:
    """The app's tokens (``app.state.tokens``, set by :func:`controller.serve.api.create_app`)."""
    tokens = request.app.state.tokens
    assert isinstance(tokens, Tokens)
    return tokens


@dataclass(frozen=True)
class RoleCheck:
    """A route's declared role, as a FastAPI dependency: the caller's :class:`Identity` when its role allows,
    else 401 (no or a wrong token) or 403. ``others``: the role needed to act on another user's work, where
    the route does (checked by the route with :func:`may_act_on`; declared here for the docs and the tests).
    The tokens are the app's (:func:`tokens_of`): a route module declares its checks without them."""

    role: Role
    others: Role | None = None

    def __call__(self, request: Request,
                 creds: HTTPAuthorizationCredentials | None = Depends(BEARER)) -> Identity:
        who = None
        if creds is not None and creds.scheme.lower() == "bearer":
            who = tokens_of(request).identify(creds.credentials)
        if who is None:
            raise HTTPException(401, UNAUTHORIZED, headers={"WWW-Authenticate": "Bearer"})
        if not who.role.allows(self.role):
            raise HTTPException(403, refusal(who, self.role))
        return who


def api_routes(routes: Sequence[Any]) -> Iterator[RouteContext]:
    """Each API route the app serves (``app.routes``, its included routers walked), as included: its ``path``,
    ``methods`` and ``dependant`` (the route's own dependencies and its routers')."""
    for ctx in iter_route_contexts(routes):
        if isinstance(ctx.original_route, APIRoute):
            yield ctx


def declared_of(route: APIRoute | RouteContext, kind: type[C]) -> list[C]:
    """The role checks of ``kind`` ``route`` declares (in its dependencies, or as a parameter's): the API's
    :class:`RoleCheck`, or the run browser's page roles."""
    out: list[C] = []
    stack = list(route.dependant.dependencies)
    while stack:
        dep = stack.pop()
        if isinstance(dep.call, kind):
            out.append(dep.call)
        stack.extend(dep.dependencies)
    return out


def declared(route: APIRoute | RouteContext) -> list[RoleCheck]:
    """The API role checks ``route`` declares."""
    return declared_of(route, RoleCheck)


def undeclared(routes: Sequence[object], protected: Callable[[str], bool],
               kind: type[Any] = RoleCheck) -> list[str]:
    """``METHOD path`` of each protected route that declares no role (of ``kind``), or more than one role (pure on
    the routes)."""
    bad: list[str] = []
    for r in api_routes(routes):
        if protected(r.path or "") and len({c.role for c in declared_of(r, kind)}) != 1:
            bad.extend(f"{m} {r.path}" for m in sorted(r.methods or ()))
    return bad


def publish(routes: Sequence[object]) -> None:
    """Each route's declared role in the OpenAPI schema: ``x-role`` (and ``x-role-others``: the role acting on
    another user's work needs), so clients and the reference page read it from the routes themselves. Called on
    a router's own routes before the app includes it (an inclusion copies each route's ``openapi_extra``)."""
    for r in routes:
        if isinstance(r, APIRoute):
            for c in declared(r)[:1]:
                extra = {"x-role": c.role.value, **({"x-role-others": c.others.value} if c.others else {})}
                r.openapi_extra = {**(r.openapi_extra or {}), **extra}
