"""The run browser's pages of runs, and logging in: the runs list (filtered), a run (its modules' states and
steps as they change, each key's outcome, the verdict, its report, retry and cancel) and its logs, each page's
small JSON route its script polls."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import parse_qs, quote, urlencode

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response

from controller import service
from controller.serve import links
from controller.serve.access import may_act_on, tokens_of
from controller.serve.pages import data
from controller.serve.pages.auth import COOKIE, COOKIE_AGE, PAGES, safe_next
from controller.serve.pages.view import ACTING, READER, PageError, refuse, render, shown
from controller.serve.routes.common import LinkSecret, Pool
from controller.serve.tokens import Identity, Role

MAX_FORM = 4096
LOG_LINES = 200

router = APIRouter(include_in_schema=False)


@router.get(PAGES)
@router.get(f"{PAGES}/")
def home() -> Response:
    return RedirectResponse(f"{PAGES}/runs", status_code=303)


@router.get(f"{PAGES}/login")
def login_page(next: str = f"{PAGES}/runs") -> HTMLResponse:
    return render("login.html", None, title="Log in", next=safe_next(next))


@router.post(f"{PAGES}/login")
async def login(request: Request) -> Response:
    body = await request.body()
    if len(body) > MAX_FORM:
        raise PageError(413, f"a login form larger than {MAX_FORM} bytes")
    form = {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items()}
    nxt = safe_next(form.get("next", ""))
    who = tokens_of(request).identify(form.get("token", "").strip()) if form.get("token") else None
    if who is None:
        return render("login.html", None, 401, title="Log in", next=nxt,
                      error="That token is not in this controller's tokens file.")
    resp = RedirectResponse(nxt, status_code=303)
    resp.set_cookie(COOKIE, form["token"].strip(), max_age=COOKIE_AGE, path=PAGES, httponly=True,
                    samesite="strict", secure=request.url.scheme == "https")
    return resp


@router.post(f"{PAGES}/logout")
def logout() -> Response:
    resp = RedirectResponse(f"{PAGES}/login", status_code=303)
    resp.delete_cookie(COOKIE, path=PAGES)
    return resp


@router.get(f"{PAGES}/runs")
def runs_page(request: Request, pool: Pool, who: Identity = Depends(READER)) -> HTMLResponse:
    try:
        f = data.RunsFilter.parse(dict(request.query_params))
    except data.FilterError as exc:
        raise PageError(400, str(exc)) from None
    page = shown(lambda: data.runs_page(pool(), f))
    running = [r.run_id for r in page.runs if r.state == "running"]
    more = urlencode({**f.query(), "before": repr(page.more)}) if page.more is not None else ""
    return render("runs.html", who, title="Runs", f=f, page=page, verdicts=data.VERDICTS, states=data.STATES,
                  more_query=more, poll=f"{PAGES}/live/runs?ids={','.join(running)}" if running else None)


@router.get(f"{PAGES}/live/runs")
def live_runs(pool: Pool, ids: str = "", who: Identity = Depends(READER)) -> JSONResponse:
    wanted = [i for i in ids.split(",") if i][:data.MAX_LIMIT]
    got = shown(lambda: data.live_runs(pool(), wanted))
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
    """The texts of a run's page its poll puts in place, by element id."""
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


@router.get(f"{PAGES}/runs/{{run_id}}")
def run_page(run_id: str, pool: Pool, secret: LinkSecret, who: Identity = Depends(READER)) -> HTMLResponse:
    s = pool()
    d = shown(lambda: service.describe_run(s, run_id))
    errs = service.errors_of(d.view)
    modules = [(m, {**service.progress_dict(p), "error_line": "; ".join(errs.get(m, []))})
               for m, p in d.view.progress.items()]
    keys = key_rows(d)
    events = s.history().events(d.info.run_id)[-50:]
    link = links.make_link(secret, d.info.run_id, time.time(), links.DEFAULT_TTL).path
    return render("run.html", who, title=f"Run {d.info.run_id}", run=d.info, state=d.state, rows=d.rows,
                  modules=modules, keys=keys, events=events, report_url=link,
                  may_act=may_act_on(who, d.info.started_by), can_trigger=who.role.allows(Role.trigger),
                  poll=f"{PAGES}/runs/{quote(d.info.run_id, safe='')}/live" if d.state == "running" else None)


@router.get(f"{PAGES}/runs/{{run_id}}/live")
def run_live(run_id: str, pool: Pool, who: Identity = Depends(READER)) -> JSONResponse:
    d = shown(lambda: service.describe_run(pool(), run_id))
    done = d.state != "running" and d.info.verdict is not None
    return JSONResponse({"cells": run_cells(d), "done": done, "show": ["report"] if d.info.verdict else [],
                         "hide": (["no-report"] if d.info.verdict else []) + (["cancel-form"] if done else [])})


@router.get(f"{PAGES}/runs/{{run_id}}/logs/{{module}}")
def run_logs(run_id: str, module: str, pool: Pool, key: str | None = None,
             who: Identity = Depends(READER)) -> HTMLResponse:
    got = shown(lambda: service.logs(pool(), run_id, module=module, key=key))
    files = []
    for f in got:
        lines = f.text.splitlines()
        files.append({"name": f.name, "step": f.step, "model_key": f.model_key, "path": f.path,
                      "tail": "\n".join(lines[-LOG_LINES:]), "tail_lines": min(len(lines), LOG_LINES)})
    rid = shown(lambda: service.find_run(pool(), run_id)).run_id
    return render("logs.html", who, title=f"Logs of {rid} on {module}", run_id=rid, module=module, key=key,
                  files=files)


def act(pool: Pool, run_id: str, who: Identity, what: str) -> Any:
    """The run ``who`` acts on, when ``who`` may (its own with trigger, another's with admin)."""
    info = shown(lambda: service.find_run(pool(), run_id))
    if not may_act_on(who, info.started_by):
        owner = f"user {info.started_by}" if info.started_by else "a user not recorded"
        raise refuse(who, Role.admin, f"{what} run {info.run_id} (started by {owner})")
    return info


@router.post(f"{PAGES}/runs/{{run_id}}/cancel")
def cancel(run_id: str, pool: Pool, who: Identity = Depends(ACTING)) -> Response:
    info = act(pool, run_id, who, "cancelling")
    shown(lambda: service.cancel(pool(), info.run_id, None, user=who.user))
    return RedirectResponse(f"{PAGES}/runs/{quote(info.run_id, safe='')}", status_code=303)


@router.post(f"{PAGES}/runs/{{run_id}}/retry")
def retry(run_id: str, pool: Pool, who: Identity = Depends(ACTING)) -> Response:
    info = act(pool, run_id, who, "retrying")
    got = shown(lambda: service.retry(pool(), info.run_id, user=who.user))
    return RedirectResponse(f"{PAGES}/runs/{quote(got.run_id, safe='')}", status_code=303)
