"""The API's trend route: change points across the releases in the run history, the records ``fleetctl trend -o
json`` prints (:mod:`controller.report.trend`).

Lazy imports: :mod:`controller.report.trend` loads pandas and numpy (462 and 153 ms of CPU:
``bench/import_costs.py``, bench/results/import_costs_20261207_0346_lazy-libraries.txt) at the first trend asked
for, not when the API starts.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Query
from fastapi.responses import Response

from contract.records import parse_model_keys
from controller import service
from controller.serve.routes.common import READS, Pool, answer
from controller.serve.routes.models import ERRORS, MAX_NAME, MAX_SELECTOR
from controller.serve.trend_record import TrendRecord
from controller.serve.wire import PREFIX, REACH_HEADER, RELEASES_HEADER

# fleetctl trend's and the detector's (tests/api/test_trend.py checks they agree)
DEFAULT_MIN_MAGNITUDE = 0.03
DEFAULT_MAX_PVALUE = 0.002

router = APIRouter()


@router.get(f"{PREFIX}/trend", response_model=list[TrendRecord], dependencies=READS, responses=ERRORS)
def get_trend(response: Response, pool: Pool,
              models: str = Query("all", min_length=1, max_length=MAX_SELECTOR,
                                  description="model keys, comma separated, or 'all'"),
              profile: str | None = Query(None, min_length=1, max_length=MAX_NAME, description="only this profile"),
              metric: str | None = Query(None, min_length=1, max_length=MAX_NAME,
                                         description="only this metric (e.g. decode_tps)"),
              devices: str = Query("all", min_length=1, max_length=MAX_SELECTOR,
                                   description="'all' or module names, comma separated (per-module series of "
                                               "those; the fleet series are over every module)"),
              min_magnitude: float = Query(DEFAULT_MIN_MAGNITUDE, ge=0, lt=1,
                                           description="smallest relative change reported"),
              max_pvalue: float = Query(DEFAULT_MAX_PVALUE, gt=0, le=1,
                                        description="largest p-value of a change point")) -> list[TrendRecord]:
    """Change points across the releases in the run history: the records of ``fleetctl trend -o json`` (how
    many releases the history holds in the header ``X-Fleet-Releases``; with none, the smallest step it could
    have found in ``X-Fleet-Reach``)."""
    def query() -> Any:
        from controller.report.trend import TrendQuery, settings_of

        names = None if devices == "all" else frozenset(d.strip() for d in devices.split(",") if d.strip())
        return service.trend(pool(), TrendQuery(
            models=None if models == "all" else tuple(parse_model_keys(models)), profile=profile, metric=metric,
            devices=names, settings=settings_of(min_magnitude, max_pvalue)))

    got = answer(query, models, profile, metric, devices)
    response.headers[RELEASES_HEADER] = str(got.releases)
    if got.reach is not None:
        response.headers[REACH_HEADER] = json.dumps(got.reach.line())
    return [TrendRecord(**r) for r in got.records]
