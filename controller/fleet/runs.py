"""A run as the controller keeps it: its id, its release, its state over modules (pure records and rules).

:class:`RunView` is a run's modules and their progress; a module's part failed when
:func:`module_failed` says so. Nothing here talks to the broker or writes the history.
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


def module_failed(p: RunProgress) -> bool:
    return p.state in (RunState.FAILED, RunState.LOST) or any(o.status == "failed" for o in p.outcomes)


def failed_progress(run_id: str, module: str, release: str, step: str, message: str, keys: int,
                    now: float) -> RunProgress:
    """A module's part of a run failed by the controller at ``step`` (it never reached the module).

    ``attempt`` 0: never delivered. The run fails there, but it is a refusal, not a failed run of the module
    (:meth:`Fleet.failure_streak` does not count it: a bad module would never recover otherwise)."""
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
        ps = [p for p in self.progress.values() if p is not None]
        if not self.finished:
            return "running"
        if any(p.state == RunState.CANCELLED for p in ps):
            return "cancelled"
        if any(module_failed(p) for p in ps):
            return "failed"
        return "done"
