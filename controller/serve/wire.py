"""What the HTTP API says besides a body, for ``fleetctl report --service`` and ``fleetctl trend --service``
(:mod:`controller.cli.served`): header names both sides import (no dependency: the CLI's client stays lean).

Values are ASCII: a text is a JSON string (``json.dumps``, non-ASCII escaped), a list a JSON list."""

from __future__ import annotations

import json
from collections.abc import Sequence
from urllib.parse import quote

PREFIX = "/api/v1"
# the run a report is of, 'latest' or a prefix resolved (a JSON string)
RUN_HEADER = "X-Fleet-Run"
# pass, regressed, incomplete, failed
VERDICT_HEADER = "X-Fleet-Verdict"
# the report's one-line verdict (a JSON string)
VERDICT_LINE_HEADER = "X-Fleet-Verdict-Line"
# the environment changes fleetctl report warns of (a JSON list of strings)
WARNINGS_HEADER = "X-Fleet-Warnings"
# a trend: how many releases the history holds (its "no change points" line)
RELEASES_HEADER = "X-Fleet-Releases"
# a trend with none: the smallest step it could have found (a JSON string)
REACH_HEADER = "X-Fleet-Reach"


def report_headers(run_id: str, verdict: str, line: str, warnings: Sequence[str]) -> dict[str, str]:
    """The headers of a report's response."""
    return {RUN_HEADER: json.dumps(run_id), VERDICT_HEADER: verdict, VERDICT_LINE_HEADER: json.dumps(line),
            WARNINGS_HEADER: json.dumps(list(warnings))}


PAGES = "/ui"  # the run browser's pages (controller.serve.pages)


def page_path(run_id: str) -> str:
    """A run's page's path (the run browser, :mod:`controller.serve.pages`)."""
    return f"{PAGES}/runs/{quote(run_id, safe='')}"


def run_page(base: str | None, run_id: str) -> str | None:
    """A run's page under ``fleetctl serve``'s address (the ``serve_url`` setting; None: not set): what
    ``fleetctl validate`` prints and the webhooks carry."""
    return None if not base else base.rstrip("/") + page_path(run_id)
