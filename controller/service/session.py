"""A caller's session: its settings, inventory, run history and fleet, opened lazily, closed together.

There is no global session: the CLI makes one per invocation, the HTTP API one per worker
thread, the demo and the benchmarks their own. The service's errors (:class:`ServiceError`
and its leaves) and the two wrappers that turn a broker's or a report's failure into one of
them live here too.

Lazy imports: the broker seam (:mod:`controller.fleet`, its power and kernel-log hooks) is imported when a
session first opens it, and :mod:`controller.report` (pandas) when a report is built: ``fleetctl runs`` of ended
runs opens neither, and its start-up is what ``bench/cli.py`` measures (``runs, ended``: 0.31 s CPU, 2.3x that of
``--help`` against a goal of 2x; bench/results/cli_20261207_0057_defer-plugins.txt).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from contract.settings import load_settings
from controller.command import fleetctl
from controller.errors import FleetctlError
from controller.history import FrameCache, History, HistoryUnavailable
from controller.identity import local_user
from controller.inventory import Inventory, InventoryError, load_inventory
from controller.settings import ControllerSettings

if TYPE_CHECKING:
    from controller.fleet import Fleet
    from controller.fleet.power import PassHook, PowerRecovery


def first_steps() -> str:
    """The two ways a run history starts, as commands that work here."""
    return (f"import a baseline with `{fleetctl('baseline', 'import', 'FILE', '--release', 'R')}`, or run a validation "
            f"(`{fleetctl('validate', 'TARBALL')}`)")


# --------------------------------------------------------------------------- errors
class ServiceError(FleetctlError, RuntimeError):
    """Root of the service's own errors: the user's to fix (one line, exit 2, HTTP 4xx)."""


class BadRequest(ServiceError, ValueError):
    """Bad input: no such tarball, unknown baseline, bad run id (HTTP 400)."""


class NotFound(ServiceError, LookupError):
    """No such run or module (HTTP 404)."""

    http_status = 404


class Conflict(ServiceError):
    """The request contradicts what exists: a run id already used (HTTP 409)."""

    http_status = 409


class Forbidden(ServiceError):
    """The caller may not do this to another user's work: preempting another user's run (HTTP 403)."""

    http_status = 403


class UnusableRelease(ServiceError, ValueError):
    """A release URL that is bad, unreachable, too big, or a release whose sha256 is not the one
    asked for (HTTP 422). Nothing half-downloaded is left."""

    http_status = 422


# --------------------------------------------------------------------------- session
@dataclass
class Session:
    """Settings, inventory, run history and fleet of one caller, opened lazily, closed together.

    ``user``: who the caller acts as when an operation is not told (the CLI's identity, :func:`local_user`);
    the HTTP API, whose sessions serve every token, names the token's user on each operation instead."""

    settings: ControllerSettings
    user: str = field(default_factory=local_user)
    # fleetctl serve's, shared by its sessions: run frames kept decoded
    frames: FrameCache | None = None
    _history: History | None = None
    _inventory: Inventory | None = None
    _fleet: Fleet | None = None
    _closers: list[Callable[[], None]] = field(default_factory=list)

    @classmethod
    def load(cls, config: Path | None = None, *, inventory: Path | None = None,
             history: str | Path | None = None) -> Session:
        """A session on the settings of ``config`` (else ``FLEET_CONFIG``), ``FLEET_*`` and overrides."""
        return cls(load_settings(ControllerSettings, config, inventory=inventory, history=history))

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for c in reversed(self._closers):
            with contextlib.suppress(Exception):
                c()
        self._closers.clear()
        self._history = self._fleet = None

    @property
    def history_path(self) -> Path | str:
        """The run history as messages name it (a PostgreSQL URL without its credentials)."""
        return self.settings.history_path

    def history(self) -> History:
        """The run history, created when absent (for operations that write it)."""
        if self._history is None:
            self._history = History(self.settings.history_location, frames=self.frames)
            self._closers.append(self._history.close)
        return self._history

    def keep_frames(self, frames: FrameCache) -> None:
        """Keep the run frames this session's history reads in ``frames`` (``fleetctl serve``'s, shared)."""
        self.frames = frames
        if self._history is not None:
            self._history.frames = frames

    def has_history(self) -> bool:
        # a PostgreSQL database is there (its tables made when first opened)
        where = self.settings.history_location
        return self._history is not None or isinstance(where, str) or where.exists()

    def read_history(self) -> History:
        """The run history for reading: never creates one (NotFound when there is none yet)."""
        if not self.has_history():
            raise NotFound(self.no_history())
        return self.history()

    def no_history(self) -> str:
        """What to do when there is no run history yet (a fresh lab, or settings that name another file)."""
        return f"no run history at {self.history_path} yet: {first_steps()}"

    def inventory(self) -> Inventory:
        if self._inventory is None:
            self._inventory = load_inventory(self.settings.inventory)
        return self._inventory

    def fleet(self) -> Fleet:
        """The broker seam, on the run history (created when absent)."""
        if self._fleet is None:
            from controller.fleet import Fleet

            self._fleet = Fleet(self.settings, self.history())
            self._fleet.pass_hooks = self.pass_hooks()
            self._closers.append(self._fleet.close)
        return self._fleet

    def power_recovery(self) -> PowerRecovery | None:
        """The recovery policy over the inventory's modules with a PDU outlet (None: none has one, or the policy is
        off: power_cycle_after 0; an inventory that cannot be read: none, its error is the verbs' to say)."""
        from controller.fleet.power import POWER_CYCLES_PER_HOUR, POWER_CYCLES_PER_RUN, PowerPolicy, PowerRecovery

        try:
            entries = {m.name: m.power for m in self.inventory().modules if m.power is not None}
        except InventoryError:
            return None
        if not entries or self.settings.power_cycle_after == 0:
            return None
        st = self.settings
        return PowerRecovery(entries, PowerPolicy(st.cycle_after, POWER_CYCLES_PER_RUN, POWER_CYCLES_PER_HOUR,
                                                  st.offline_after, st.run_time_limit))

    def pass_hooks(self) -> tuple[PassHook, ...]:
        """What runs after each sync pass: the recovery policy (:meth:`power_recovery`), the kernel logs kept
        (:mod:`controller.fleet.kernel_logs`); none when the inventory cannot be read (the verbs say why)."""
        from controller.fleet.kernel_logs import KernelLogs
        from controller.remote.kernel_log import read_logs

        try:
            modules = {m.name: m for m in self.inventory().modules}
        except InventoryError:
            return ()
        power = self.power_recovery()
        logs = KernelLogs(modules, self.settings.data_dir, functools.partial(
            read_logs, known_hosts=self.settings.known_hosts, identity=self.settings.ssh_key))
        self._closers.append(logs.close)  # its consoles' readers
        return (*((power,) if power is not None else ()), logs)

    def read_fleet(self) -> Fleet:
        """The broker seam for reading module states: without a run history file yet, on an empty
        one in memory (the states need the failure counts), so that no file is created."""
        if self._fleet is None and not self.has_history():
            from controller.fleet import Fleet

            empty = History(":memory:")
            self._closers.append(empty.close)
            self._fleet = Fleet(self.settings, empty)
            self._closers.append(self._fleet.close)
        return self.fleet()

    def broker(self, *, read: bool = False) -> Fleet:
        """The fleet, its broker checked first (one clear error when it cannot be reached)."""
        fleet = self.read_fleet() if read else self.fleet()
        fleet.check_broker()
        return fleet


def broker_call(s: Session, fn: Callable[[], Any]) -> Any:
    """Run a broker read; a broker that cannot be reached is one BrokerUnavailable naming it."""
    from controller.fleet import BrokerUnavailable, broker_errors

    try:
        return fn()
    # a ConnectionError too, but the history's: said as such
    except HistoryUnavailable:
        raise
    # redis/kombu are imported only when something was raised
    except broker_errors() as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise BrokerUnavailable(f"broker {s.settings.redacted_broker_url()} unreachable: {first}") from exc


def report_call(fn: Callable[[], Any]) -> Any:
    """Build a report; a report that cannot be made (no such baseline, no rows) is one BadRequest."""
    from controller.report.model import ReportError

    try:
        return fn()
    except ReportError as exc:
        raise BadRequest(str(exc)) from None
