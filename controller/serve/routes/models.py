"""The API's wire models: the bodies its routes take and give (:mod:`controller.serve.routes`), each field
bounded and described (the OpenAPI schema, the reference page)."""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from contract.priority import Priority
from controller.fleet.reservations import OnReserved

# field bounds: a release is a path (PATH_MAX) or a URL (a signed one is a few KiB); a run id is 1-128 characters
MAX_RELEASE = 4096
MAX_SELECTOR = 1024
MAX_NAME = 128
MAX_MODELS = 64
MAX_DETAIL = 500  # characters of an error's one line, at most



class WireModel(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Problem(WireModel):
    detail: str


ModelKey = Annotated[str, StringConstraints(min_length=1, max_length=MAX_NAME)]


class RunCreate(WireModel):
    release: str = Field(..., min_length=1, max_length=MAX_RELEASE,
                         description="the release tarball: a path as the controller sees it, or an http/https URL "
                                     "the controller downloads (no credentials in it)")
    sha256: str | None = Field(None, pattern="^[0-9a-fA-F]{64}$",
                               description="sha256 the release must have (checked before dispatch)")
    models: list[ModelKey] | Annotated[str, StringConstraints(min_length=1, max_length=MAX_SELECTOR)] = Field(
        "all", max_length=MAX_MODELS, description="model keys, or 'all'")
    devices: str = Field("all", min_length=1, max_length=MAX_SELECTOR,
                         description="'all', module names, label=value; comma separated")
    baseline: str | None = Field(None, min_length=1, max_length=MAX_NAME,
                                 description="baseline: release, release@vN or a run id")
    run_id: str | None = Field(None, min_length=1, max_length=MAX_NAME, description="run id (default: generated)")
    resume: bool = Field(False, description="run_id names an existing run: resume it")
    priority: Priority = Field("normal", description="urgent, high, normal or low: a module that frees up starts "
                                                     "the highest first; a run waiting long is raised a level")
    preempt: bool = Field(False, description="with priority urgent: the modules' running runs stop for it at once "
                                             "and resume from their passed keys after it")
    on_reserved: OnReserved = Field("skip", description="a selected module another user reserved: skip it (the run "
                                    "waits there only when every selected module is reserved) or wait there")


class RunCreated(WireModel):
    run_id: str = Field(description="the run's id (generated unless the request named one)")
    release: str = Field(description="the release's version, from the tarball's name")
    sha256: str = Field(description="the tarball's sha256")
    models: list[str] = Field(description="the model keys the run validates")
    modules: dict[str, str] = Field(description="module -> 'queued' or why it was not")
    queued: int = Field(description="modules the run was queued on")
    resumed: bool = Field(description="the request resumed an existing run")


class Run(WireModel):
    run_id: str
    release: str = Field(description="the release's version")
    sha256: str = Field(description="the tarball's sha256")
    tarball: str = Field(description="the tarball's path on the controller (a downloaded release: where it was staged)")
    models: list[str] = Field(description="the model keys the run validates")
    modules: list[str] = Field(description="the modules it was sent to")
    created_at: float = Field(description="when it was created, Unix time")
    finished_at: float | None = Field(description="when it ended, Unix time; null while it runs")
    state: str = Field(description="running, done, failed or cancelled")
    verdict: str | None = Field(description="pass, regressed, incomplete, failed; null until judged")
    verdict_line: str | None = Field(None, description="the verdict's one line, as recorded when the run was judged")
    started_by: str = Field("", description="the user who started it: an API token's user or a fleetctl user "
                                            "($FLEET_USER, else the OS user); '' when not recorded")
    rows: int | None = Field(None, description="result rows in the history (one run only)")
    module_states: dict[str, dict[str, Any]] | None = Field(
        None, description="module -> its state, step, model key, progress, keys, rows and error (one run only)")


class Cancelled(WireModel):
    run_id: str
    modules: list[str] = Field(description="the modules the cancel reaches")


class Device(WireModel):
    module: str
    host: str
    transport: str = Field(description="ssh or local (the inventory's transport)")
    labels: dict[str, str] = Field(description="the inventory's labels")
    state: str = Field(description="idle, busy, unreachable, offline or bad")
    reason: str = Field(description="why it is in that state, and notes (clock skew, a name conflict, a contract "
                                    "version apart); empty when there is nothing to say")
    agent_version: str | None = Field(description="from its last heartbeat; null when none was seen")
    contract: int | None = Field(description="its agent's contract version, from its last heartbeat (ADR 0051)")
    contract_standing: str | None = Field(description="current, behind or ahead (one version: runs), refused (too far "
                                                      "apart: validate refuses it); null when no heartbeat was seen")
    heartbeat_age_s: float | None = Field(description="age of its last heartbeat by the broker's clock, s")
    clock_skew_s: float | None = Field(description="the module's clock minus the controller's, s (the heartbeat's "
                                                   "age is the broker's)")
    free_disk_bytes: int | None = Field(description="free disk of its workdir, from its last heartbeat")
    run_id: str | None = Field(description="the run it is busy with, from its last heartbeat")


class ReservationOut(WireModel):
    module: str
    user: str = Field(description="who holds it: an API token's user or a fleetctl user")
    until: float = Field(description="when it ends, Unix time (it expires by itself)")
    until_local: str = Field(description="when it ends, HH:MM on the controller's clock")
    left_s: float = Field(description="seconds left")
    reason: str
    id: str = Field(description="shared by the modules one reserve took; kept when its user extends it")
    since: float = Field(description="when it was made, Unix time")


class ReserveBody(WireModel):
    devices: str = Field(..., min_length=1, max_length=MAX_SELECTOR,
                         description="'all', module names, label=value; comma separated")
    duration: str = Field(..., min_length=2, max_length=16, description="how long: 30m, 2h, 1d")
    reason: str = Field("", max_length=MAX_DETAIL, description="why, shown to the others")


class ReportLink(WireModel):
    run_id: str = Field(description="the run's id ('latest' or a prefix resolved when the link is made)")
    url: str = Field(description="opens the run's HTML report in a browser, no token needed, until expires_at")
    expires_at: int = Field(description="unix seconds")


class ReportFormat(str, Enum):
    json = "json"
    md = "md"
    html = "html"
    csv = "csv"


ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": Problem, "description": "bad input"},
    401: {"model": Problem, "description": "no token, or a wrong one"},
    403: {"model": Problem, "description": "the token's user lacks the role the route needs (both named)"},
    404: {"model": Problem, "description": "no such run"},
    413: {"model": Problem, "description": "request body larger than 64 KiB"},
    422: {"model": Problem, "description": "a field out of bounds or of the wrong type (the field named)"},
    503: {"model": Problem, "description": "broker or run history unreachable (which, and since when)"},
}
