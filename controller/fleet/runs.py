"""A run as the controller keeps it: its id, its release, its state over modules (pure records and rules).

:class:`RunView` is a run's modules and their progress; a module's part failed when
:func:`module_failed` says so, and was refused at dispatch (never sent: the module was offline, bad or reserved by
another user) when :func:`refusal` gives why. Nothing here talks to the broker or writes the history.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from contract.records import RunProgress, RunState, StepError, release_version_of
from controller.fleet.errors import BadRelease


def release_version(tarball: Path) -> str:
    version = release_version_of(tarball.name)
    if version is None:
        raise BadRelease(f"{tarball}: not a release tarball name (SGLang-MUSA-M1000-M1000_<version>_sglang.tar.gz)")
    return version


def new_run_id(now: float | None = None) -> str:
    t = time.gmtime(now if now is not None else time.time())
    return time.strftime("%Y%m%d-%H%M%S", t) + "-" + secrets.token_hex(2)


#: the step of a module's part the controller refused at dispatch (offline, bad, reserved by another user): the run
#: is judged on the modules that ran (INCOMPLETE), where a part that failed at ``dispatch`` (no release there, the
#: broker down) fails it
REFUSED_STEP = "refused"


def module_failed(p: RunProgress) -> bool:
    return p.state in (RunState.FAILED, RunState.LOST) or any(o.status == "failed" for o in p.outcomes)


def refusal(p: RunProgress | None) -> str | None:
    """Why the module's part was refused at dispatch (``reserved by alice until 15:00 (fw)``, ``module bad: ...``),
    None when it was not (pure)."""
    if p is None or p.state != RunState.FAILED or p.error is None or p.error.step != REFUSED_STEP:
        return None
    return p.error.message


# how the note of the modules refused at dispatch starts
REFUSED_NOTE = "refused at dispatch: "


def refused_note(refused: Mapping[str, str], ran: int, shown: int = 8) -> str:
    """``refused at dispatch: m2 reserved by alice until 15:00 (fw); m3 module bad: ...; judged on the 1 module(s)
    that ran`` (pure): the modules of a run refused at dispatch, each with why."""
    items = [f"{m} {why}" for m, why in refused.items()]
    more = f"; and {len(items) - shown} more" if len(items) > shown else ""
    tail = f"; judged on the {ran} module(s) that ran" if ran else "; no module ran"
    return f"{REFUSED_NOTE}{'; '.join(items[:shown])}{more}{tail}"


def refused_parts(progress: Mapping[str, RunProgress | None]) -> dict[str, str]:
    """module -> why, for each module of a run whose part was refused at dispatch (pure)."""
    return {m: why for m, p in progress.items() if (why := refusal(p)) is not None}


def failed_progress(run_id: str, module: str, release: str, step: str, message: str, keys: int,
                    now: float) -> RunProgress:
    """A module's part of a run failed by the controller at ``step`` (it never reached the module).

    ``attempt`` 0: never delivered. At ``dispatch`` the run fails there; at :data:`REFUSED_STEP` it is judged on
    its other modules. Neither is a failed run of the module (:meth:`Fleet.failure_streak` does not count it: a bad
    module would never recover otherwise)."""
    return RunProgress(run_id=run_id, module=module, release=release, state=RunState.FAILED, step=step,
                       keys_total=keys, updated_at=now, finished_at=now, attempt=0,
                       error=StepError(step=step, message=message))


def newer_progress(known: Mapping[str, RunProgress | None],
                   fresh: Mapping[str, RunProgress | None]) -> dict[str, RunProgress | None]:
    """``known`` with each module's ``fresh`` progress where it is at least as new (pure): what the broker holds
    of modules the history has not caught up with, read without writing it."""
    merged = dict(known)
    for m, p in fresh.items():
        old = merged.get(m)
        if p is not None and (old is None or p.updated_at >= old.updated_at):
            merged[m] = p
    return merged


@dataclass(frozen=True)
class RunView:
    run_id: str
    modules: tuple[str, ...]
    progress: Mapping[str, RunProgress | None] = field(default_factory=dict)

    @property
    def finished(self) -> bool:
        return all(p is not None and p.state.terminal for p in self.progress.values())

    def state(self) -> str:
        """running, cancelled, failed (a part that was sent failed, or every part was refused) or done (every part
        sent passed; a part refused at dispatch leaves the run done, its verdict incomplete)."""
        ps = [p for p in self.progress.values() if p is not None]
        if not self.finished:
            return "running"
        if any(p.state == RunState.CANCELLED for p in ps):
            return "cancelled"
        sent = [p for p in ps if refusal(p) is None]
        if not sent or any(module_failed(p) for p in sent):
            return "failed"
        return "done"
