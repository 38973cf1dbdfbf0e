"""Dispatch a run: check its run id, record it, and enqueue it on every module that can take it.

The only place the controller enqueues (:meth:`Dispatch.send`). Each module is sent its request in the contract
version it runs (:func:`contract.compat.judge`: its own when it is one behind). A module offline, bad, reserved by
another user, of a contract version that cannot run the request, or without the release is recorded failed at once
(``attempt`` 0), not after an hour: the first four refused (step :data:`~controller.fleet.runs.REFUSED_STEP`: the
run is judged on the modules that ran), the last failed at ``dispatch``. ``fleetctl validate`` refuses a module of
such a version before the run is created (:func:`controller.service.lifecycle.validate`).

Lazy imports: :mod:`contract.celery_app` loads Celery (its app: 123 ms of CPU, ``bench/import_costs.py``,
bench/results/import_costs_20261207_0346_lazy-libraries.txt), imported where a run is sent: a verb that only reads
the history imports this module with :mod:`controller.fleet` and does not pay it (tests/cli/test_lean_verbs.py).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from contract.compat import judge, request_for
from contract.priority import ASKED, DEFAULT, LEVELS, SENT_AT, USER, check_priority
from contract.records import RunProgress, RunRequest
from contract.vocab import BadInput, check_run_id
from controller.fleet.errors import BrokerUnavailable, FleetError, RunIdInUse, error_line
from controller.fleet.runs import REFUSED_STEP, failed_progress
from controller.fleet.states import ModuleStatus
from controller.history.records import UnsentRequest
from controller.inventory import Module

# a request recorded this long ago and not marked sent was left by a dispatch that stopped (ADR 0060)
RESEND_AFTER = 60.0

if TYPE_CHECKING:
    from celery import Celery

    from contract.kv import KV
    from contract.settings import BrokerSettings
    from controller.history import History


class Dispatch:
    """The fleet's sending side: one task on a module's queue, a run on its modules."""

    settings: BrokerSettings
    history: History
    app: Celery
    kv: KV

    if TYPE_CHECKING:
        def statuses(self, modules: Sequence[Module], now: float | None = None) -> dict[str, ModuleStatus]: ...

    def send(self, module: str, task: str, args: list[object], task_id: str | None = None, *,
             ignore_result: bool = False, priority: str = DEFAULT, user: str = "") -> str:
        """Publish one task on a module's queue (the only place the controller enqueues).

        ``ignore_result``: Celery keeps no result of it (a run's state travels in the KV records), so the
        controller does not subscribe to one result channel per dispatched module. ``priority``: the module
        takes a higher one first when it frees up (:mod:`contract.priority`); the message says when it was
        sent and what it asked for (:mod:`controller.fleet.queues` raises it after a long wait), and who started
        it (``user``: a module another user reserved holds it until the reservation ends, :mod:`agent.hold`).
        """
        from contract.celery_app import queue_name

        try:
            res = self.app.send_task(task, args=args, queue=queue_name(module), task_id=task_id,
                                     priority=LEVELS[check_priority(priority)],
                                     headers={SENT_AT: time.time(), ASKED: priority, USER: user},
                                     ignore_result=ignore_result, argsrepr=args_label(args), kwargsrepr="{}",
                                     retry=True, retry_policy={"max_retries": 3, "interval_start": 0.2,
                                                               "interval_step": 0.5, "interval_max": 2})
        except Exception as exc:
            raise BrokerUnavailable(f"cannot enqueue on {queue_name(module)}: {error_line(exc)}") from exc
        return str(res.id)

    def check_new_run_id(self, run_id: str, *, resume: bool = False, modules: Iterable[str] = ()) -> None:
        """A run id must match the agents' pattern; one already in the history only with ``resume``; one this
        history does not hold must have no record on the broker for any of ``modules`` (:class:`RunIdInUse`).

        Run ids name records on the broker, shared by every controller of the fleet: another controller's run of
        that id would be answered (or refused) by the modules as theirs. One MGET for all modules (``KV.progress``).
        """
        try:
            check_run_id(run_id)
        except BadInput as exc:
            raise FleetError(str(exc)) from None
        known = self.history.run(run_id) is not None
        if not resume and known:
            raise FleetError(f"run id {run_id!r} is already in the history; resume it explicitly or choose another")
        names = list(dict.fromkeys(modules))
        # resumed: the records on the broker are this history's own run
        if known or not names:
            return
        found = {m: p for m, p in self.kv.progress(run_id, names).items() if p is not None}
        if found:
            raise RunIdInUse(run_id_in_use(run_id, found, self.history.path))

    def dispatch(self, *, run_id: str, modules: Sequence[Module], tarballs: Mapping[str, str], sha256: str,
                 release: str, models: Sequence[str], tarball_label: str = "",
                 statuses: Mapping[str, ModuleStatus] | None = None, resume: bool = False,
                 module_models: Mapping[str, Sequence[str]] | None = None,
                 priority: str = DEFAULT, refused: Mapping[str, str] | None = None, user: str = "") -> dict[str, str]:
        """Record the run and enqueue it, at ``priority``, on every module that can take it.

        Returns module -> "queued" or the reason it was not (offline, bad, no release):
        those modules are recorded as failed at once, not after an hour. An ``unreachable`` module (no
        heartbeat for ``offline_after``, not yet ``lost_after``) gets the run queued: it takes it when it is back,
        and the sync gives its part up as lost at ``lost_after`` (:func:`controller.fleet.collect.liveness`).
        A run id must match the agents' pattern, and may be one already in the history only with ``resume`` (each
        module then keeps the keys that passed). ``module_models``: modules asked for only some of ``models``
        (``retry --failed-only``: the keys that did not pass there), and those keys, in ``models``' order.
        ``refused``: module -> why the caller may not use it (reserved by another user): recorded as its refusal.
        ``user``: who started the run (on each message: a module another user reserved holds it until then).
        """
        self.check_new_run_id(run_id, resume=resume, modules=[m.name for m in modules])
        statuses = statuses if statuses is not None else self.statuses(modules)
        own = {m: tuple(k for k in models if k in set(keys)) for m, keys in (module_models or {}).items()}
        own = {m: keys for m, keys in own.items() if keys != tuple(models)}
        self.history.create_run(run_id, release=release, tarball=tarball_label, sha256=sha256,
                                models=models, modules=[m.name for m in modules], module_models=own)
        self.history.set_dispatched(run_id, priority, time.time())
        out: dict[str, str] = {}
        # every request built and every module's state recorded (one transaction) before the first message:
        # each message wakes a module, and on a machine the modules share, the rest of the loop then waits
        # for CPU behind them
        requests: list[RunRequest] = []
        payloads: dict[str, dict[str, object]] = {}  # module -> its request in the version it runs (ADR 0051)
        failed: list[RunProgress] = []
        now = time.time()
        for m in modules:
            st = statuses[m.name]
            keys = own.get(m.name, tuple(models))
            compat = judge(st.heartbeat.schema_version if st.heartbeat is not None else None)
            found = unsent(st, (refused or {}).get(m.name), m.name in tarballs) or (
                None if compat.request is not None else (REFUSED_STEP, compat.note(m.name)))
            if found is not None:
                step, problem = found
                failed.append(failed_progress(run_id, m.name, release, step, problem, len(keys), now))
                out[m.name] = problem
                continue
            req = RunRequest(run_id=run_id, module=m.name, tarball=tarballs[m.name], sha256=sha256, release=release,
                             models=keys, model_root=m.model_root, model_paths=dict(m.model_paths),
                             max_attempts=self.settings.max_attempts,
                             key_env={k: dict(m.env) for k in keys} if m.env else {})
            try:
                payloads[m.name] = request_for(req.model_dump(mode="json"), compat.request or compat.controller)
            except ValueError as exc:  # a field its agent's version could not honour
                failed.append(failed_progress(run_id, m.name, release, REFUSED_STEP, str(exc), len(keys), now))
                out[m.name] = str(exc)
                continue
            requests.append(req)
        self.history.record_queued([*failed, *(
            RunProgress(run_id=run_id, module=r.module, release=release, step="queued", keys_total=len(r.models),
                        updated_at=now) for r in requests)], (
            UnsentRequest(run_id=run_id, module=name, payload=payload, priority=priority, started_by=user,
                          created_at=now) for name, payload in payloads.items()))
        for name, payload in payloads.items():
            try:
                self._send_request(run_id, name, payload, priority, user)
                out[name] = "queued"
            except BrokerUnavailable as exc:
                self._record_failure(run_id, name, release, "dispatch", str(exc), len(own.get(name, models)))
                out[name] = str(exc)
        self.history.mark_sent(run_id, payloads)
        return {m.name: out[m.name] for m in modules if m.name in out}

    def send_unsent(self, run_id: str, now: float | None = None) -> list[str]:
        """Send the run's requests recorded more than :data:`RESEND_AFTER` ago and never marked sent, to the modules
        whose part is still queued (ADR 0060): the controller that dispatched the run stopped between its record and
        its messages. A module that got the message anyway takes the second one as the same run (its record answers
        it). Returns the modules sent to."""
        now = time.time() if now is None else now
        waiting = self.history.unsent(run_id, before=now - RESEND_AFTER)
        if not waiting:
            return []
        progress = self.history.progress(run_id)
        sent = [r for r in waiting if still_queued(progress.get(r.module))]
        for r in sent:
            self._send_request(run_id, r.module, r.payload, r.priority, r.started_by)
            self.history.add_event(run_id, r.module, "its request was recorded but never sent (the controller that "
                                                     "dispatched the run stopped): sent now")
        self.history.mark_sent(run_id, [r.module for r in waiting])
        return [r.module for r in sent]

    def _send_request(self, run_id: str, module: str, payload: dict[str, object], priority: str, user: str) -> None:
        """One run request on its module's queue: no result kept, its task id the same at every send."""
        from contract.celery_app import RUN_TASK, task_id

        self.send(module, RUN_TASK, [payload], task_id=task_id(module, run_id), ignore_result=True,
                  priority=priority, user=user)

    def _record_failure(self, run_id: str, module: str, release: str, step: str, message: str,
                        keys: int) -> RunProgress:
        p = failed_progress(run_id, module, release, step, message, keys, time.time())
        self.history.upsert_progress(p)
        return p


def still_queued(p: RunProgress | None) -> bool:
    """Whether a part's recorded progress says its module has not started it (pure): dispatched and nothing since."""
    return p is not None and not p.state.terminal and p.step == "queued" and not p.started_at


def unsent(status: ModuleStatus, reserved: str | None, has_release: bool) -> tuple[str, str] | None:
    """(step, why) when a module's part of a run is not sent, None when it is (pure): refused (``reserved``: why
    another user's reservation keeps it; offline; bad), or failed at ``dispatch`` (its release push failed). An
    ``unreachable`` module is sent the run: it takes it when it is back (given up at ``lost_after``)."""
    if reserved is not None:
        return REFUSED_STEP, reserved
    if status.state in ("offline", "bad"):
        return REFUSED_STEP, f"module {status.state}: {status.reason}"
    if not has_release:
        return "dispatch", "release not available on the module"
    return None


def run_id_in_use(run_id: str, found: Mapping[str, RunProgress], history: object, shown: int = 4) -> str:
    """One line: the modules where the broker holds a record of ``run_id``, and the state found (pure)."""
    items = [f"{m} ({p.state.value}{', release ' + p.release if p.release else ''})" for m, p in found.items()]
    more = f" and {len(items) - shown} more" if len(items) > shown else ""
    return (f"run id {run_id!r} is already on the broker, not in {history}: {', '.join(items[:shown])}{more} "
            "(another controller's run); choose another run id")


def args_label(args: Sequence[object]) -> str:
    """What Celery shows of a task's arguments (its message headers, worker events) in place of their repr: a
    run request's repr cost ~2 ms of the controller's CPU per message, and would copy its values into them."""
    first = args[0] if args else None
    if len(args) == 1 and isinstance(first, dict) and isinstance(first.get("run_id"), str):
        return f"(<run request {first['run_id'][:64]} for {str(first.get('module'))[:64]}>,)"
    return f"(<{len(args)} argument(s)>)"
