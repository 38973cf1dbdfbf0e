"""Pushing the agent's registry to a Pushgateway: once, or every ``interval`` seconds from a thread.

The push is optional: it never raises and never fails a run; its warnings name the gateway
without credentials.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from prometheus_client import CollectorRegistry, push_to_gateway

from contract.redact import redact_url as redact_url

log = logging.getLogger(__package__)

PUSH_JOB = "m1000-agent"


def push_once(registry: CollectorRegistry, gateway: str, module: str, *, job: str = PUSH_JOB,
              timeout: float = 2.0) -> bool:
    """Push the registry to a Pushgateway once (grouping key ``module``). Never raises.

    Returns True when the gateway took it. A slow or absent gateway costs at most ``timeout``
    seconds and a warning in the log (the URL without credentials); the run goes on.
    """
    try:
        push_to_gateway(gateway, job=job, registry=registry, grouping_key={"module": module}, timeout=timeout)
    except Exception as exc:  # the push is optional: it must never fail a run
        log.warning("push to %s failed: %s", redact_url(gateway), type(exc).__name__)
        return False
    return True


class Pusher:
    """Pushes every ``interval`` seconds from a daemon thread; ``stop()`` pushes a last time."""

    def __init__(self, registry: CollectorRegistry, gateway: str, module: str, *, interval: float = 15.0,
                 timeout: float = 2.0, job: str = PUSH_JOB) -> None:
        self.args = (registry, gateway, module)
        self.kw: dict[str, Any] = {"timeout": timeout, "job": job}
        self.interval = interval
        self.pushes = 0
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="m1000-pusher", daemon=True)

    def start(self) -> Pusher:
        self._thread.start()
        return self

    def _once(self) -> None:
        if push_once(*self.args, **self.kw):
            self.pushes += 1
        else:
            self.failures += 1

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._once()
            self._stop.wait(self.interval)

    def stop(self, final_push: bool = True) -> None:
        self._stop.set()
        self._thread.join(timeout=self.kw["timeout"] + 1.0)
        if final_push:
            self._once()
