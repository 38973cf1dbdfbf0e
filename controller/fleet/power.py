"""Hung modules power-cycled through their PDU, decided apart from doing it (ADR 0048).

The policy, whole: a module of a running run whose part is not ended and whose agent sent no heartbeat for
``power_cycle_after`` (shorter than ``lost_after``), or none for ``offline_after`` while its part runs past the
hard time limit (alive, the agent would have ended it: the kernel's alarm), and whose inventory entry names its PDU
outlet, is power-cycled through pdudaemon: at most ``POWER_CYCLES_PER_RUN`` times in a run and
``POWER_CYCLES_PER_HOUR`` times an hour on the module, never while an earlier cycle waits for the module's
heartbeat, and never again after its PDU did not answer (the module is marked ``needs attention`` in one line until
its heartbeat returns or ``fleetctl devices reset``). After a cycle the controller waits for its heartbeat: the
agent, started again, re-queues the run and it resumes from its passed keys (:func:`agent.recovery.recover`, one
delivery of ``max_attempts``); a module not back by ``lost_after`` is given up as before. Every cycle is an event of
the run (who asked, when, why, the result) and of the module (the hourly bound, ``fleetctl devices``);
:func:`cycle_lines` reads them back for the report and ``fleetctl status``.

:func:`plan_power` decides from plain values; :class:`PowerRecovery` reads them, asks pdudaemon
(:mod:`controller.remote.pdu`) and writes the events.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from contract.records import RunProgress, RunState
from controller.history import RESET_EVENT
from controller.inventory import PowerEntry
from controller.remote import pdu

log = logging.getLogger("fleet.controller")
# power cycles of one module in one run, at most
POWER_CYCLES_PER_RUN = 1
# power cycles of one module in an hour, at most, every run
POWER_CYCLES_PER_HOUR = 3

# run events: CYCLED the cycle asked and done (its PDU answered), BACK the module's heartbeat after it, NOT_DONE
# its PDU did not answer, BOUND not cycled (its bound reached)
CYCLED = "power-cycled"
BACK = "power-cycle back"
NOT_DONE = "power-cycle failed"
BOUND = "power-cycle bound"
# a module event: its PDU did not answer; until its heartbeat returns or a reset
ATTENTION = "needs attention"
MODULE_CYCLED = "power-cycled"  # a module event (the hourly bound)
HOUR = 3600.0
MEMO_RUNS = 64

_CYCLED = re.compile(r"^power-cycled at (?P<hhmm>\d\d:\d\d) after no heartbeat for (?P<silent>\d+) s; "
                     r"(?P<passed>\d+)/(?P<total>\d+) keys passed")


@dataclass(frozen=True)
class PowerPolicy:
    """The bounds of the recovery policy (``ControllerSettings``: power_cycle_after; and
    :data:`POWER_CYCLES_PER_RUN`, :data:`POWER_CYCLES_PER_HOUR`)."""

    cycle_after: float
    per_run: int = 1
    per_hour: int = 3
    # with run_time_limit: a part past its hard limit and unreachable is cycled
    offline_after: float | None = None
    run_time_limit: float | None = None


@dataclass(frozen=True)
class PartPower:
    """What :func:`plan_power` reads of one powered module's part of a run (plain values)."""

    module: str
    # the part is terminal (done, failed, lost...)
    ended: bool
    # seconds since the broker took its last heartbeat (None: never seen)
    silent: float | None
    beat_at: float | None  # when the broker took it
    # when this run cycled it (its CYCLED events)
    cycles: tuple[float, ...] = ()
    # when a cycle of this run got its result (BACK, NOT_DONE)
    settled: tuple[float, ...] = ()
    # this run's cycle of it failed (its PDU did not answer)
    failed: bool = False
    bounded: bool = False
    # its cycles in the last hour, every run
    hour: int = 0
    # marked needs attention, no heartbeat since
    attention: bool = False
    # since its part started (None: not started)
    running_for: float | None = None
    # when its part last reported (an end after a cycle: the agent was back)
    reported_at: float | None = None
    lost: bool = False  # its part was given up (LOST)


@dataclass(frozen=True)
class Action:
    """What :func:`plan_power` says to do for one module: ``cycle``, ``back`` (record its heartbeat after a cycle),
    ``bound`` (record once that its bound stopped a cycle)."""

    module: str
    kind: str
    why: str = ""
    # cycle: how long the module was silent; back: how long after the cycle it beat
    seconds: float = 0.0


def plan_power(parts: Iterable[PartPower], policy: PowerPolicy) -> list[Action]:
    """The recovery policy (see the module's docstring) over the powered modules of one run (pure)."""
    out: list[Action] = []
    for p in parts:
        waiting = len(p.cycles) > len(p.settled)
        back_at = p.beat_at if p.beat_at is not None and p.cycles and p.beat_at > p.cycles[-1] else None
        if back_at is None and p.ended and not p.lost and p.cycles and (p.reported_at or 0.0) > p.cycles[-1]:
            # it ended before its heartbeat was read again: it was back
            back_at = p.reported_at
        if waiting and back_at is not None:
            out.append(Action(p.module, "back", seconds=back_at - p.cycles[-1]))
            continue
        if p.ended or waiting or p.failed or p.attention or p.silent is None:
            continue
        why = f"no heartbeat for {p.silent:.0f} s"
        if p.silent <= policy.cycle_after:
            if not _overdue(p, policy):
                continue
            why += f", and running for {p.running_for:.0f} s, past its hard time limit ({policy.run_time_limit:g} s)"
        if len(p.cycles) >= policy.per_run or p.hour >= policy.per_hour:
            if not p.bounded:
                out.append(Action(p.module, "bound", f"{why}; not power-cycled: {len(p.cycles)} cycle(s) in this run "
                                                     f"(bound {policy.per_run}), {p.hour} in the last hour (bound "
                                                     f"{policy.per_hour})"))
            continue
        out.append(Action(p.module, "cycle", why, p.silent))
    return out


def _overdue(p: PartPower, policy: PowerPolicy) -> bool:
    """Unreachable (silent past ``offline_after``) while its run is past its hard time limit: the agent, alive, would
    have ended it by now (the kernel's alarm)."""
    return (policy.offline_after is not None and policy.run_time_limit is not None and p.silent is not None
            and p.silent > policy.offline_after and p.running_for is not None
            and p.running_for > policy.run_time_limit)


def passed_keys(p: RunProgress | None) -> tuple[int, int]:
    """The part's passed keys and its keys in all (pure)."""
    if p is None:
        return 0, 0
    return sum(o.status == "passed" for o in p.outcomes), p.keys_total


def cycled_text(now: float, silent: float, passed: int, total: int, who: str, entry: PowerEntry) -> str:
    """The CYCLED event: ``power-cycled at 10:12 after no heartbeat for 240 s; 4/7 keys passed; asked by ...``."""
    return (f"{CYCLED} at {time.strftime('%H:%M', time.localtime(now))} after no heartbeat for {silent:.0f} s; "
            f"{passed}/{total} keys passed; asked by {who}; {entry.where()}")


def attention_of(events: Sequence[tuple[float, str]], beat_at: float | None) -> str | None:
    """The module's ``needs attention`` line when it holds: marked, and no heartbeat nor reset since (pure).
    ``events``: the module's own events (time, message), oldest first."""
    marked = next(((ts, msg) for ts, msg in reversed(events) if msg.startswith(ATTENTION)), None)
    if marked is None:
        return None
    ts, msg = marked
    if (beat_at is not None and beat_at > ts) or any(t > ts and m.startswith(RESET_EVENT) for t, m in events):
        return None
    return msg


def cycle_lines(events: Sequence[tuple[str, float, str]]) -> list[str]:
    """A run's power cycles, one line each, from its events (module, time, message; oldest first) (pure):
    ``sim-03 power-cycled at 10:12 after no heartbeat for 240 s; resumed from 4/7 keys``."""
    out: list[str] = []
    for i, (m, _ts, msg) in enumerate(events):
        head = _CYCLED.match(msg)
        if head is not None:
            first = f"{m} power-cycled at {head['hhmm']} after no heartbeat for {head['silent']} s"
            after = next(((mm, text) for mm, _t, text in events[i + 1:] if mm == m and (
                text.startswith((BACK, CYCLED)) or text.startswith("marked lost"))), None)
            if after is None:
                out.append(f"{first}; waiting for its heartbeat")
            elif after[1].startswith(BACK):
                out.append(f"{first}; resumed from {head['passed']}/{head['total']} keys")
            elif after[1].startswith(CYCLED):
                out.append(f"{first}; not back before the next cycle")
            else:
                out.append(f"{first}; did not come back ({after[1]})")
        elif msg.startswith((NOT_DONE, BOUND)):
            out.append(f"{m} {msg}")
    return out


def controller_who() -> str:
    """Who asks for a cycle the policy decided: this controller process."""
    return f"the controller's recovery policy (pid {os.getpid()} on {socket.gethostname()})"


class PowerRecovery:
    """The recovery policy at work on a sync pass (:meth:`after_pass`): reads the run's events, asks pdudaemon,
    writes what happened. ``client``: the seam to pdudaemon (:func:`controller.remote.pdu.power`)."""

    def __init__(self, entries: Mapping[str, PowerEntry], policy: PowerPolicy,
                 client: Callable[[PowerEntry, str], None] | None = None, who: str | None = None) -> None:
        self.entries = dict(entries)
        self.policy = policy
        if client is None:
            client = pdu.power
        self.client = client
        self.who = who or controller_who()
        # run -> its modules whose cycle waits for their heartbeat
        self._open: dict[str, set[str]] = {}

    def after_pass(self, history: HistoryLike, run_id: str, known: Mapping[str, RunProgress | None],
                   beats_at: Mapping[str, float | None], now: float) -> list[Action]:
        """Apply the policy to the run's powered modules after a sync pass (``known``: their parts as it left them;
        ``beats_at``: when the broker took each one's last heartbeat). The actions done."""
        mods = [m for m in known if m in self.entries]
        if not mods:
            return []
        live = [m for m in mods if not _ended(known.get(m))]
        quiet = self.policy.cycle_after if self.policy.offline_after is None else self.policy.offline_after
        silent = [m for m in live if (at := beats_at.get(m)) is not None and now - at > quiet]
        if not silent and self._open.get(run_id) == set():
            # the run's events read once: no cycle waits for a heartbeat, no powered module silent
            return []
        events = history.events(run_id)
        open_cycles = {m for m in mods if _waiting(events, m)}
        self._open[run_id] = open_cycles
        # fleetctl serve follows runs for months
        while len(self._open) > MEMO_RUNS:
            self._open.pop(next(iter(self._open)))
        if not silent and not open_cycles:
            return []
        parts = [self._part(history, m, known.get(m), beats_at.get(m), events, now)
                 for m in dict.fromkeys([*silent, *open_cycles])]
        acts = plan_power(parts, self.policy)
        for a in acts:
            self._do(history, run_id, a, known.get(a.module), now)
            if a.kind == "cycle":
                self._open.setdefault(run_id, set()).add(a.module)
            elif a.kind == "back":
                self._open.get(run_id, set()).discard(a.module)
        return acts

    def _part(self, history: HistoryLike, m: str, p: RunProgress | None, beat_at: float | None,
              events: Sequence[tuple[str, float, str]], now: float) -> PartPower:
        mine = [(ts, msg) for mm, ts, msg in events if mm == m]
        own = history.module_events(m)
        return PartPower(
            module=m, ended=_ended(p), silent=None if beat_at is None else now - beat_at, beat_at=beat_at,
            cycles=tuple(ts for ts, msg in mine if msg.startswith(CYCLED)),
            settled=tuple(ts for ts, msg in mine if msg.startswith(BACK)),
            failed=any(msg.startswith(NOT_DONE) for _, msg in mine),
            bounded=any(msg.startswith(BOUND) for _, msg in mine),
            hour=sum(1 for ts, msg in own if msg.startswith(MODULE_CYCLED) and now - ts < HOUR),
            attention=attention_of(own, beat_at) is not None,
            running_for=None if p is None or p.started_at is None else now - p.started_at,
            reported_at=None if p is None else p.updated_at, lost=p is not None and p.state == RunState.LOST)

    def _do(self, history: HistoryLike, run_id: str, a: Action, p: RunProgress | None, now: float) -> None:
        entry = self.entries[a.module]
        if a.kind == "back":
            history.add_event(run_id, a.module, f"{BACK}: its heartbeat {a.seconds:.0f} s after pdudaemon's cycle "
                                                "ended; the agent resumes the run from its passed keys")
            return
        if a.kind == "bound":
            history.add_event(run_id, a.module, f"{BOUND}: {a.why}")
            log.warning("run %s on %s: %s", run_id, a.module, a.why)
            return
        try:
            self.client(entry, "cycle")
        except pdu.PowerError as exc:
            line = f"{ATTENTION}: {a.why}, and its power cycle failed: {exc}"
            history.add_event(run_id, a.module, f"{NOT_DONE}: {a.why}: {exc}; the module needs attention")
            history.add_module_event(a.module, line)
            log.error("run %s on %s: %s", run_id, a.module, line)
            return
        passed, total = passed_keys(p)
        text = cycled_text(now, a.seconds, passed, total, self.who, entry)
        history.add_event(run_id, a.module, text)
        history.add_module_event(a.module, f"{MODULE_CYCLED}: run {run_id}: {text[len(CYCLED) + 1:]}")
        log.warning("run %s on %s: %s", run_id, a.module, text)


class HistoryLike(Protocol):
    """What :class:`PowerRecovery` uses of :class:`controller.history.History`."""

    def events(self, run_id: str) -> list[tuple[str, float, str]]: ...
    def module_events(self, module: str) -> list[tuple[float, str]]: ...
    def add_event(self, run_id: str, module: str, message: str) -> None: ...
    def add_module_event(self, module: str, message: str) -> None: ...


class PassHook(Protocol):
    """What runs after a sync pass of a run (:meth:`controller.fleet.collect.Sync.sync`): the recovery policy, the
    kernel logs kept (:mod:`controller.fleet.kernel_logs`)."""

    def after_pass(self, history: HistoryLike, run_id: str, known: Mapping[str, RunProgress | None],
                   beats_at: Mapping[str, float | None], now: float) -> object: ...


def after_pass(hooks: Sequence[PassHook], history: HistoryLike, run_id: str, known: Mapping[str, RunProgress | None],
               beats_at: Mapping[str, float | None], now: float) -> None:
    """Each hook after a pass; one that fails is logged, never the pass's failure (its I/O is a PDU's, a module's)."""
    for hook in hooks:
        try:
            hook.after_pass(history, run_id, known, beats_at, now)
        except Exception as exc:
            log.warning("run %s: %s after the sync pass failed: %s", run_id, type(hook).__name__, exc)


def _ended(p: RunProgress | None) -> bool:
    return p is not None and p.state.terminal


def _waiting(events: Sequence[tuple[str, float, str]], m: str) -> bool:
    """A cycle of ``m`` in this run without its result yet."""
    c = sum(1 for mm, _, msg in events if mm == m and msg.startswith(CYCLED))
    return c > sum(1 for mm, _, msg in events if mm == m and msg.startswith(BACK))
