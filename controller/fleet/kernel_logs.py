"""The end of a module's kernel log and agent journal kept with the run, when something went wrong there.

When a module's part of a run ends lost or with a failed key, or the module's agent was started again mid-run (a
power cycle, a crash: its part's ``attempt`` past 1), the controller reads the tail of the module's kernel log (the
boot before too: where a hang left its trace) and its agent's journal (:mod:`controller.remote.kernel_log`) into
``<data_dir>/module-logs/<run>/<module>/``, once per run and module (two modules a sync pass at most: the others on
the next passes), and says so in the run's events (kept, or why not). A module whose inventory names a serial
console (``console``: a ser2net raw TCP port) has it read from the first pass that sees its part of a run
(:mod:`controller.remote.console`, a thread of its own: a pass never waits on it) and its last lines kept there too,
as ``console.log``: a hung module's SSH does not answer, its console printed the hang. ``fleetctl logs RUN --module
M --kernel`` shows them; the report names them beside the failure.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from contract.files import write_atomic
from contract.records import RunProgress
from controller.fleet.runs import module_failed, refusal
from controller.inventory import Module
from controller.remote import console

log = logging.getLogger("fleet.controller")

# a run event: ``kernel log kept (lost): FOLDER`` or ``kernel log not kept (lost): WHY``
KERNEL_EVENT = "kernel log"
FOLDER = "module-logs"
# modules read per sync pass, at most (each an SSH session: a pass stays short when many keys fail)
PER_PASS = 2
# a part that ended longer ago than this (an old run synced again): its module's log is of later
FRESH = 3600.0
# a run event: ``serial console kept (lost): FOLDER/console.log``
CONSOLE_EVENT = "serial console"
# a console first read at the failure (a controller started since): what it holds, this long
CONSOLE_WAIT = 2.0


class RunEvents(Protocol):
    """What the kernel logs use of the history (:class:`controller.fleet.power.HistoryLike`): a run's events."""

    def events(self, run_id: str) -> list[tuple[str, float, str]]: ...
    def add_event(self, run_id: str, module: str, message: str) -> None: ...


class Capture(Protocol):
    """A console's reader (:class:`controller.remote.console.ConsoleCapture`)."""

    def settled(self, wait: float) -> None: ...

    def text(self) -> str: ...


def reason(p: RunProgress | None, now: float) -> str | None:
    """Why the module's kernel log is worth keeping now, or None (pure)."""
    if p is None or now - p.updated_at > FRESH or refusal(p) is not None:  # refused at dispatch: it never ran there
        return None
    if p.state.terminal and module_failed(p):
        return p.state.value if not any(o.status == "failed" for o in p.outcomes) else "a key failed"
    if p.attempt > 1:
        return "its agent started again mid-run"
    return None


def logs_folder(data_dir: Path, run_id: str, module: str) -> Path:
    return Path(data_dir) / FOLDER / run_id / module


def failed_parts(events: Sequence[tuple[str, float, str]], run_id: str) -> list[tuple[str, str, tuple[str, ...], str]]:
    """Each module whose logs the controller kept, or tried to, for the run (pure, from its events, in their order):
    (module, why, what was kept or why not, the command that shows them: "" when nothing was kept)."""
    said = {KERNEL_EVENT: "kernel log and agent journal", CONSOLE_EVENT: "serial console"}
    parts: dict[str, tuple[str, list[str], bool]] = {}
    for m, _, msg in events:
        what = next((w for w in said if msg.startswith(f"{w} kept (") or msg.startswith(f"{w} not kept (")), None)
        if what is None:
            continue
        kept = msg.startswith(f"{what} kept")
        why, _, rest = msg.split("(", 1)[1].partition("): ")
        why0, items, any_kept = parts.get(m, (why, [], False))
        first = rest.splitlines()[0][:160] if rest else "?"
        items.append(f"{said[what]} kept" if kept else f"{what} not kept ({first})")
        parts[m] = (why0, items, any_kept or kept)
    return [(m, why, tuple(items), f"fleetctl logs {run_id} --module {m} --kernel" if kept else "")
            for m, (why, items, kept) in parts.items()]


class KernelLogs:
    """Keeps the logs after a sync pass (:meth:`after_pass`); ``read``: the module's log tails
    (:func:`controller.remote.kernel_log.read_logs` with the controller's SSH settings); ``acquire``/``release``:
    a console's capture by its address (:func:`controller.remote.console.acquire`), ended by :meth:`close`."""

    def __init__(self, modules: Mapping[str, Module], data_dir: Path,
                 read: Callable[[Module], Mapping[str, str]],
                 acquire: Callable[[str], Capture] | None = None,
                 release: Callable[[str], None] | None = None) -> None:
        self.modules = dict(modules)
        self.data_dir = Path(data_dir)
        self.read = read
        self._done: set[tuple[str, str]] = set()
        if acquire is None or release is None:
            acquire, release = console.acquire, console.release
        self.acquire, self.release = acquire, release
        # module -> its console's reader, from the first pass that needs it
        self._captures: dict[str, Capture] = {}

    def close(self) -> None:
        """Stop reading the consoles (the process's last use of each)."""
        for m in list(self._captures):
            address = self.modules[m].console
            del self._captures[m]
            if address is not None:
                self.release(address)

    def _capture(self, m: str) -> Capture | None:
        address = self.modules[m].console if m in self.modules else None
        if address is not None and m not in self._captures:
            self._captures[m] = self.acquire(address)
        return self._captures.get(m)

    def _keep_console(self, history: RunEvents, run_id: str, m: str, why: str, folder: Path) -> None:
        cap = self._capture(m)
        if cap is None:
            return
        try:
            cap.settled(CONSOLE_WAIT)
            folder.mkdir(parents=True, exist_ok=True)
            write_atomic(folder / "console.log", cap.text())
        except Exception as exc:  # a full disk: said, never retried
            history.add_event(run_id, m, f"{CONSOLE_EVENT} not kept ({why}): {exc}")
            return
        history.add_event(run_id, m, f"{CONSOLE_EVENT} kept ({why}): {folder / 'console.log'}")

    def after_pass(self, history: RunEvents, run_id: str, known: Mapping[str, RunProgress | None],
                   beats_at: Mapping[str, float | None], now: float) -> list[str]:
        """Keep the logs of the run's modules that call for it and have none kept yet; the modules done."""
        # consoles read from the first pass that sees the module at work in the run
        for m, p in known.items():
            if p is not None and not p.state.terminal and m not in self._captures:
                self._capture(m)
        due = {m: why for m, p in known.items() if (run_id, m) not in self._done and m in self.modules
               and (why := reason(p, now)) is not None}
        if not due:
            return []
        kept = {m for m, _, msg in history.events(run_id) if msg.startswith(KERNEL_EVENT)}
        self._done.update((run_id, m) for m in kept)
        done = []
        for m, why in [(m, why) for m, why in due.items() if m not in kept][:PER_PASS]:
            self._done.add((run_id, m))
            folder = logs_folder(self.data_dir, run_id, m)
            # first: a hung module's SSH may take its timeout
            self._keep_console(history, run_id, m, why, folder)
            try:
                found = self.read(self.modules[m])
                folder.mkdir(parents=True, exist_ok=True)
                for name, text in found.items():
                    write_atomic(folder / f"{name}.log", text)
            except Exception as exc:
                # an unreachable module, its SSH refused, a full disk: said, never retried
                history.add_event(run_id, m, f"{KERNEL_EVENT} not kept ({why}): {exc}")
                log.warning("run %s on %s: kernel log not kept: %s", run_id, m, exc)
                continue
            history.add_event(run_id, m, f"{KERNEL_EVENT} kept ({why}): {folder}")
            done.append(m)
        return done
