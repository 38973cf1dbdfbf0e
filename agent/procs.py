"""The agent's hold on every process a run starts, whatever session or environment it gives itself.

A release's start script may daemonize (``setsid -f env -i ...``): a new session, an empty
environment (so no :data:`MARK`), a parent that exits at once. Three fences keep such a process
from outliving its run:

* The agent is a *child subreaper* (:func:`hold_orphans`, ``prctl(PR_SET_CHILD_SUBREAPER)``):
  an orphan of any process it started is re-parented to the agent, not to init, so it stays
  the agent's descendant. The agent then reaps the zombies it adopts (:class:`Reaper`): only
  children no one else waits for (the executor's and the sampler's own ``Popen`` children are
  *owned* and left to their ``wait``), and only once they have been zombies for a moment (a
  ``subprocess`` call the agent does not know of reaps its child first). ``SIGCHLD`` only
  wakes the reaper's thread (a byte to a pipe): the solo pool's main thread runs no reaping.
* Each run gets a cgroup of its own where the machine has a cgroup v2 hierarchy the agent can
  write (:func:`open_run_cgroup`; no systemd needed): every process the executor starts moves
  itself there before it runs, and its children stay there whatever they do. A cgroup outlives
  a killed agent, so the next run (or the restarted agent) stops what it holds
  (:func:`sweep_leftover_cgroups`). Elsewhere the run goes on without one (the reason is logged).
* At the end of each key and of each run everything left is stopped (:func:`sweep`): the run's
  cgroup, and the agent's adopted descendants (those under children it does not own).

Before a server starts, a process holding its port is found (:func:`port_holders`) and, when it
is one of this agent's (:func:`is_ours`: in one of its cgroups, an adopted descendant, or marked),
stopped; a foreign one is named in the run's error, never blamed on the release.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import psutil

log = logging.getLogger(__name__)

# Every process the agent starts inherits this variable (value: the work folder), so a restarted agent can find
# what a killed one left running; a process that clears its environment is found by its cgroup instead.
MARK = "M1000_FLEET_AGENT_WORKDIR"
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37
# seconds a zombie no one owns waits before the reaper takes it (its own waiter is quicker)
ZOMBIE_GRACE = 0.5

T = TypeVar("T")


# --------------------------------------------------------------------------- subreaper and zombies
def _prctl(option: int, arg: int) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    return int(libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0))


def is_subreaper() -> bool:
    if not sys.platform.startswith("linux"):
        return False
    out = ctypes.c_int(0)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(out), 0, 0, 0) == 0 and out.value == 1
    except (OSError, AttributeError):
        return False


class Reaper:
    """Reaps the zombies this process adopts as a subreaper, never a child someone waits for.

    A process has one set of children, so there is one reaper per process (:data:`REAPER`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owned: set[int] = set()
        self._young: dict[int, float] = {}  # unowned zombie -> when first seen
        self._wake_r = self._wake_w = -1
        self._thread: threading.Thread | None = None
        self.reaped = 0

    # ----- children someone waits for
    def start(self, spawn: Callable[[], T]) -> T:
        """``spawn()`` (it returns a ``Popen``), its pid owned from the moment it exists: the reaper leaves it to
        its ``Popen``'s wait. :meth:`disown` it once that wait returned."""
        with self._lock:
            proc = spawn()
            self._owned.add(int(proc.pid))  # type: ignore[attr-defined]
            return proc

    def disown(self, pid: int) -> None:
        with self._lock:
            self._owned.discard(pid)

    def owned(self) -> frozenset[int]:
        with self._lock:
            return frozenset(self._owned)

    # ----- the reaper's thread
    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def install(self) -> None:
        """Start the reaper's thread and wake it on ``SIGCHLD`` (from the main thread; once)."""
        if self.running:
            return
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        previous = signal.getsignal(signal.SIGCHLD)

        def on_child(signum: int, frame: Any) -> None:  # a byte to a pipe: nothing that can block or take a lock
            with contextlib.suppress(OSError):
                os.write(self._wake_w, b"\0")
            if callable(previous):
                previous(signum, frame)

        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGCHLD, on_child)
            signal.siginterrupt(signal.SIGCHLD, False)  # SA_RESTART: C calls of other libraries see no EINTR
        self._thread = threading.Thread(target=self._loop, name="fleet-reaper", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while True:
            timeout = ZOMBIE_GRACE if self._young else 30.0
            with contextlib.suppress(OSError):
                ready, _, _ = select.select([self._wake_r], [], [], timeout)
                if ready:
                    os.read(self._wake_r, 4096)
            try:
                self.reap()
            except Exception:  # the reaper must never die
                log.exception("reaper pass failed")

    def reap(self) -> list[int]:
        """Reap the unowned zombie children that waited :data:`ZOMBIE_GRACE`; their pids."""
        with self._lock:
            try:
                if os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
                    self._young.clear()  # nothing waitable: no scan of the process table
                    return []
            except ChildProcessError:
                self._young.clear()
                return []
            now = time.monotonic()
            zombies = {p.pid for p in _children(os.getpid()) if _status(p) == psutil.STATUS_ZOMBIE} - self._owned
            self._young = {pid: self._young.get(pid, now) for pid in zombies}
            done: list[int] = []
            for pid, seen in list(self._young.items()):
                if now - seen >= ZOMBIE_GRACE:
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(pid, os.WNOHANG)
                    self._young.pop(pid)
                    done.append(pid)
            self.reaped += len(done)
            return done


REAPER = Reaper()


def hold_orphans() -> str | None:
    """Make this process the subreaper of everything it starts and start its reaper; why not, or None."""
    if not sys.platform.startswith("linux"):
        return f"no child subreaper on {sys.platform}: a daemonizing release process is found by its cgroup only"
    try:
        if _prctl(PR_SET_CHILD_SUBREAPER, 1) != 0:
            err = ctypes.get_errno()
            return f"prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(err)}"
    except (OSError, AttributeError) as exc:
        return f"prctl(PR_SET_CHILD_SUBREAPER) unavailable: {exc}"
    REAPER.install()
    return None


# --------------------------------------------------------------------------- cgroups
def cgroup_v2_path(proc_cgroup: str) -> str | None:
    """The cgroup v2 path of a ``/proc/<pid>/cgroup`` text (its ``0::`` line), or None. Pure."""
    for line in proc_cgroup.splitlines():
        if line.startswith("0::"):
            return line[3:].strip() or "/"
    return None


def cgroup2_mount(mountinfo: str) -> tuple[str, str] | None:
    """(mount point, root) of the cgroup2 file system in a ``/proc/self/mountinfo`` text, or None. Pure."""
    for line in mountinfo.splitlines():
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if sep and right.split()[:1] == ["cgroup2"] and len(fields) >= 5:
            return fields[4].replace("\\040", " "), fields[3]
    return None


def base_name(workdir: Path) -> str:
    """The cgroup folder of one work folder's runs: two agents on one machine never share one."""
    return "m1000-fleet-" + hashlib.sha256(str(workdir.resolve()).encode()).hexdigest()[:12]


def _read(path: str | Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def own_cgroup_dir() -> tuple[Path | None, str]:
    """This process's cgroup v2 folder, or None and why."""
    mount = cgroup2_mount(_read("/proc/self/mountinfo"))
    if mount is None:
        return None, "no cgroup v2 file system mounted"
    path = cgroup_v2_path(_read("/proc/self/cgroup"))
    if path is None:
        return None, "this process has no cgroup v2 path (/proc/self/cgroup)"
    point, root = mount
    rel = os.path.relpath(path, root) if root != "/" else path.lstrip("/")
    folder = Path(point) / ("" if rel in (".", "") else rel)
    if not folder.is_dir():
        return None, f"cgroup folder {folder} not found (another cgroup namespace?)"
    return folder, ""


@dataclass(frozen=True)
class RunCgroup:
    path: Path

    @property
    def procs_file(self) -> Path:
        return self.path / "cgroup.procs"

    def pids(self) -> list[int]:
        return [int(x) for x in _read(self.procs_file).split() if x.isdigit()]


def _safe_name(run_id: str) -> str:
    return "run-" + "".join(c if c.isalnum() or c in "-_." else "_" for c in run_id)[:200]


def open_run_cgroup(workdir: Path, run_id: str) -> tuple[RunCgroup | None, str]:
    """A cgroup for ``run_id`` under this process's own (made if missing), or None and why not."""
    own, why = own_cgroup_dir()
    if own is None:
        return None, why
    folder = own / base_name(workdir) / _safe_name(run_id)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return None, f"cannot make {folder}: {exc.strerror} (the agent's cgroup {own} is not delegated to it)"
    cg = RunCgroup(folder)
    # a process moves itself there (spawn_into): the kernel wants write access to the destination's cgroup.procs and
    # to that of the common ancestor, this process's own cgroup
    for procs_file in (cg.procs_file, own / "cgroup.procs"):
        if not os.access(procs_file, os.W_OK):
            with contextlib.suppress(OSError):
                folder.rmdir()
            return None, f"cannot move processes into {folder}: {procs_file} is not writable (not delegated)"
    return cg, ""


def spawn_into(cg: RunCgroup | None, argv: list[str]) -> list[str]:
    """``argv`` so that the process moves itself into ``cg`` before it runs (the same pid: ``exec``); a move that
    fails leaves it where it is (the subreaper still holds it). Pure."""
    if cg is None:
        return argv
    return ["/bin/sh", "-c", '{ echo 0 > "$0"; } 2>/dev/null; exec "$@"', str(cg.procs_file), *argv]


def leftover_cgroups(workdir: Path, keep: RunCgroup | None = None) -> list[RunCgroup]:
    """Run cgroups of ``workdir`` but ``keep``: a run at a time, so every other one is left by a run that ended
    without stopping them (an agent killed)."""
    own, _ = own_cgroup_dir()
    if own is None:
        return []
    base = own / base_name(workdir)
    try:
        found = [p for p in base.iterdir() if p.is_dir() and p.name.startswith("run-")]
    except OSError:
        return []
    return [RunCgroup(p) for p in sorted(found) if keep is None or p != keep.path]


def remove_cgroup(cg: RunCgroup) -> bool:
    """Remove the run's cgroup, and the work folder's when no other run has one there."""
    try:
        cg.path.rmdir()
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("cannot remove %s: %s", cg.path, exc.strerror)
        return False
    with contextlib.suppress(OSError):  # not empty (a run's cgroup left), or gone
        cg.path.parent.rmdir()
    return True


# --------------------------------------------------------------------------- finding and stopping
@dataclass(frozen=True)
class Left:
    """A process found where nothing should run any more."""

    pid: int
    command: str

    def one_line(self) -> str:
        return f"pid {self.pid} ({self.command})"


def _status(p: psutil.Process) -> str:
    try:
        return str(p.status())
    except psutil.Error:
        return str(psutil.STATUS_DEAD)


def _children(pid: int, recursive: bool = False) -> list[psutil.Process]:
    try:
        return list(psutil.Process(pid).children(recursive=recursive))
    except psutil.Error:
        return []


def command_of(p: psutil.Process | int) -> str:
    try:
        proc = p if isinstance(p, psutil.Process) else psutil.Process(p)
        cmd = " ".join(proc.cmdline()) or f"[{proc.name()}]"
    except psutil.Error:
        return "gone"
    return cmd if len(cmd) <= 200 else cmd[:197] + "..."


def has_children() -> bool:
    """Whether this process has any child, live or zombie: one system call, no walk of the process table."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def adopted() -> list[psutil.Process]:
    """This process's descendants under children it does not own (as a subreaper: orphans of what it started,
    and theirs); [] when it is not a subreaper (then it adopts nothing, and its other children are not a run's)."""
    if not REAPER.running or not has_children():
        return []
    owned = REAPER.owned()
    out: list[psutil.Process] = []
    for child in _children(os.getpid()):
        if child.pid in owned:
            continue
        out.append(child)
        out.extend(_children(child.pid, recursive=True))
    return out


def _live(procs: Iterable[psutil.Process]) -> list[psutil.Process]:
    return [p for p in procs if p.pid != os.getpid() and _status(p) not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)]


def kill_all(procs: list[psutil.Process], grace: float, cgroups: Iterable[RunCgroup] = ()) -> list[Left]:
    """Stop ``procs`` and everything in ``cgroups``: SIGTERM, SIGKILL what is left after ``grace``; the zombies of
    those that were this process's children are reaped. Returns what was running."""
    cgs = list(cgroups)
    by_pid = {p.pid: p for p in procs}
    for cg in cgs:
        for pid in cg.pids():
            with contextlib.suppress(psutil.Error):
                by_pid.setdefault(pid, psutil.Process(pid))
    live = _live(by_pid.values())
    if not live:
        return []
    left = [Left(p.pid, command_of(p)) for p in live]
    for p in live:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and _live(live):
        time.sleep(0.05)
    # race-free where the kernel has it (5.14): kills what forked meanwhile too
    for cg in cgs:
        with contextlib.suppress(OSError):
            (cg.path / "cgroup.kill").write_text("1")
    for _ in range(40):
        still = _live(live) + [p for cg in cgs for p in _live(_procs(cg.pids()))]
        if not still:
            break
        for p in still:
            with contextlib.suppress(psutil.Error):
                p.kill()
        time.sleep(0.05)
    me, owned = os.getpid(), REAPER.owned()
    for p in live:  # a zombie of ours that no one else waits for
        with contextlib.suppress(psutil.Error, ChildProcessError, OSError):
            if p.pid not in owned and p.ppid() == me:
                os.waitpid(p.pid, os.WNOHANG)
    return left


def _procs(pids: Iterable[int]) -> list[psutil.Process]:
    out = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            out.append(psutil.Process(pid))
    return out


def sweep(cg: RunCgroup | None, grace: float) -> list[Left]:
    """Stop every process a run left: those in its cgroup and the agent's adopted descendants."""
    return kill_all(adopted(), grace, [cg] if cg is not None else [])


def sweep_leftover_cgroups(workdir: Path, grace: float, keep: RunCgroup | None = None) -> list[Left]:
    """Stop what earlier runs of ``workdir`` left in their cgroups, and remove those cgroups."""
    stale = leftover_cgroups(workdir, keep)
    if not stale:
        return []
    left = kill_all([], grace, stale)
    for cg in stale:
        remove_cgroup(cg)
    return left


def port_holders(port: int) -> list[int | None]:
    """Pids of the processes listening on TCP ``port`` (None for a socket whose owner this user cannot see)."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError) as exc:
        log.warning("cannot list sockets: %s", exc)
        return [None]
    found = {c.pid for c in conns if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port}
    return sorted(found, key=lambda p: (p is None, p or 0))


def is_ours(pid: int, workdir: Path) -> bool:
    """Whether ``pid`` is a process of this agent's runs on ``workdir``: in one of its run cgroups, adopted by it,
    or carrying its :data:`MARK`."""
    path = cgroup_v2_path(_read(f"/proc/{pid}/cgroup")) or ""
    if f"/{base_name(workdir)}/" in path + "/":
        return True
    if pid in {p.pid for p in adopted()}:
        return True
    try:
        mark = psutil.Process(pid).environ().get(MARK)
    except (psutil.Error, OSError):
        return False
    return mark is not None and Path(mark).resolve() == workdir.resolve()


def tree(pid: int) -> list[psutil.Process]:
    """``pid`` and its descendants."""
    try:
        p = psutil.Process(pid)
    except psutil.Error:
        return []
    return [p, *_children(pid, recursive=True)]

