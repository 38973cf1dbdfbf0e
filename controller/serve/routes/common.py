"""What the API's route modules share, as FastAPI dependencies on the app's state rather than closures: the
service sessions (one per worker thread), the link secret, the role each route declares, and the mapping of a
service error to its HTTP status and one line (:mod:`controller.errors`)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from controller.errors import http_status_of
from controller.history import FrameCache
from controller.serve.access import RoleCheck
from controller.serve.routes.models import MAX_DETAIL, MAX_NAME
from controller.serve.tokens import Role
from controller.service import Session
from controller.service.release_url import MAX_SHOWN, clip
from controller.settings import ControllerSettings


class SessionPool:
    """One service session per worker thread (SQLite connections are per thread), opened on first use there and
    closed together when the app stops; ``frames``: the run frames they share with the rest of ``fleetctl serve``
    (:class:`controller.history.FrameCache`)."""

    def __init__(self, settings: ControllerSettings, frames: FrameCache | None = None) -> None:
        self.settings, self.frames = settings, frames
        self._local = threading.local()
        self._sessions: list[Session] = []
        self._lock = threading.Lock()

    def __call__(self) -> Session:
        """This thread's session (call it in the route's own thread, not in a dependency: those run elsewhere)."""
        s: Session | None = getattr(self._local, "session", None)
        if s is None:
            s = self._local.session = Session(self.settings, frames=self.frames)
            with self._lock:
                self._sessions.append(s)
        return s

    def close(self) -> None:
        with self._lock:
            for s in self._sessions:
                s.close()
            self._sessions.clear()


async def _pool(request: Request) -> SessionPool:  # async: read on the event loop, no worker thread taken
    pool = request.app.state.sessions
    assert isinstance(pool, SessionPool)
    return pool


async def _link_secret(request: Request) -> bytes:
    secret = request.app.state.link_secret
    assert isinstance(secret, bytes)
    return secret


Pool = Annotated[SessionPool, Depends(_pool)]
LinkSecret = Annotated[bytes, Depends(_link_secret)]

# the role each route needs (its token checked again there, to know whose it is): read, trigger, admin
READ = RoleCheck(Role.read)
TRIGGER = RoleCheck(Role.trigger)
ACT_ON = RoleCheck(Role.trigger, others=Role.admin)  # the token's user's own work; another's needs admin
ADMIN = RoleCheck(Role.admin)
READS = [Depends(READ)]

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


def answer(fn: Callable[[], Any], *values: str | None) -> Any:
    """``fn()``, a service error raised as its own HTTP status with its one line (``values``: the user's values
    the line may hold, clipped); any other exception is a bug: a 500."""
    try:
        return fn()
    except Exception as exc:
        status = http_status_of(exc)
        if status is None:
            raise
        line = one_line(str(exc), tuple(v for v in values if v))
        raise HTTPException(status, line or type(exc).__name__) from None


async def _http_error(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, HTTPException)
    return JSONResponse({"detail": clip(str(exc.detail), MAX_DETAIL)}, status_code=exc.status_code,
                        headers=exc.headers)


async def _invalid(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    return JSONResponse({"detail": validation_line(exc)}, status_code=422)


def add_error_handlers(app: FastAPI) -> None:
    """Errors as ``{"detail": "<one line>"}``: an HTTP error's own status, a request off the schema a 422 naming
    the field."""
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _invalid)
