"""Dispatch runs to modules, follow them, keep their results: the controller's fleet seam.

Everything here talks to the broker through one Celery app and the backend KV
(``contract.kv``); the run history is the only other store. The parts, by job:
:mod:`~controller.fleet.errors` (the fleet's errors), :mod:`~controller.fleet.runs` (a run's
records and rules), :mod:`~controller.fleet.states` (module states from heartbeats and failed
runs), :mod:`~controller.fleet.dispatch` (sending a run), :mod:`~controller.fleet.collect`
(``sync``: following it into the history) and :mod:`~controller.fleet.seam` (:class:`Fleet`,
made of those). The names callers use are re-exported here.

Celery, kombu and redis (123, 72 and 121 ms of CPU to import: ``bench/import_costs.py``,
bench/results/import_costs_20261207_0346_lazy-libraries.txt) load when a Fleet is made or a broker error is
caught, not when a verb that only reads the history imports this package (tests/cli/test_lean_verbs.py).
"""

from controller.fleet.collect import liveness, record_gap
from controller.fleet.dispatch import args_label, run_id_in_use
from controller.fleet.errors import BadRelease, BrokerUnavailable, EvictingBroker, FleetError, RunIdInUse, broker_errors
from controller.fleet.runs import (
    REFUSED_STEP,
    RunView,
    failed_progress,
    module_failed,
    new_run_id,
    newer_progress,
    refusal,
    refused_parts,
    release_version,
)
from controller.fleet.seam import Fleet
from controller.fleet.states import (
    FailureStreak,
    ModuleStatus,
    conflict_note,
    derive_state,
    read_beats,
    read_heartbeats,
    skew_warning,
)
from controller.fleet.sync_plan import COLLECT_STEP, is_collecting

__all__ = [
    "COLLECT_STEP", "REFUSED_STEP", "BadRelease", "BrokerUnavailable", "EvictingBroker", "FailureStreak", "Fleet",
    "FleetError",
    "ModuleStatus", "RunIdInUse", "RunView", "args_label", "broker_errors", "conflict_note", "derive_state",
    "failed_progress", "is_collecting", "liveness", "module_failed", "new_run_id", "newer_progress", "read_beats",
    "read_heartbeats",
    "record_gap", "refusal", "refused_parts", "release_version", "run_id_in_use", "skew_warning",
]
