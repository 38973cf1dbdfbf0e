"""A run's limits, kept across the deaths of the worker: the kernel's hard time limit, its deadline, its deliveries.

The hard time limit is the kernel's (:func:`hard_limit`): at the limit ``SIGALRM``, at its default action, ends
the worker wherever the run hangs, and the agent that starts again (systemd restarts it) finds the deadline this
delivery recorded (:func:`write_deadline`) and ends the run as failed (:mod:`agent.recovery`). The deliveries
that did not end cleanly are counted in the run's folder (:func:`bump_attempts`).
"""

from __future__ import annotations

import contextlib
import logging
import signal
from collections.abc import Iterator
from pathlib import Path

from agent.store import read_json, write_atomic

log = logging.getLogger("fleet.agent")


def bump_attempts(run_dir: Path, by: int = 1) -> int:
    """Count deliveries that did not end cleanly (a clean interrupt gives its attempt back: ``by=-1``)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "attempts"
    try:
        n = int(path.read_text().strip() or 0)
    except (OSError, ValueError):
        n = 0
    n = max(0, n + by)
    write_atomic(path, f"{n}\n")
    return n


def write_deadline(run_dir: Path, deadline: float) -> None:
    """This delivery's hard deadline (epoch seconds), for the agent that recovers the run if the kernel's
    alarm (:func:`hard_limit`) ended the worker at it."""
    try:
        write_atomic(run_dir / "deadline", f"{deadline:.3f}\n")
    except OSError as exc:
        # a full disk: the run goes on; a recovery then re-queues it
        log.warning("cannot record the hard deadline of %s: %s", run_dir.name, exc)


def read_deadline(run_dir: Path) -> float | None:
    value = read_json(run_dir / "deadline")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@contextlib.contextmanager
def hard_limit(seconds: float) -> Iterator[None]:
    """The run's hard time limit, kept by the kernel: ``ITIMER_REAL`` delivers ``SIGALRM`` after
    ``seconds`` of wall time, and its default action ends the process.

    It needs no Python code to run: it ends a run hung in a blocking call, in a loop holding the GIL,
    or stopped (``SIGSTOP``: the signal waits and ends the process when it is continued). The worker
    sets ``SIGALRM``'s default action at its start (:func:`agent.worker.run_worker`); the run itself is meant to stop at
    its soft limit, well before (see ``agent.task._execute``).
    """
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
