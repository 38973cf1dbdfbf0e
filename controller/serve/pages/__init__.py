"""The run browser of ``fleetctl serve``: server-rendered pages under ``/ui`` beside the HTTP API (issue 52).

Runs (filtered by release, verdict, state, module, user, date), a run (its modules' states and steps as they
change, each key's outcome and logs, the verdict, its report, retry and cancel), modules (health, reservations,
last golden check, agent version) and a module's history and events, releases (verdicts across runs, the change
points ``fleetctl trend`` names per key), the queue and the reservations. Jinja2 templates rendered here from the
service layer the API's JSON routes read (:mod:`controller.serve.pages.data`); no JavaScript build chain and no
file from elsewhere: one inline script (under a per-response CSP nonce) polls a small JSON route of the page
every 2 s while something on it runs, and puts the new texts in place (ADR 0049). Who may see and do what:
:mod:`controller.serve.pages.auth` (the API's tokens and roles, in a cookie).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qs, quote, urlencode

from fastapi import Depends, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape

from controller import service
from controller.errors import http_status_of
from controller.serve import links
from controller.serve.access import may_act_on, refusal
from controller.serve.pages import data
from controller.serve.pages.auth import (
    COOKIE,
    COOKIE_AGE,
    PAGES,
    LoginNeeded,
    PageRole,
    login_url,
    safe_next,
    undeclared_pages,
)
from controller.serve.pages.render import filters
from controller.serve.tokens import Identity, Role, Tokens
from controller.service import Session
from controller.settings import ControllerSettings

POLL_MS = 2000
MAX_FORM = 4096
LOG_LINES = 200

__all__ = ["PAGES", "mount"]


class PageError(Exception):
    """An error shown as a page: its status and one line."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


def mount(app: FastAPI, settings: ControllerSettings, tokens: Tokens, session: Callable[[], Session],
          link_secret: bytes) -> None:
    """The pages' routes on ``app``, reading through ``session`` (the API's per-thread session)."""
    env = Environment(loader=PackageLoader("controller.serve.pages", "templates"),
                      autoescape=select_autoescape(default=True, default_for_string=True))
    env.filters.update(filters())
    reader = PageRole(Role.read, tokens)
    acting = PageRole(Role.trigger, tokens, others=Role.admin)

    def render(name: str, who: Identity | None, status: int = 200, **ctx: Any) -> HTMLResponse:
        nonce = secrets.token_urlsafe(12)
        html = env.get_template(name).render(who=who, nonce=nonce, poll_ms=POLL_MS, **ctx)
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

    @app.exception_handler(LoginNeeded)
    async def _login(request: Request, exc: LoginNeeded) -> Response:
        if request.method != "GET" or request.headers.get("accept", "").startswith("application/json"):
            return JSONResponse({"detail": "log in: no token, or one no longer valid"}, status_code=401)
        return RedirectResponse(login_url(exc.next_path), status_code=303)

    @app.exception_handler(PageError)
    async def _page_error(request: Request, exc: PageError) -> Response:
        if request.headers.get("accept", "").startswith("application/json"):
            return JSONResponse({"detail": exc.detail}, status_code=exc.status)
        return render("error.html", None, exc.status, title=f"{exc.status}: not shown", detail=exc.detail)

    def refuse(who: Identity, needed: Role, what: str) -> PageError:
        return PageError(403, refusal(who, needed, what))

    @app.get(PAGES, include_in_schema=False)
    @app.get(f"{PAGES}/", include_in_schema=False)
    def home() -> Response:
        return RedirectResponse(f"{PAGES}/runs", status_code=303)

    @app.get(f"{PAGES}/login", include_in_schema=False)
    def login_page(next: str = f"{PAGES}/runs") -> HTMLResponse:
        return render("login.html", None, title="Log in", next=safe_next(next))

    @app.post(f"{PAGES}/login", include_in_schema=False)
    async def login(request: Request) -> Response:
        body = await request.body()
        if len(body) > MAX_FORM:
            raise PageError(413, f"a login form larger than {MAX_FORM} bytes")
        form = {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}
        nxt = safe_next(form.get("next", ""))
        who = tokens.identify(form.get("token", "").strip()) if form.get("token") else None
        if who is None:
            return render("login.html", None, 401, title="Log in", next=nxt,
                          error="That token is not in this controller's tokens file.")
        resp = RedirectResponse(nxt, status_code=303)
        resp.set_cookie(COOKIE, form["token"].strip(), max_age=COOKIE_AGE, path=PAGES, httponly=True,
                        samesite="strict", secure=request.url.scheme == "https")
        return resp

    @app.post(f"{PAGES}/logout", include_in_schema=False)
    def logout() -> Response:
        resp = RedirectResponse(f"{PAGES}/login", status_code=303)
        resp.delete_cookie(COOKIE, path=PAGES)
        return resp

    @app.get(f"{PAGES}/runs", include_in_schema=False)
    def runs_page(request: Request, who: Identity = Depends(reader)) -> HTMLResponse:
        try:
            f = data.RunsFilter.parse(dict(request.query_params))
        except data.FilterError as exc:
            raise PageError(400, str(exc)) from None
        page = shown(lambda: data.runs_page(session(), f))
        running = [r.run_id for r in page.runs if r.state == "running"]
        more = urlencode({**f.query(), "before": repr(page.more)}) if page.more is not None else ""
        return render("runs.html", who, title="Runs", f=f, page=page, verdicts=data.VERDICTS, states=data.STATES,
                      more_query=more, poll=f"{PAGES}/live/runs?ids={','.join(running)}" if running else None)

    @app.get(f"{PAGES}/live/runs", include_in_schema=False)
    def live_runs(ids: str = "", who: Identity = Depends(reader)) -> JSONResponse:
        wanted = [i for i in ids.split(",") if i][:data.MAX_LIMIT]
        got = shown(lambda: data.live_runs(session(), wanted))
        cells = {}
        for rid, d in got.items():
            cells[f"st-{rid}"] = {"text": d["state"], "cls": d["state"]}
            cells[f"vd-{rid}"] = {"text": d["verdict"] or "–", "cls": d["verdict"] or ""}
        return JSONResponse({"cells": cells, "done": all(d["state"] != "running" for d in got.values())})

    def key_rows(d: Any) -> list[dict[str, Any]]:
        """Each (module, model key) of the run: its outcome there ('pending' until the module ran it)."""
        out = []
        for m, p in d.view.progress.items():
            done = {o.model_key: o for o in (p.outcomes if p is not None else ())}
            for key in d.info.module_models.get(m, d.info.models):
                o = done.get(key)
                out.append({"module": m, "model_key": key, "status": str(o.status) if o else "pending",
                            "rows": o.rows if o else 0, "seconds": f"{o.duration_s:.0f}" if o else "–",
                            "error": o.error.one_line() if o and o.error else ""})
        return out

    def run_cells(d: Any) -> dict[str, Any]:
        errs = service.errors_of(d.view)
        cells: dict[str, Any] = {"run-state": {"text": d.state, "cls": d.state},
                                 "run-verdict": {"text": d.info.verdict or "not yet", "cls": d.info.verdict or ""},
                                 "run-line": {"text": d.info.verdict_line or "–"}, "run-rows": {"text": str(d.rows)}}
        for m, p in d.view.progress.items():
            pd = service.progress_dict(p)
            cells[f"m-{m}-state"] = {"text": pd["state"], "cls": pd["state"]}
            cells[f"m-{m}-step"] = {"text": pd.get("step") or "–"}
            cells[f"m-{m}-key"] = {"text": pd.get("model_key") or "–"}
            cells[f"m-{m}-keys"] = {"text": f"{pd.get('keys_done') or 0}/{pd.get('keys_total') or 0}"}
            cells[f"m-{m}-progress"] = {"text": f"{round((pd.get('progress') or 0) * 100)} %"}
            cells[f"m-{m}-error"] = {"text": "; ".join(errs.get(m, []))}
        for k in key_rows(d):
            kid = f"k-{k['module']}-{k['model_key']}"
            cells[f"{kid}-status"] = {"text": k["status"], "cls": k["status"]}
            cells[f"{kid}-rows"] = {"text": str(k["rows"])}
            cells[f"{kid}-s"] = {"text": k["seconds"]}
            cells[f"{kid}-error"] = {"text": k["error"]}
        return cells

    @app.get(f"{PAGES}/runs/{{run_id}}", include_in_schema=False)
    def run_page(run_id: str, who: Identity = Depends(reader)) -> HTMLResponse:
        s = session()
        d = shown(lambda: service.describe_run(s, run_id))
        errs = service.errors_of(d.view)
        modules = [(m, {**service.progress_dict(p), "error_line": "; ".join(errs.get(m, []))})
                   for m, p in d.view.progress.items()]
        keys = key_rows(d)
        events = s.history().events(d.info.run_id)[-50:]
        link = links.make_link(link_secret, d.info.run_id, time.time(), links.DEFAULT_TTL).path
        return render("run.html", who, title=f"Run {d.info.run_id}", run=d.info, state=d.state, rows=d.rows,
                      modules=modules, keys=keys, events=events, report_url=link,
                      may_act=may_act_on(who, d.info.started_by), can_trigger=who.role.allows(Role.trigger),
                      poll=f"{PAGES}/runs/{quote(d.info.run_id, safe='')}/live" if d.state == "running" else None)

    @app.get(f"{PAGES}/runs/{{run_id}}/live", include_in_schema=False)
    def run_live(run_id: str, who: Identity = Depends(reader)) -> JSONResponse:
        d = shown(lambda: service.describe_run(session(), run_id))
        done = d.state != "running" and d.info.verdict is not None
        return JSONResponse({"cells": run_cells(d), "done": done, "show": ["report"] if d.info.verdict else [],
                             "hide": (["no-report"] if d.info.verdict else []) + (["cancel-form"] if done else [])})

    @app.get(f"{PAGES}/runs/{{run_id}}/logs/{{module}}", include_in_schema=False)
    def run_logs(run_id: str, module: str, key: str | None = None, who: Identity = Depends(reader)) -> HTMLResponse:
        got = shown(lambda: service.logs(session(), run_id, module=module, key=key))
        files = []
        for f in got:
            lines = f.text.splitlines()
            files.append({"name": f.name, "step": f.step, "model_key": f.model_key, "path": f.path,
                          "tail": "\n".join(lines[-LOG_LINES:]), "tail_lines": min(len(lines), LOG_LINES)})
        rid = shown(lambda: service.find_run(session(), run_id)).run_id
        return render("logs.html", who, title=f"Logs of {rid} on {module}", run_id=rid, module=module, key=key,
                      files=files)

    def act(run_id: str, who: Identity, what: str) -> Any:
        info = shown(lambda: service.find_run(session(), run_id))
        if not may_act_on(who, info.started_by):
            owner = f"user {info.started_by}" if info.started_by else "a user not recorded"
            raise refuse(who, Role.admin, f"{what} run {info.run_id} (started by {owner})")
        return info

    @app.post(f"{PAGES}/runs/{{run_id}}/cancel", include_in_schema=False)
    def cancel(run_id: str, who: Identity = Depends(acting)) -> Response:
        info = act(run_id, who, "cancelling")
        shown(lambda: service.cancel(session(), info.run_id, None, user=who.user))
        return RedirectResponse(f"{PAGES}/runs/{quote(info.run_id, safe='')}", status_code=303)

    @app.post(f"{PAGES}/runs/{{run_id}}/retry", include_in_schema=False)
    def retry(run_id: str, who: Identity = Depends(acting)) -> Response:
        info = act(run_id, who, "retrying")
        got = shown(lambda: service.retry(session(), info.run_id, user=who.user))
        return RedirectResponse(f"{PAGES}/runs/{quote(got.run_id, safe='')}", status_code=303)

    @app.get(f"{PAGES}/modules", include_in_schema=False)
    def modules_page(who: Identity = Depends(reader)) -> HTMLResponse:
        rows = shown(lambda: data.modules_page(session()))
        counts = {"ok": 0, "needs attention": 0, "bad": 0, "reserved": sum(1 for r in rows if r.reserved)}
        for r in rows:
            counts[r.health] += 1
        return render("modules.html", who, title="Modules", rows=rows, counts=counts)

    @app.get(f"{PAGES}/modules/{{name}}", include_in_schema=False)
    def module_page(name: str, who: Identity = Depends(reader)) -> HTMLResponse:
        page = shown(lambda: data.module_page(session(), name))
        return render("module.html", who, title=f"Module {name}", page=page)

    @app.get(f"{PAGES}/releases", include_in_schema=False)
    def releases_page(who: Identity = Depends(reader)) -> HTMLResponse:
        s = session()
        rows = shown(lambda: data.releases_page(s))
        trend = shown(lambda: data.release_trend(s))
        at: dict[str, int] = {}
        for c in trend.records:
            at[c["release"]] = at.get(c["release"], 0) + 1
        return render("releases.html", who, title="Releases", rows=rows, trend=trend, at=at, verdicts=data.VERDICTS)

    @app.get(f"{PAGES}/releases/{{release}}", include_in_schema=False)
    def release_page(release: str, who: Identity = Depends(reader)) -> HTMLResponse:
        s = session()
        runs = shown(lambda: data.release_runs(s, release))
        trend = shown(lambda: data.release_trend(s))
        by_key: dict[str, list[dict[str, Any]]] = {}
        for c in sorted(trend.records, key=lambda c: c["release"] != release):
            by_key.setdefault(c["model_key"], []).append(c)
        counts: dict[str, int] = {}
        for r in runs:
            counts[r.verdict or ""] = counts.get(r.verdict or "", 0) + 1
        return render("release.html", who, title=f"Release {release}", release=release, runs=runs, trend=trend,
                      by_key=sorted(by_key.items()), counts=sorted(counts.items()))

    @app.get(f"{PAGES}/queue", include_in_schema=False)
    def queue_page(who: Identity = Depends(reader)) -> HTMLResponse:
        from controller.service.queue import queue
        from controller.service.reservations import reservation_dict, reservations

        s = session()
        q = shown(lambda: queue(s, waits=False))  # the waits' stats read the whole history: fleetctl queue
        held = [reservation_dict(r) for r in shown(lambda: reservations(s))]
        return render("queue.html", who, title="Queue", q=q, held=held)

    missing = undeclared_pages(app.routes)
    if missing:  # a page every token (or none) could open by omission: refused before anything is served
        raise RuntimeError(f"pages without a declared role: {', '.join(missing)}")
