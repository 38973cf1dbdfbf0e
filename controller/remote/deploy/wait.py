"""Wait on the broker for what modules say: a new agent's first heartbeat, the run a module is busy with."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from contract.records import Heartbeat
from contract.settings import BrokerSettings
from controller.fleet import read_beats
from controller.remote.deploy.model import HeartbeatWait

if TYPE_CHECKING:
    from contract.kv import Beat


def heartbeat_waiter(settings: BrokerSettings, poll: float = 1.0,
                     read: Callable[[BrokerSettings, list[str]], dict[str, Beat | None]] | None = None
                     ) -> HeartbeatWait:
    """Wait for a module's heartbeat that the broker took after ``since`` (the controller's clock: never the
    module's own, which may be off) through the fleet's result backend."""

    get = read or read_beats

    def wait(module: str, since: float, timeout: float) -> Heartbeat | None:
        deadline = time.monotonic() + timeout
        while True:
            beat = get(settings, [module]).get(module)
            if beat is not None and beat.at >= since:
                return beat.hb
            if time.monotonic() >= deadline:
                return None
            time.sleep(poll)

    return wait


def busy_reader(settings: BrokerSettings) -> Callable[[str], str | None]:
    """module -> the run its latest live heartbeat says it is busy with (None: idle, silent or unknown)."""

    def busy(module: str) -> str | None:
        try:
            beat = read_beats(settings, [module]).get(module)
        except Exception:
            # broker away: deploy goes on; a restart interrupts a run cleanly anyway
            return None
        fresh = beat is not None and time.time() - beat.at <= settings.offline_after  # the broker's age of it
        return beat.hb.run_id if fresh and beat is not None else None

    return busy
