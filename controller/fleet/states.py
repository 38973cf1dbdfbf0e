"""Module states from heartbeats and failed runs: idle, busy, unreachable, offline, bad.

LAVA's shape: ``idle``, ``busy``, ``offline`` (no heartbeat for ``offline_after``), ``bad``
(unhealthy heartbeat or ``failures_for_bad`` failed runs in a row). A heartbeat's age is the
broker's (``contract.kv.Beat``), never the agent's clock. The pure rules are functions;
:class:`ModuleStates` is the part of :class:`~controller.fleet.Fleet` that reads them.

Lazy imports: :mod:`contract.kv` and :mod:`contract.celery_app` load Celery (its app: 123 ms of CPU,
``bench/import_costs.py``, bench/results/import_costs_20261207_0346_lazy-libraries.txt), imported where the broker
is read: a verb that only reads the history imports this module with :mod:`controller.fleet` and does not pay it
(tests/cli/test_lean_verbs.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from contract.compat import judge
from contract.records import Heartbeat, RunProgress, RunState
from contract.settings import BrokerSettings
from controller.fleet.power import attention_of
from controller.fleet.queues import Raise, Waiting, depths, move, plan_raises, read_waiting
from controller.fleet.runs import module_failed
from controller.history import RESET_EVENT, History
from controller.inventory import Module

if TYPE_CHECKING:
    from celery import Celery

    from contract.kv import KV, Beat

# constants, not settings (ADR 0058)
# consecutive failed runs that make a module bad
FAILURES_FOR_BAD = 3
# s: a module bad by failed runs takes work again this long after the last one, on trial
FAILURES_COOLDOWN = 900.0
# s: a module's clock off the controller's by more is warned about
CLOCK_SKEW_WARN = 30.0

log = logging.getLogger("fleet.controller")


@dataclass(frozen=True)
class ModuleStatus:
    name: str
    state: str  # idle | busy | unreachable | offline | bad
    reason: str = ""
    heartbeat: Heartbeat | None = None
    age: float | None = None  # seconds since the broker took the last heartbeat
    # the agent's clock minus the controller's, s (None: not measured)
    skew: float | None = None


def derive_state(beat: Beat | None, now: float, *, offline_after: float, consecutive_failures: int = 0,
                 failures_for_bad: int = 3, lost_after: float | None = None,
                 streak: FailureStreak | None = None, failures_cooldown: float | None = None,
                 drift: str | None = None) -> tuple[str, str]:
    """``unreachable``: no heartbeat for ``offline_after`` (its run goes on); ``offline``: for ``lost_after``.

    The heartbeat's age is ``now - beat.at`` (when the broker took it), never the agent's own ``ts``.
    ``bad`` by failed runs (``streak``, or ``consecutive_failures``) holds until a run passes, the failures
    are reset (``fleetctl devices reset``), or the last of them ended ``failures_cooldown`` ago: the module
    then takes work again (on trial: one more failed run makes it bad again for as long).
    """
    if beat is None:
        return "offline", "no heartbeat ever"
    hb = beat.hb
    age = now - beat.at
    if age > max(offline_after, lost_after or 0.0):
        return "offline", f"no heartbeat for {age:.0f} s"
    if age > offline_after:
        return "unreachable", f"no heartbeat for {age:.0f} s" + (f", run {hb.run_id} goes on" if hb.run_id else "")
    if not hb.healthy:
        return "bad", hb.detail or "agent reports itself unhealthy"
    # a failed golden check: no cooldown, a person looks first
    if drift is not None:
        return "bad", f"golden check: {drift}; takes work again after `fleetctl devices reset {hb.module}`"
    streak = streak if streak is not None else FailureStreak(consecutive_failures)
    trial = ""
    if streak.count >= failures_for_bad:
        since = None if streak.last_at is None else now - streak.last_at
        reset = f"`fleetctl devices reset {hb.module}`"
        if failures_cooldown is None or since is None:
            return "bad", f"{streak.count} failed runs in a row: takes work again after {reset}"
        if since < failures_cooldown:
            return "bad", (f"{streak.count} failed runs in a row, the last {_minutes(since)} ago: takes work again "
                           f"in {_minutes(failures_cooldown - since)} (on trial), or now after {reset}")
        trial = (f"on trial: {streak.count} failed runs in a row, the last {_minutes(since)} ago "
                 f"(one more makes it bad again)")
    if hb.run_id:
        return "busy", f"run {hb.run_id}" + (f", {hb.step}" if hb.step else "") + (f"; {trial}" if trial else "")
    return "idle", trial


@dataclass(frozen=True)
class FailureStreak:
    """A module's failed runs in a row, newest first, since its last reset; ``last_at``: when the newest
    ended (the controller's clock)."""

    count: int = 0
    last_at: float | None = None


_TERMINAL = frozenset(s.value for s in RunState if s.terminal)


def streak_of(parts: Iterable[tuple[str, str | None, float | None]], reset: float | None,
              skew: float) -> FailureStreak:
    """:meth:`ModuleStates.failure_streak` of one module from its newest parts, newest first (state, progress
    JSON, the run's created_at), and its last reset (pure). A part is parsed only where its state alone cannot
    tell: ended failed or lost, or with the word "failed" in its text (a failed key's outcome); its JSON may be
    None elsewhere (:meth:`~controller.history.History.recent_parts`)."""
    n, last = 0, None
    for state, raw, created in parts:
        if reset is not None and created is not None and created <= reset:
            break
        if state not in _TERMINAL:
            continue
        p: RunProgress | None = None
        if raw is not None and (state in (RunState.FAILED.value, RunState.LOST.value) or "failed" in raw):
            p = RunProgress.model_validate_json(raw)
            if not module_failed(p):
                break
        else:
            break
        if last is None:
            ended = p.finished_at or p.updated_at
            last = ended if p.state == RunState.LOST else ended - skew
        n += 1
    return FailureStreak(n, last)


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def skew_warning(skew: float | None, bound: float) -> str:
    """The warning a module's clock skew earns past ``bound`` (empty within it or when not measured)."""
    if skew is None or abs(skew) <= bound:
        return ""
    way = "ahead of" if skew > 0 else "behind"
    return f"clock {abs(skew):.0f} s {way} the controller's (warning past {bound:.0f} s: is NTP running there?)"


def conflict_note(conflict: tuple[Mapping[str, object], float | None] | None, now: float) -> str:
    """The reason text of a name conflict: a second agent refused the name (it exited at once). Shown for
    ``CONFLICT_TTL`` after the refusal, by the broker's clock (Redis expires the record; embedded: its mtime)."""
    from contract.kv import CONFLICT_TTL

    if conflict is None:
        return ""
    record, at = conflict
    if at is None or not 0 <= now - at < CONFLICT_TTL:
        return ""
    held = record.get("held_by")
    held = held if isinstance(held, Mapping) else {}
    return (f"name conflict: a second agent on {record.get('host')} (pid {record.get('pid')}) was refused and "
            f"exited {now - at:.0f} s ago; the name is held by {held.get('host')} (pid {held.get('pid')})")


class ModuleStates:
    """The fleet's reading of its modules: heartbeats, failed runs in a row, states, queue lengths."""

    settings: BrokerSettings
    history: History
    app: Celery
    kv: KV
    failures_for_bad: int
    failures_cooldown: float | None
    clock_skew_warn: float

    def heartbeats(self, names: Iterable[str]) -> dict[str, Heartbeat | None]:
        return self.kv.heartbeats(names)

    def beats(self, names: Iterable[str]) -> dict[str, Beat | None]:
        """Heartbeats with when the broker took them (their age never from the agent's clock)."""
        return self.kv.beats(names)

    def consecutive_failures(self, module: str, limit: int = 10) -> int:
        return self.failure_streak(module, limit=limit).count

    def failure_streak(self, module: str, *, limit: int = 10, skew: float = 0.0) -> FailureStreak:
        """The module's failed runs in a row, newest first (pure reading of the history).

        Not counted, and not ending the streak: a run not terminal yet, and a refusal (``attempt`` 0: the
        controller never sent it, the module was offline, bad or lacked the release). Ended by a run that
        passed and by ``fleetctl devices reset`` (runs created before it are not read). ``skew``: the module's
        clock against the controller's, for the end times the agent wrote (a LOST end is the controller's).
        """
        parts: list[tuple[str, str | None, float | None]] = [
                 (RunProgress.model_validate_json(raw).state.value, raw, created)
                 for raw, created in self.history.module_parts(module, limit)]
        return streak_of(parts, self.history.last_module_reset(module), skew)

    def reset_failures(self, module: str) -> int:
        """Clear the module's failed runs in a row (an event in the history); how many there were."""
        n = self.failure_streak(module).count
        self.history.add_module_event(module, f"{RESET_EVENT}: {n} failed run(s) in a row cleared")
        return n

    def statuses(self, modules: Sequence[Module], now: float | None = None) -> dict[str, ModuleStatus]:
        """Every module's state (:func:`derive_state`): the heartbeats and name conflicts in one broker read each,
        the resets and golden checks of all modules in one history query, the modules whose newest ended part passed
        in one more, the others' recent parts in one small indexed query each (:func:`streak_of` parses a part only
        where its state cannot tell)."""
        beats = self.beats(m.name for m in modules)
        conflicts = self.kv.conflicts(m.name for m in modules)
        now = time.time() if now is None else now
        resets, drifts = self.history.module_marks()
        # most modules have no part to read one by one
        passed = self.history.passed_last()
        parts = self.history.recent_parts([m.name for m in modules if m.name not in passed], 10)
        out: dict[str, ModuleStatus] = {}
        for m in modules:
            beat = beats.get(m.name)
            skew = beat.skew if beat is not None else None
            streak = streak_of(parts.get(m.name, ()), resets.get(m.name), skew or 0.0)
            state, reason = derive_state(beat, now, offline_after=self.settings.offline_after,
                                         failures_for_bad=self.failures_for_bad, lost_after=self.settings.lost_after,
                                         streak=streak, failures_cooldown=self.failures_cooldown,
                                         drift=drifts.get(m.name))
            attention = attention_of(self.history.module_events(m.name), beat.at if beat else None) if m.power else None
            notes = [attention or "", reason, skew_warning(skew, self.clock_skew_warn),
                     conflict_note(conflicts.get(m.name), now),
                     judge(beat.hb.schema_version).note(m.name) if beat is not None else ""]
            out[m.name] = ModuleStatus(m.name, state, "; ".join(n for n in notes if n), beat.hb if beat else None,
                                       (now - beat.at) if beat else None, skew)
        return out

    def queue_depths(self, modules: Sequence[Module]) -> dict[str, dict[str, int]]:
        """queue -> priority -> messages waiting (:mod:`controller.fleet.queues`); {} when the broker cannot say."""
        queues = [m.queue for m in modules]
        try:
            return depths(self.waiting(modules), queues)
        except Exception as exc:
            log.warning("cannot read queue lengths: %s", exc)
            return {}

    def waiting(self, modules: Sequence[Module]) -> list[Waiting]:
        """What waits on these modules' queues, in the order each module takes it (the broker's errors raise)."""
        with self.app.connection_for_read() as conn:
            return read_waiting(conn.default_channel, [m.queue for m in modules])

    def raise_waiting(self, modules: Sequence[Module], raise_after: float, now: float | None = None,
                      holders: Mapping[str, str] | None = None) -> list[Raise]:
        """Raise the runs that waited ``raise_after`` on these modules' queues a level per wait (the starvation
        bound, :func:`controller.fleet.queues.plan_raises`), and put back up to what they asked for the runs a
        module held at ``low`` for another user's reservation that has ended (``holders``: queue -> the user whose
        reservation holds its module now); the raises made (not those the agent took first)."""
        now = time.time() if now is None else now
        done: list[Raise] = []
        with self.app.connection_for_write() as conn:
            ch = conn.default_channel
            for r in plan_raises(read_waiting(ch, [m.queue for m in modules]), now, raise_after, holders):
                if move(ch, r):
                    log.info("raised a run waiting on %s from %s to %s", r.message.queue, r.message.level, r.to)
                    done.append(r)
        return done


def read_beats(settings: BrokerSettings, modules: Iterable[str]) -> dict[str, Beat | None]:
    """Heartbeats of ``modules`` with when the broker took them (for deploy's waits)."""
    from contract.celery_app import make_app
    from contract.kv import KV

    app = make_app(settings)
    try:
        return KV(app).beats(modules)
    finally:
        app.close()


def read_heartbeats(settings: BrokerSettings, modules: Iterable[str]) -> dict[str, Heartbeat | None]:
    """Heartbeats of ``modules`` as the controller sees them (for deploy's first-heartbeat wait)."""
    from contract.celery_app import make_app
    from contract.kv import KV

    app = make_app(settings)
    try:
        return KV(app).heartbeats(modules)
    finally:
        app.close()
