"""The API's routes outside ``/api/v1`` that need no bearer token: the HTML report behind a signed link (the
signature is the credential: :mod:`controller.serve.links`) and an empty favicon.

Lazy imports: the HTML report (:mod:`controller.report.render.html`) loads pandas (462 ms of CPU, 88 MiB; the HTML
report matplotlib too, 542 ms, 49 MiB: ``bench/import_costs.py``,
bench/results/import_costs_20261207_0346_lazy-libraries.txt) at the first link opened, not when the API starts.
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Query
from fastapi.responses import Response

from controller import service
from controller.serve import links
from controller.serve.routes.common import LinkSecret, Pool, RunId, answer
from controller.serve.wire import page_path

router = APIRouter()


@router.get("/favicon.ico", include_in_schema=False)
def favicon() -> Response:
    """Browsers opening the HTML report ask for it: no icon, no error."""
    return Response(status_code=204)


@router.get(f"{links.LINK_PREFIX}/{{run_id}}/report.html", include_in_schema=False)
def linked_report(run_id: RunId, pool: Pool, secret: LinkSecret, expires: int = Query(...),
                  sig: str = Query(..., max_length=128)) -> Response:
    """The HTML report behind a signed link (no bearer header: the signature is the credential)."""
    answer(lambda: links.check_link(secret, links.report_path(run_id), expires, sig, time.time()))
    rep = answer(lambda: service.report(pool(), run_id, with_history=True), run_id)
    from controller.report.render.html import to_html

    return Response(to_html(rep, page_path(rep.run_id)),
                    media_type="text/html; charset=utf-8",
                    headers={"Cache-Control": "private, no-store", "Referrer-Policy": "no-referrer"})
