"""The run browser's pages of the fleet: modules (health, reservations, last golden check, agent version) and a
module's history and events, releases (verdicts across runs, the change points ``fleetctl trend`` names per key)
and one release, the queue and the reservations."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import HTMLResponse

from controller.serve.pages import data
from controller.serve.pages.auth import PAGES
from controller.serve.pages.view import READER, render, shown
from controller.serve.routes.common import Pool
from controller.serve.tokens import Identity
from controller.service.queue import queue
from controller.service.reservations import reservation_dict, reservations

router = APIRouter(include_in_schema=False)


@router.get(f"{PAGES}/modules")
def modules_page(pool: Pool, who: Identity = Depends(READER)) -> HTMLResponse:
    rows = shown(lambda: data.modules_page(pool()))
    counts = {"ok": 0, "needs attention": 0, "bad": 0, "reserved": sum(1 for r in rows if r.reserved)}
    for r in rows:
        counts[r.health] += 1
    return render("modules.html", who, title="Modules", rows=rows, counts=counts)


@router.get(f"{PAGES}/modules/{{name}}")
def module_page(name: str, pool: Pool, who: Identity = Depends(READER)) -> HTMLResponse:
    page = shown(lambda: data.module_page(pool(), name))
    return render("module.html", who, title=f"Module {name}", page=page)


@router.get(f"{PAGES}/releases")
def releases_page(pool: Pool, who: Identity = Depends(READER)) -> HTMLResponse:
    s = pool()
    rows = shown(lambda: data.releases_page(s))
    trend = shown(lambda: data.release_trend(s))
    at: dict[str, int] = {}
    for c in trend.records:
        at[c["release"]] = at.get(c["release"], 0) + 1
    return render("releases.html", who, title="Releases", rows=rows, trend=trend, at=at, verdicts=data.VERDICTS)


@router.get(f"{PAGES}/releases/{{release}}")
def release_page(release: str, pool: Pool, who: Identity = Depends(READER)) -> HTMLResponse:
    s = pool()
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


@router.get(f"{PAGES}/queue")
def queue_page(pool: Pool, who: Identity = Depends(READER)) -> HTMLResponse:
    s = pool()
    q = shown(lambda: queue(s, waits=False))  # the waits' stats read the whole history: fleetctl queue
    held = [reservation_dict(r) for r in shown(lambda: reservations(s))]
    return render("queue.html", who, title="Queue", q=q, held=held)
