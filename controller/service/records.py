"""The service's records: what a front end asks for and what the operations give back.

A :class:`ValidateRequest` in; :class:`Launched`, :class:`Judgement`, :class:`Device`,
:class:`RunDetail`, :class:`ModuleDetail` and :class:`LogFile` out (typed values, no I/O here).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from contract.records import MODEL_KEYS, RunProgress
from controller.fleet import ModuleStatus, RunView
from controller.fleet.reservations import OnReserved
from controller.history import RunInfo
from controller.inventory import Module
from controller.service.release_url import is_url
from controller.service.session import BadRequest

if TYPE_CHECKING:
    from controller.report.model import Report


@dataclass(frozen=True)
class ValidateRequest:
    """What ``fleetctl validate`` and ``POST /api/v1/runs`` ask for.

    The release is a path as the controller sees it, or (``url``, then ``release`` is None) an
    http/https URL it downloads into ``<data_dir>/releases/<sha256>/`` once every other check
    passed. ``sha256``: what the release must hash to (checked before anything is dispatched).
    ``module_models``: modules to ask for only some of ``models``, and those keys (``retry --failed-only``).
    ``user``: who asks (recorded as the run's ``started_by``); '' for the session's user.
    ``on_reserved``: what a selected module another user reserved gets: ``skip`` leaves it out (the run waits on
    it only when every selected module is reserved), ``wait`` queues the run there too, to start when the
    reservation ends (the agent holds it: :mod:`agent.hold`).
    """

    release: Path | None
    models: tuple[str, ...] = tuple(MODEL_KEYS)
    devices: str = "all"
    baseline: str | None = None
    run_id: str | None = None
    resume: bool = False
    url: str | None = None
    sha256: str | None = None
    module_models: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # contract.priority: which waiting run a module that frees up starts first
    priority: str = "normal"
    user: str = ""
    # with priority urgent: the modules' running runs stop for it (and resume after)
    preempt: bool = False
    # may preempt another user's run (the API: role admin, or a reservation there)
    preempt_others: bool = True
    on_reserved: OnReserved = "skip"


def release_request(release: str, *, models: tuple[str, ...] = tuple(MODEL_KEYS), devices: str = "all",
                    baseline: str | None = None, run_id: str | None = None, resume: bool = False,
                    sha256: str | None = None, priority: str = "normal",
                    user: str = "", preempt: bool = False, on_reserved: OnReserved = "skip") -> ValidateRequest:
    """A request for the release as a person or a CI job typed it: an http/https URL (downloaded
    by the controller) or a path as the controller sees it."""
    url = release if is_url(release) else None
    path = None
    if url is None:
        try:
            path = Path(release).expanduser()
        except RuntimeError as e:  # "~name" of a user this machine does not know
            raise BadRequest(f"release {release!r}: {e}") from e
    return ValidateRequest(release=path, url=url, models=models,
                           devices=devices, baseline=baseline, run_id=run_id, resume=resume, sha256=sha256,
                           priority=priority, user=user, preempt=preempt, on_reserved=on_reserved)


@dataclass(frozen=True)
class Launched:
    """A run dispatched: module -> "queued" or why it was not."""

    run_id: str
    release: str
    sha256: str
    models: tuple[str, ...]
    modules: Mapping[str, str]
    resumed: bool = False
    # module -> the run it was asked to stop for this
    preempted: Mapping[str, str] = field(default_factory=dict)
    # module -> the reservation its queued run waits for
    waiting: Mapping[str, str] = field(default_factory=dict)
    # module -> its agent one contract version apart: upgrade
    apart: Mapping[str, str] = field(default_factory=dict)

    @property
    def queued(self) -> int:
        return sum(v == "queued" for v in self.modules.values())


@dataclass(frozen=True)
class Judgement:
    run_id: str
    verdict: str  # pass | regressed | incomplete | failed | cancelled
    # the one-line verdict (the report's verdict line when reports are installed)
    line: str
    state: str  # the run's state: running | done | failed | cancelled
    report: Report | None = None

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"


@dataclass(frozen=True)
class Device:
    module: Module
    status: ModuleStatus


@dataclass(frozen=True)
class RunDetail:
    info: RunInfo
    view: RunView
    rows: int

    @property
    def state(self) -> str:
        return self.view.state() if self.view.finished else "running"


@dataclass(frozen=True)
class ModuleDetail:
    module: Module
    status: ModuleStatus
    recent: tuple[tuple[RunInfo, RunProgress | None], ...]


@dataclass(frozen=True)
class LogFile:
    module: str
    name: str  # NN-step[-key].log
    step: str
    model_key: str | None
    path: str
    text: str


def exit_code(verdict: str | None) -> int:
    """The CLI's exit code for a verdict: 0 pass, 1 anything else (failed, regressed, ...)."""
    return 0 if verdict == "pass" else 1
