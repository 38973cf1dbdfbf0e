"""The fleet seam itself: :class:`Fleet`, one Celery app and the backend KV over one run history.

Its parts by job are its bases: :class:`~controller.fleet.states.ModuleStates` (module states),
:class:`~controller.fleet.dispatch.Dispatch` (sending runs) and
:class:`~controller.fleet.collect.Sync` (following them), :class:`~controller.fleet.reservations.Reservations`
(reading who holds which module); here: opening it, the broker check, cancel.

Lazy imports: the broker's modules (:mod:`contract.celery_app`, :mod:`contract.kv`, :mod:`contract.eviction`,
:mod:`~controller.fleet.capacity`) load Celery and redis (123 and 121 ms of CPU, ``bench/import_costs.py``,
bench/results/import_costs_20261207_0346_lazy-libraries.txt) when a :class:`Fleet` is made or checks its broker, not
when a verb that only reads the history imports :mod:`controller.fleet` (tests/cli/test_lean_verbs.py).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from contract.settings import BrokerSettings
from controller.fleet.collect import COLLECT_TIMEOUT, Sync
from controller.fleet.dispatch import Dispatch
from controller.fleet.errors import BrokerUnavailable, EvictingBroker, error_line
from controller.fleet.reservations import Reservations
from controller.fleet.states import CLOCK_SKEW_WARN, FAILURES_COOLDOWN, FAILURES_FOR_BAD, ModuleStates
from controller.history import History

if TYPE_CHECKING:
    from celery import Celery

    from contract.kv import KV

log = logging.getLogger(__name__)


class Fleet(ModuleStates, Dispatch, Sync, Reservations):
    """The broker seam on one run history: module states, dispatch, sync and reservations (its bases), cancel."""

    def __init__(self, settings: BrokerSettings, history: History, *, failures_for_bad: int = FAILURES_FOR_BAD,
                 failures_cooldown: float | None = FAILURES_COOLDOWN, clock_skew_warn: float = CLOCK_SKEW_WARN,
                 collect_timeout: float = COLLECT_TIMEOUT) -> None:
        self.settings = settings
        self.history = history
        from contract.celery_app import make_app
        from contract.kv import KV

        self.app: Celery = make_app(settings)
        self.kv: KV = KV(self.app)
        self.failures_for_bad = failures_for_bad
        self.failures_cooldown = failures_cooldown
        self.clock_skew_warn = clock_skew_warn
        self.collect_timeout = collect_timeout

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.app.close()

    def check_broker(self, timeout: float = 5.0) -> None:
        """The broker is reachable (else :class:`BrokerUnavailable`) and does not evict keys (else
        :class:`EvictingBroker`, :mod:`contract.eviction`)."""
        from contract.celery_app import is_embedded
        from contract.eviction import broker_eviction_problem

        if is_embedded(self.settings):
            return
        try:
            with self.app.connection_for_write() as conn:
                conn.ensure_connection(max_retries=1, interval_start=0, timeout=timeout)
            self.app.backend.get("m1000-fleet:ping")
            problem = broker_eviction_problem(self.app)
        except Exception as exc:
            raise BrokerUnavailable(
                f"broker {self.settings.redacted_broker_url()} unreachable: {error_line(exc)}") from exc
        if problem:
            raise EvictingBroker(problem)

    def capacity_problem(self, agents: int) -> str | None:
        """Why the broker cannot hold ``agents`` agents' connections (its ``maxclients``, which its file-descriptor
        limit caps), as one line, or None (enough, the embedded broker, not readable:
        :mod:`controller.fleet.capacity`)."""
        from contract.celery_app import is_embedded
        from controller.fleet.capacity import broker_capacity_problem

        if is_embedded(self.settings):
            return None
        try:
            return broker_capacity_problem(self.app, agents)
        except Exception as exc:  # a broker away is check_broker's to report
            log.debug("maxclients not checked: %s", error_line(exc))
            return None

    def cancel(self, run_id: str, modules: Iterable[str] | None = None, reason: str = "cancelled by user") -> None:
        if modules is None:
            self.kv.cancel(run_id, reason=reason)
        else:
            for m in modules:
                self.kv.cancel(run_id, m, reason=reason)

    def active_runs(self) -> list[str]:
        return self.history.running_runs()
