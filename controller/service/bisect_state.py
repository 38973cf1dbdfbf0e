"""A bisection's record and its file: ``<data_dir>/bisect/<id>.json``, written whole (a temporary file renamed over
it), read-modify-written under a short lock, and owned by one ``fleetctl bisect`` at a time (a second one, or a
``--resume`` while it runs, is refused with the owner's pid). The runs are in the run history too (their note
says which bisection, round and candidate); this record holds what the history does not: the candidates in order,
the targets, which run measured which candidate on which module.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from controller.service.session import Conflict, NotFound

BisectStatus = Literal["running", "done", "cancelled", "failed"]
Role = Literal["good", "bad", "probe"]
_ID = re.compile(r"^bisect-[0-9]{8}-[0-9]{6}-[0-9a-f]{4}$")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Candidate(_Frozen):
    version: str
    source: str  # a path as the controller sees it, or an http/https URL


class TargetRecord(_Frozen):
    model_key: str
    metric: str
    bad_change: float


class BisectRun(_Frozen):
    """One validation run of the bisection: the good or bad release on every module (``module`` ''), or one
    candidate on one module."""

    run_id: str
    role: Role
    index: int  # the candidate's place in release order
    module: str = ""
    round: int = 0  # 0: the references; 1, 2, ...: the rounds
    # a re-measure (or a move to another module) within its round
    again: bool = False


class BisectRecord(_Frozen):
    bisect_id: str
    created_at: float
    # release order, the good release first and the bad one last
    candidates: tuple[Candidate, ...]
    models: tuple[str, ...]
    metric: str | None = None
    devices: str
    modules: tuple[str, ...]  # the modules chosen when it started
    tolerance: float | None = None
    runs: tuple[BisectRun, ...] = ()
    targets: tuple[TargetRecord, ...] | None = None  # known once the references ran
    lost: tuple[str, ...] = ()  # modules left out after their run was lost
    status: BisectStatus = "running"
    message: str = ""  # why it failed or was cancelled
    calls: dict[int, str] = Field(default_factory=dict)  # the calls so far, by candidate index
    refused: dict[int, str] = Field(default_factory=dict)  # why validate refused a candidate (a bad tarball)

    def versions(self) -> list[str]:
        return [c.version for c in self.candidates]


def new_bisect_id(now: float | None = None) -> str:
    return time.strftime("bisect-%Y%m%d-%H%M%S-", time.gmtime(now)) + secrets.token_hex(2)


def check_bisect_id(bisect_id: str) -> str:
    if not _ID.match(bisect_id):
        raise NotFound(f"{bisect_id!r} is not a bisection id (bisect-YYYYMMDD-HHMMSS-xxxx; see <data_dir>/bisect/)")
    return bisect_id


class BisectStore:
    """The bisection records of one controller's data folder."""

    def __init__(self, data_dir: Path) -> None:
        self.root = data_dir / "bisect"

    def path(self, bisect_id: str) -> Path:
        return self.root / f"{check_bisect_id(bisect_id)}.json"

    def create(self, rec: BisectRecord) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        with self._locked(rec.bisect_id):
            if self.path(rec.bisect_id).exists():
                raise Conflict(f"bisection {rec.bisect_id} exists")
            self._write(rec)

    def load(self, bisect_id: str) -> BisectRecord:
        p = self.path(bisect_id)
        try:
            return BisectRecord.model_validate_json(p.read_bytes())
        except FileNotFoundError:
            raise NotFound(f"no bisection {bisect_id} in {self.root}") from None
        except (ValidationError, ValueError) as exc:
            raise NotFound(f"{p}: not a bisection record ({str(exc).splitlines()[0]})") from None

    def update(self, bisect_id: str, change: Callable[[BisectRecord], BisectRecord]) -> BisectRecord:
        """Read, change and write the record under its lock; a cancelled or ended record is not changed back."""
        with self._locked(bisect_id):
            old = self.load(bisect_id)
            new = change(old)
            if old.status != "running" and new.status == "running":
                return old
            self._write(new)
            return new

    def patch(self, bisect_id: str, **fields: object) -> BisectRecord:
        """:meth:`update` with new values of some fields."""
        return self.update(bisect_id, lambda r: r.model_copy(update=fields))

    def list(self) -> list[BisectRecord]:
        out = []
        for p in sorted(self.root.glob("bisect-*.json")) if self.root.is_dir() else []:
            try:
                out.append(BisectRecord.model_validate_json(p.read_bytes()))
            except (ValidationError, ValueError, OSError):
                continue
        return out

    @contextmanager
    def owned(self, bisect_id: str) -> Iterator[None]:
        """Held while one ``fleetctl bisect`` runs the bisection; Conflict when another holds it."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root / f"{check_bisect_id(bisect_id)}.owner", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                pid = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
                raise Conflict(f"bisection {bisect_id} is being run by another fleetctl (pid {pid})") from None
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            yield
        finally:
            os.close(fd)

    @contextmanager
    def _locked(self, bisect_id: str) -> Iterator[None]:
        fd = os.open(self.root / f"{check_bisect_id(bisect_id)}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _write(self, rec: BisectRecord) -> None:
        p = self.path(rec.bisect_id)
        tmp = p.with_suffix(".tmp")
        tmp.write_text(json.dumps(rec.model_dump(mode="json"), indent=1) + "\n")
        os.replace(tmp, p)
