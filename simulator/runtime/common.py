"""Small helpers shared by the release's programs: files next to this package, env, errors."""

from __future__ import annotations

import os
import sys

from . import core, jsonc

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~3 ms of each interpreter's start)
if TYPE_CHECKING:
    from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
SETUP_ENV_VARS = ("SGLANG_MUSA_RELEASE_DIR", "TILELANG_WORKFLOW_FILE", "TILELANG_CACHE_DIR")


def release_file(name: str) -> str:
    return os.path.join(HERE, name)


def fail(prog: str, message: str, code: int = 1) -> int:
    print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
    return code


CONSOLE_ENV = "M1000_SIM_CONSOLE"  # a tty (a pty of socat's, served by ser2net) the simulated kernel prints to


def console_line(env: dict[str, str] | Any, text: str) -> None:
    """One kernel-like line on the simulated module's serial console, where ``M1000_SIM_CONSOLE`` names one
    (never blocking, never failing the program: a console nobody reads loses lines, as a UART does)."""
    path = env.get(CONSOLE_ENV)
    if not path:
        return
    with open("/proc/uptime") as fh:
        up = float(fh.read().split()[0])
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOCTTY | os.O_NONBLOCK | os.O_APPEND)
    except OSError:
        return
    try:
        os.write(fd, f"[{up:12.6f}] m1000 0000:01:00.0: {text}\r\n".encode())
    except OSError:
        pass
    finally:
        os.close(fd)


def load_knobs(env: dict[str, str] | Any) -> core.Knobs:
    """Knobs baked into the release (``knobs.json``) composed with the module's M1000_SIM_* env."""
    path = release_file("knobs.json")
    baked = core.Knobs()
    if os.path.exists(path):
        baked = core.Knobs.from_json(read_json(path), path)
    return baked.with_env(env)


def read_json(path: str, what: str = "") -> Any:
    """JSON from a file, or SimError naming the file (and line/column when malformed)."""
    label = what or path
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        raise core.SimError(f"{label}: not found") from None
    except OSError as exc:
        raise core.SimError(f"{label}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise core.SimError(f"{label}: not UTF-8 text") from None
    try:
        return jsonc.loads(text)
    except ValueError as exc:
        from json import JSONDecodeError  # what jsonc raises (the error path only)

        if not isinstance(exc, JSONDecodeError):
            raise
        raise core.SimError(f"{label}: malformed JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None


def write_atomic(path: str, text: str) -> None:
    """Write-then-rename: readers never see a half-written file."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def model_identity(path: str) -> str:
    """A model folder's identity: ``_name_or_path`` from its config.json, else the folder name."""
    cfg = os.path.join(path, "config.json")
    try:
        with open(cfg, encoding="utf-8") as fh:
            data = jsonc.loads(fh.read())
        name = data.get("_name_or_path") if isinstance(data, dict) else None
        if isinstance(name, str) and name.strip():
            return os.path.basename(name.rstrip("/"))
    except (OSError, ValueError):
        pass
    return os.path.basename(os.path.normpath(path))


def require_env(env: dict[str, str] | Any, names: tuple[str, ...] = SETUP_ENV_VARS) -> None:
    missing = [n for n in names if not env.get(n)]
    if missing:
        raise core.SimError(f"{', '.join(missing)} not set: run 'source scripts/ci/musa/setup_env.sh' first")


def raise_priority(env: dict[str, str] | Any) -> str | None:
    """Best effort: scheduling priority for the pacing processes (server, benchmark).

    At time scale N a wake-up delayed by 1 ms of wall time costs N ms of module time, and
    on a busy machine the scheduler delays sleepers by milliseconds. The simulated server
    and benchmark sleep almost all the time, so they can take a real-time round-robin
    priority (``rt``, the default, lowest RT level) or a better nice value (``nice``)
    without taking CPU from others. ``M1000_SIM_PRIORITY=off`` keeps the inherited one;
    without permission (not root, no CAP_SYS_NICE) nothing changes. Returns what was set.
    """
    mode = (env.get("M1000_SIM_PRIORITY") or "rt").strip().lower()
    if mode == "rt":
        try:
            os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))
            return "rt"
        except (AttributeError, PermissionError, OSError):
            mode = "nice"
    if mode == "nice":
        try:
            if os.getpriority(os.PRIO_PROCESS, 0) > -10:
                os.setpriority(os.PRIO_PROCESS, 0, -10)
            return "nice"
        except (PermissionError, OSError):
            return None
    return None
