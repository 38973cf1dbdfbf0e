"""The one place of the agent that spawns processes.

Every process runs in its own session (so its own process group); stopping it kills the
whole group, plus any descendant that escaped into another session. Within a run
(:meth:`Executor.open_run`) every process also starts in the run's cgroup where there is one,
and :meth:`Executor.sweep` stops whatever the run's processes left, whatever session or
environment it gave itself (:mod:`agent.procs`). Output of both
streams is written, line by line with a UTC timestamp, to the step's log file by one pump
thread per process (blocking reads, no polling); stdout can also be kept raw in a file for
the step's parser. Waiting blocks on the process with a timeout, waking only every
``poll_interval`` seconds to look at the cancel token.
"""

from __future__ import annotations

import contextlib
import os
import select
import selectors
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Literal, Protocol

import psutil

from agent import procs

Outcome = Literal["exited", "timeout", "cancelled", "aborted"]
TAIL_LINES = 20


def _pidfd(popen: subprocess.Popen[bytes]) -> int | None:
    """A pidfd of ``popen`` (Linux 5.3+), or None where there is none (older kernels, other systems)."""
    try:
        return os.pidfd_open(popen.pid)
    except (AttributeError, OSError):
        return None


def _wait_exit(popen: subprocess.Popen[bytes], pidfd: int | None, timeout: float) -> bool:
    """True once ``popen`` has exited (and is reaped), after at most ``timeout`` s. On its pidfd the wait
    is one poll(2); ``Popen.wait(timeout)`` wakes up to ~30 times a second (a sleep loop) to look."""
    if pidfd is None:
        try:
            popen.wait(timeout=timeout)
            return True
        except subprocess.TimeoutExpired:
            return False
    sel = select.poll()
    sel.register(pidfd, select.POLLIN)
    sel.poll(max(0, int(timeout * 1000)))
    return popen.poll() is not None


class CancelToken(Protocol):
    def is_cancelled(self) -> bool: ...


class EventCancelToken:
    """A cancel token backed by a :class:`threading.Event` (CLI, SIGINT, tests)."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def cancel(self) -> None:
        self._event.set()

    def is_cancelled(self) -> bool:
        return self._event.is_set()


def utc_stamp(ts: float | None = None) -> str:
    t = datetime.fromtimestamp(time.time() if ts is None else ts, tz=timezone.utc)
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


@dataclass(frozen=True)
class ProcResult:
    """What one finished (or stopped) process left behind."""

    argv: tuple[str, ...]
    outcome: Outcome
    exit_code: int | None
    duration_s: float
    stderr_tail: str
    stdout_tail: str
    reason: str = ""  # why it was aborted (watch callback)

    @property
    def ok(self) -> bool:
        return self.outcome == "exited" and self.exit_code == 0


class _Pump(threading.Thread):
    """Copies a process's stdout/stderr into a timestamped log (and stdout raw to a file)."""

    def __init__(self, proc: subprocess.Popen[bytes], log: IO[str], raw: IO[bytes] | None,
                 log_stdout: bool = True) -> None:
        super().__init__(daemon=True, name=f"pump-{proc.pid}")
        self.proc = proc
        self.log_stdout = log_stdout
        self.log = log
        self.raw = raw
        self.tails: dict[str, deque[str]] = {"out": deque(maxlen=TAIL_LINES), "err": deque(maxlen=TAIL_LINES)}
        self._partial: dict[str, bytes] = {"out": b"", "err": b""}
        self._lock = threading.Lock()

    def _line(self, tag: str, data: bytes) -> None:
        if tag == "out" and not self.log_stdout:
            # kept raw only (e.g. an environment dump whose values may be secret)
            return
        text = data.decode("utf-8", "replace").rstrip("\r")
        self.tails[tag].append(text)
        self.log.write(f"{utc_stamp()} [{tag}] {text}\n")

    def _feed(self, tag: str, chunk: bytes) -> None:
        if tag == "out" and self.raw is not None:
            self.raw.write(chunk)
        buf = self._partial[tag] + chunk
        *lines, rest = buf.split(b"\n")
        with self._lock:
            for line in lines:
                self._line(tag, line)
            self.log.flush()
        self._partial[tag] = rest

    def run(self) -> None:
        sel = selectors.DefaultSelector()
        assert self.proc.stdout is not None and self.proc.stderr is not None
        sel.register(self.proc.stdout, selectors.EVENT_READ, "out")
        sel.register(self.proc.stderr, selectors.EVENT_READ, "err")
        try:
            while sel.get_map():
                for key, _ in sel.select():
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        sel.unregister(key.fileobj)
                        continue
                    self._feed(str(key.data), chunk)
        except (OSError, ValueError):  # pipes closed under us by stop(): nothing more to copy
            pass
        finally:
            sel.close()
            with self._lock:
                for tag, rest in self._partial.items():
                    if rest:
                        self._line(tag, rest)
                self._partial = {"out": b"", "err": b""}
                self.log.flush()

    def note(self, text: str) -> None:
        with self._lock:
            self.log.write(f"{utc_stamp()} [agent] {text}\n")
            self.log.flush()


@dataclass
class Proc:
    """A process the executor started; stop it with :meth:`Executor.stop`."""

    argv: tuple[str, ...]
    popen: subprocess.Popen[bytes]
    pump: _Pump
    log: IO[str]
    raw: IO[bytes] | None
    started: float = field(default_factory=time.monotonic)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def pgid(self) -> int:
        return self.popen.pid  # leader of its own session and group

    def alive(self) -> bool:
        return self.popen.poll() is None

    @property
    def exit_code(self) -> int | None:
        return self.popen.poll()


def _group_exists(pgid: int) -> bool:
    """Any process (zombies included) in group ``pgid``: one signal-0 probe, no walk over every process."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group ``pgid``."""
    if not _group_exists(pgid):  # the common case: no walk over every process
        return []
    out: list[int] = []
    for p in psutil.process_iter(["pid", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if os.getpgid(p.pid) == pgid:
                out.append(p.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return out


class Executor:
    """Spawns, waits on and stops processes; the only seam of the agent that does."""

    def __init__(self, poll_interval: float = 0.5, stop_grace: float = 10.0) -> None:
        self.poll_interval = poll_interval
        self.stop_grace = stop_grace
        self.cgroup: procs.RunCgroup | None = None
        self.workdir: Path | None = None

    # ----- a run's processes, wherever they went
    def open_run(self, workdir: Path, run_id: str) -> tuple[list[procs.Left], str]:
        """Processes from now on start in ``run_id``'s cgroup (where the machine has one: else why not, as the
        second value); what earlier runs of ``workdir`` left in theirs is stopped first (returned)."""
        self.close_run()
        self.workdir = workdir
        self.cgroup, why = procs.open_run_cgroup(workdir, run_id)
        return procs.sweep_leftover_cgroups(workdir, self.stop_grace, keep=self.cgroup), why

    def sweep(self) -> list[procs.Left]:
        """Stop every process the run left (in its cgroup, or adopted by this subreaper); what was running."""
        return procs.sweep(self.cgroup, min(self.stop_grace, 5.0))

    def close_run(self) -> list[procs.Left]:
        """The run's end: :meth:`sweep`, then its cgroup is removed."""
        left = self.sweep() if self.workdir is not None else []
        if self.cgroup is not None:
            procs.remove_cgroup(self.cgroup)
        self.cgroup, self.workdir = None, None
        return left

    def port_holders(self, port: int) -> list[tuple[int | None, bool]]:
        """(pid, whether it is this agent's) of each process listening on ``port``."""
        return [(pid, pid is not None and self.workdir is not None and procs.is_ours(pid, self.workdir))
                for pid in procs.port_holders(port)]

    def kill_tree(self, pid: int) -> list[procs.Left]:
        return procs.kill_all(procs.tree(pid), min(self.stop_grace, 5.0))

    def start(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, log_path: Path,
              raw_stdout: Path | None = None, log_stdout: bool = True) -> Proc:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(log_path, "a", encoding="utf-8")  # noqa: SIM115 - closed by stop()/run()
        raw = open(raw_stdout, "wb") if raw_stdout else None  # noqa: SIM115
        log.write(f"{utc_stamp()} [agent] start: {' '.join(argv)} (cwd {cwd})\n")
        log.flush()
        try:
            popen = procs.REAPER.start(lambda: subprocess.Popen(
                procs.spawn_into(self.cgroup, list(argv)), env=dict(env), cwd=cwd, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, close_fds=True,
            ))
        except OSError as exc:
            log.write(f"{utc_stamp()} [agent] could not start: {exc}\n")
            log.close()
            if raw:
                raw.close()
            raise
        pump = _Pump(popen, log, raw, log_stdout)
        pump.start()
        return Proc(tuple(argv), popen, pump, log, raw)

    def wait(self, proc: Proc, *, timeout: float, cancel: CancelToken | None = None,
             watch: Callable[[], str | None] | None = None) -> ProcResult:
        """Block until ``proc`` exits, the timeout passes, ``cancel`` fires or ``watch`` says why to stop."""
        deadline = proc.started + timeout
        outcome: Outcome = "exited"
        reason = ""
        pidfd = _pidfd(proc.popen)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                outcome, reason = "timeout", f"timed out after {timeout:g} s"
                break
            if _wait_exit(proc.popen, pidfd, min(self.poll_interval, remaining)):
                break
            if cancel is not None and _cancelled(cancel):
                outcome, reason = "cancelled", "cancelled"
                break
            if watch is not None:
                why = watch()
                if why:
                    outcome, reason = "aborted", why
                    break
        if pidfd is not None:
            os.close(pidfd)
        if outcome != "exited":
            proc.pump.note(f"stopping: {reason}")
        self.stop(proc)  # also reaps anything the step left in its group
        code = proc.popen.returncode if outcome == "exited" else None
        proc.pump.note(f"end: outcome={outcome} exit_code={code} after {time.monotonic() - proc.started:.1f} s")
        self._close(proc)
        return ProcResult(
            argv=proc.argv, outcome=outcome, exit_code=code, duration_s=time.monotonic() - proc.started,
            stderr_tail="\n".join(proc.pump.tails["err"]), stdout_tail="\n".join(proc.pump.tails["out"]),
            reason=reason,
        )

    def run(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path, log_path: Path, timeout: float,
            cancel: CancelToken | None = None, raw_stdout: Path | None = None,
            watch: Callable[[], str | None] | None = None, log_stdout: bool = True) -> ProcResult:
        proc = self.start(argv, env=env, cwd=cwd, log_path=log_path, raw_stdout=raw_stdout, log_stdout=log_stdout)
        return self.wait(proc, timeout=timeout, cancel=cancel, watch=watch)

    def stop(self, proc: Proc) -> None:
        """Kill ``proc``'s whole process group (TERM, then KILL after the grace) and its escaped descendants."""
        escaped: list[psutil.Process] = []
        # descendants are only found through a live leader
        if proc.popen.poll() is None:
            with contextlib.suppress(psutil.Error):
                escaped = psutil.Process(proc.pid).children(recursive=True)
        pgid = proc.pgid

        def lingering() -> bool:
            # reap the leader, so that its zombie does not count
            proc.popen.poll()
            return bool(group_members(pgid)) or _alive(escaped)

        proc.popen.poll()
        if _group_exists(pgid) or _alive(escaped):
            self._signal(pgid, escaped, signal.SIGTERM)
            deadline = time.monotonic() + self.stop_grace
            while time.monotonic() < deadline:
                if proc.popen.poll() is None:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.popen.wait(timeout=min(0.1, self.poll_interval))
                else:
                    time.sleep(0.05)
                if not lingering():
                    break
            if lingering():
                proc.pump.note(f"still running after {self.stop_grace:g} s: SIGKILL to group {pgid}")
                self._signal(pgid, escaped, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(timeout=self.stop_grace)
        for p in escaped:
            with contextlib.suppress(psutil.Error):
                p.wait(timeout=0)

    def close(self, proc: Proc) -> None:
        self._close(proc)

    @staticmethod
    def _signal(pgid: int, escaped: list[psutil.Process], sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
        for p in escaped:
            with contextlib.suppress(psutil.Error):
                if p.is_running():
                    p.send_signal(sig)

    @staticmethod
    def _close(proc: Proc) -> None:
        # reaped by its Popen: the reaper may take a zombie of that pid again
        if proc.popen.poll() is not None:
            procs.REAPER.disown(proc.pid)
        proc.pump.join(timeout=5.0)
        # a pipe still held open by someone: close our ends, the pump ends
        if proc.pump.is_alive():
            for stream in (proc.popen.stdout, proc.popen.stderr):
                with contextlib.suppress(OSError):
                    if stream is not None:
                        stream.close()
            proc.pump.join(timeout=5.0)
        for stream in (proc.popen.stdout, proc.popen.stderr):
            with contextlib.suppress(OSError):
                if stream is not None:
                    stream.close()
        if not proc.log.closed:
            proc.log.close()
        if proc.raw is not None and not proc.raw.closed:
            proc.raw.close()


def _alive(procs: list[psutil.Process]) -> bool:
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                return True
        except psutil.Error:
            continue
    return False


def _cancelled(cancel: CancelToken) -> bool:
    try:
        return bool(cancel.is_cancelled())
    except Exception:
        # a broken token must not break the run: treated as not cancelled
        return False
