"""The run history's records as callers get them: runs, webhook events, and the history's error.

The history's one error root (:class:`HistoryError`) and the names of the events it keeps
(:data:`VERDICT_EVENT`, :data:`CHANGE_POINT_EVENT`, :data:`RESET_EVENT`, :data:`GOLDEN_DRIFT_EVENT`) live here too.
"""

from __future__ import annotations

import hashlib

from pydantic import BaseModel, ConfigDict

from controller.errors import FleetctlError

VERDICT_EVENT = "run.verdict"
# a run made new change points across the release history detectable
CHANGE_POINT_EVENT = "trend.change_point"
# an ended run's search for the change points it made detectable, queued for `fleetctl serve` (never sent: its
# outcome is a CHANGE_POINT_EVENT, when there is one)
CHANGE_CHECK_EVENT = "trend.check"
# the module event of `fleetctl devices reset` (the module's failed runs cleared)
RESET_EVENT = "failures reset"
# the module event of a golden check it failed: bad until the next reset
GOLDEN_DRIFT_EVENT = "golden drift"
# how a golden check's run note starts (``golden check REL``): never a previous run
GOLDEN_NOTE = "golden check"


class UnsentRequest(BaseModel):
    """A run request recorded with its part and not yet sent to the module's queue (ADR 0060): ``payload`` as the
    module's agent reads it, sent at ``priority`` for ``started_by``."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    module: str
    payload: dict[str, object]
    priority: str
    started_by: str
    created_at: float


class OutboxEvent(BaseModel):
    """A webhook event waiting for the URLs it has not reached yet (``urls``: their sha256)."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    event: str
    verdict: str
    line: str
    state: str
    created_at: float
    urls: tuple[str, ...]
    # JSON the event carries beyond the run's summary ('' for a verdict)
    payload: str = ""

    @property
    def delivery_id(self) -> str:
        """Stable across resends (a receiver may de-duplicate on it)."""
        return hashlib.sha256(f"{self.run_id}\0{self.event}".encode()).hexdigest()[:32]


def url_digest(url: str) -> str:
    return hashlib.sha256(url.encode()).hexdigest()


class HistoryError(FleetctlError, RuntimeError):
    """No such run or baseline in the history, an ambiguous run id prefix, or a history file that cannot be opened."""

    http_status = 404  # no such run or baseline in the history


class HistoryUnavailable(HistoryError, ConnectionError):
    """A PostgreSQL history's server cannot be reached, or dropped the connection (HTTP 503). The next use of the
    history connects again."""

    http_status = 503


class HistoryStopped(HistoryError):
    """The PostgreSQL server refused or stopped a statement it could reach: its ``statement_timeout`` (or an
    administrator's cancel), or its disk full (HTTP 503). The connection stays usable; the same call may succeed
    later."""

    http_status = 503


class HistoryFull(HistoryStopped):
    """The PostgreSQL server refused a write: its disk is full (HTTP 503). Every write fails until space is freed."""


class RunInfo(BaseModel):
    model_config = ConfigDict(frozen=True)

    run_id: str
    created_at: float
    release: str
    tarball: str
    sha256: str
    models: tuple[str, ...]
    modules: tuple[str, ...]
    kind: str
    state: str
    verdict: str | None
    finished_at: float | None
    note: str
    # the line of the verdict recorded last (None: not judged since it ended)
    verdict_line: str | None = None
    # the modules asked for only some of ``models`` (``fleetctl retry --failed-only``: the keys that did not pass
    # there), and those keys; every other module was asked for all of ``models``
    module_models: dict[str, tuple[str, ...]] = {}
    # what it was dispatched at (contract.priority), the last time it was
    priority: str = "normal"
    # when it was last dispatched (a resume too); None: at created_at
    dispatched_at: float | None = None
    # who started it: the API token's user, or the CLI's identity (controller.identity); '' when not known (a run
    # from before runs recorded it, a baseline)
    started_by: str = ""

    def models_of(self, module: str) -> tuple[str, ...]:
        """The model keys ``module`` was asked for in this run."""
        return self.module_models.get(module, self.models)
