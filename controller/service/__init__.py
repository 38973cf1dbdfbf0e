"""The controller's service layer, re-exported: what ``fleetctl``, the HTTP API, the demo and the benchmarks call.

A :class:`Session` holds one caller's resources (settings, inventory, run history, fleet),
opened when first asked for and closed together. There is no global session: the CLI makes
one per invocation, the HTTP API one per worker thread, the demo and the benchmarks their own.

The operations are functions of a session. They return typed values and raise
:class:`ServiceError` leaves (bad input, not found, conflict) or the fleet's
``BrokerUnavailable``; front ends turn those into one line and exit code 2, or an HTTP status.
Reading never writes the run history, except the operations whose name says so:
:func:`sync` (pull progress and rows from the broker), :func:`judge` (record the verdict),
:func:`validate`, :func:`retry` and :func:`cancel`.

Heavy parts (pandas for reports, paramiko for SSH) are imported inside the operations that
need them, so that a front end which does not use them never loads them.

The package, by job: :mod:`~controller.service.session` (Session, the errors),
:mod:`~controller.service.records` (requests and results), :mod:`~controller.service.lifecycle`
(validate, retry, sync, view, follow, judge, cancel), :mod:`~controller.service.releases`
(download, stage, push, prune), :mod:`~controller.service.steplogs` (step logs),
:mod:`~controller.service.views` (read-only views and JSON summaries), :mod:`~controller.service.reservations`
(who holds which module), and beside them
:mod:`~controller.service.webhooks` and :mod:`~controller.service.release_url`. Every name
callers use is re-exported here (``from controller import service; service.validate(...)``).
"""

import importlib
from typing import TYPE_CHECKING, Any

# the names below are imported when first used (PEP 562): ``from controller import service`` costs nothing until an
# operation is called, so a verb that needs no broker (``fleetctl runs`` of ended runs) loads neither the fleet's
# seam nor Celery
if TYPE_CHECKING:
    from controller.fleet import BadRelease, BrokerUnavailable, FleetError
    from controller.service.lifecycle import (
        cancel,
        check_baseline,
        check_run_id,
        find_run,
        follow,
        judge,
        prepare,
        recorded_judgement,
        resumed_models,
        retry,
        settled_view,
        sync,
        validate,
        view,
    )
    from controller.service.records import (
        Device,
        Judgement,
        Launched,
        LogFile,
        ModuleDetail,
        RunDetail,
        ValidateRequest,
        exit_code,
        release_request,
    )
    from controller.service.releases import SHA256_NAME, distribute, download_release, prune_releases, releases_in_use
    from controller.service.session import (
        BadRequest,
        Conflict,
        Forbidden,
        NotFound,
        ServiceError,
        Session,
        UnusableRelease,
    )
    from controller.service.steplogs import logs, parse_log_name
    from controller.service.views import (
        describe_module,
        describe_run,
        device_dict,
        devices,
        errors_of,
        modules_named,
        progress_dict,
        report,
        reset_module,
        results,
        run_summary,
        runs,
        trend,
        version,
        with_broker_states,
    )

_LAZY = {
    "BadRelease": "controller.fleet",
    "BrokerUnavailable": "controller.fleet",
    "FleetError": "controller.fleet",
    "cancel": "controller.service.lifecycle",
    "check_baseline": "controller.service.lifecycle",
    "check_run_id": "controller.service.lifecycle",
    "find_run": "controller.service.lifecycle",
    "follow": "controller.service.lifecycle",
    "judge": "controller.service.lifecycle",
    "prepare": "controller.service.lifecycle",
    "recorded_judgement": "controller.service.lifecycle",
    "resumed_models": "controller.service.lifecycle",
    "retry": "controller.service.lifecycle",
    "settled_view": "controller.service.lifecycle",
    "sync": "controller.service.lifecycle",
    "validate": "controller.service.lifecycle",
    "view": "controller.service.lifecycle",
    "Device": "controller.service.records",
    "Judgement": "controller.service.records",
    "Launched": "controller.service.records",
    "LogFile": "controller.service.records",
    "ModuleDetail": "controller.service.records",
    "RunDetail": "controller.service.records",
    "ValidateRequest": "controller.service.records",
    "exit_code": "controller.service.records",
    "release_request": "controller.service.records",
    "SHA256_NAME": "controller.service.releases",
    "distribute": "controller.service.releases",
    "download_release": "controller.service.releases",
    "prune_releases": "controller.service.releases",
    "releases_in_use": "controller.service.releases",
    "BadRequest": "controller.service.session",
    "Conflict": "controller.service.session",
    "Forbidden": "controller.service.session",
    "NotFound": "controller.service.session",
    "ServiceError": "controller.service.session",
    "Session": "controller.service.session",
    "UnusableRelease": "controller.service.session",
    "logs": "controller.service.steplogs",
    "parse_log_name": "controller.service.steplogs",
    "describe_module": "controller.service.views",
    "describe_run": "controller.service.views",
    "device_dict": "controller.service.views",
    "devices": "controller.service.views",
    "errors_of": "controller.service.views",
    "modules_named": "controller.service.views",
    "progress_dict": "controller.service.views",
    "report": "controller.service.views",
    "reset_module": "controller.service.views",
    "results": "controller.service.views",
    "run_summary": "controller.service.views",
    "runs": "controller.service.views",
    "trend": "controller.service.views",
    "version": "controller.service.views",
    "with_broker_states": "controller.service.views",
}


def __getattr__(name: str) -> Any:
    where = _LAZY.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value


__all__ = [
    "SHA256_NAME", "BadRelease", "BadRequest", "BrokerUnavailable", "Conflict", "Device", "FleetError", "Forbidden",
    "Judgement", "Launched", "LogFile", "ModuleDetail", "NotFound", "RunDetail", "ServiceError", "Session",
    "UnusableRelease", "ValidateRequest", "cancel", "check_baseline", "check_run_id", "describe_module",
    "describe_run", "device_dict", "devices", "distribute", "download_release", "errors_of", "exit_code",
    "find_run", "follow", "judge", "logs", "modules_named", "parse_log_name", "prepare", "progress_dict",
    "prune_releases", "recorded_judgement", "release_request", "releases_in_use", "report", "reset_module",
    "results", "resumed_models", "retry", "run_summary", "runs", "settled_view", "sync", "trend", "validate",
    "version", "view", "with_broker_states",
]
