"""The pipeline's cancel token on the broker: a durable cancel, a preemption, a deadline or the agent's shutdown."""

from __future__ import annotations

import logging
import os
import time

from contract.kv import KV

log = logging.getLogger(__name__)


class KVCancelToken:
    """Cancel token for the pipeline: a durable cancel on the backend, or a deadline passed.

    Reads the backend at most every ``interval`` seconds however often it is asked.
    Also ends the run when ``stop_file`` exists: the worker's main process creates it when the
    agent is shutting down (SIGTERM), and the run is then interrupted, not cancelled.
    """

    def __init__(self, kv: KV, run_id: str, module: str, *, deadline: float | None = None,
                 interval: float = 1.0, stop_file: str | os.PathLike[str] | None = None,
                 honoured: frozenset[str] = frozenset()) -> None:
        self.kv, self.run_id, self.module = kv, run_id, module
        self.deadline = deadline
        self.interval = interval
        self.stop_file = stop_file
        # urgent runs this run already stopped for once (their preemptions are done)
        self.honoured = honoured
        self._checked = 0.0
        self.reason: str | None = None
        self.lost = False  # the controller gave this module's part up
        self.shutdown = False
        # stopped for this urgent run: interrupted and re-queued
        self.preempted_by: str | None = None

    def is_cancelled(self) -> bool:
        if self.reason:
            return True
        now = time.monotonic()
        if self.deadline is not None and now >= self.deadline:
            self.reason = "time limit of the run reached"
            return True
        if now - self._checked >= self.interval:
            self._checked = now
            if self.stop_file is not None and os.path.exists(self.stop_file):
                self.shutdown = True
                self.reason = "agent shutting down"
                return True
            try:
                flag, by = self.kv.stop_flags(self.run_id, self.module)
            except Exception as exc:  # broker briefly away: keep running, ask again later
                log.warning("cannot read cancel flag: %s", exc)
                flag, by = None, None
            if flag is not None:
                self.reason, self.lost = flag.reason, flag.lost
            elif by is not None and by not in self.honoured:
                self.preempted_by = by
                self.reason = f"preempted by urgent run {by}"
        return self.reason is not None
