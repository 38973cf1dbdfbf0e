"""Keeps a bench script's raw output: the one place under ``bench/`` that writes ``bench/results/``.

Every bench script ends with ``raise SystemExit(record.main(main, __file__))``. While ``main`` runs, what it
prints (stdout and stderr, in the order printed) goes to the terminal as before and into
``bench/results/<script>_<YYYYMMDD_HHMM>[_<label>].txt`` (UTC), between a header and a footer that say where
the figures come from:

- the UTC time, the git commit and the tracked files that differed from it (``dirty``; the docs, Markdown files and
  ``bench/results/`` do not count: they change no figure);
- the command line, the CPU model, the CPU count (and how many this process may use), memory, Python;
- the load average at the start and at the end, the wall time and the exit status.

Environment (read once, here):

- ``BENCH_RECORD=0``: print only, keep nothing (a test or a trial run that must not litter ``bench/results``);
- ``BENCH_LABEL=after``: the file's ``_<label>`` suffix (letters, digits, ``-``).

``-h``/``--help`` is not a run: nothing is kept.

Children of a recorded script (a bench script run again as a child, as ``bench/probe.py``, ``bench/report.py``
and ``bench/stdlib_standins.py`` do) inherit ``BENCH_RECORD=0``: one run, one file. The script's exit status is
kept as it is: a bench that misses its goal still exits 1 (and its file says so).
"""

from __future__ import annotations

import os
import platform
import re
import shlex
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TextIO

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
OFF = {"0", "no", "off", "false"}
LABEL = re.compile(r"[A-Za-z0-9-]+")
NOT_CODE = (":(exclude)docs", ":(exclude)bench/results", ":(exclude)*.md")


@dataclass(frozen=True)
class Machine:
    """Where and when a bench ran: the header's facts, gathered once."""

    started: datetime
    commit: str
    dirty: tuple[str, ...]  # tracked files that differ from the commit (docs and results not counted)
    command: str
    cpu_model: str
    cpus: int
    usable_cpus: int
    mem_gib: float
    python: str
    load: tuple[float, float, float]


def result_path(results: Path, script: str, started: datetime, label: str = "") -> Path:
    """``<results>/<script>_<YYYYMMDD_HHMM>[_<label>].txt`` (``started`` in UTC); ``_2``, ``_3`` ... before
    ``.txt`` when that name is taken (two runs in one minute)."""
    stem = f"{Path(script).stem}_{started.astimezone(timezone.utc):%Y%m%d_%H%M}" + (f"_{label}" if label else "")
    path, n = results / f"{stem}.txt", 1
    while path.exists():
        n += 1
        path = results / f"{stem}_{n}.txt"
    return path


def header(m: Machine, script: str) -> str:
    load = " ".join(f"{x:.2f}" for x in m.load)
    return (f"# {script}: raw output, kept by bench/record.py\n"
            f"# started   {m.started:%Y-%m-%d %H:%M:%S} UTC\n"
            f"# commit    {m.commit} ({_dirty(m.dirty)})\n"
            f"# command   {m.command}\n"
            f"# machine   {m.cpu_model}, {m.cpus} CPUs ({m.usable_cpus} usable), {m.mem_gib:.1f} GiB memory, "
            f"Python {m.python}\n"
            f"# load avg  {load} (1, 5, 15 min) at start\n\n")


def _dirty(files: tuple[str, ...]) -> str:
    if not files:
        return "clean"
    return f"dirty: {', '.join(files[:5])}{f' and {len(files) - 5} more' if len(files) > 5 else ''} differ from it"


def footer(code: int, wall_s: float, load: tuple[float, float, float], ended: datetime) -> str:
    return (f"\n# ended     {ended:%Y-%m-%d %H:%M:%S} UTC after {wall_s:.0f} s; exit {code}\n"
            f"# load avg  {' '.join(f'{x:.2f}' for x in load)} (1, 5, 15 min) at end\n")


def _git(*args: str) -> str:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.rstrip() if out.returncode == 0 else ""


def _cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown CPU"
    found = re.search(r"^model name\s*:\s*(.+)$", text, re.MULTILINE)
    return found.group(1).strip() if found else platform.processor() or "unknown CPU"


def _mem_gib() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        return 0.0


def machine() -> Machine:
    """The facts of this machine and checkout now (the one place that looks them up)."""
    return Machine(started=datetime.now(timezone.utc), commit=_git("rev-parse", "--short", "HEAD") or "unknown",
                   dirty=tuple(line[3:] for line in _git("status", "--porcelain", "--untracked-files=no", "--", ".",
                                                         *NOT_CODE).splitlines()),
                   command=shlex.join(sys.orig_argv), cpu_model=_cpu_model(), cpus=os.cpu_count() or 0,
                   usable_cpus=len(os.sched_getaffinity(0)), mem_gib=_mem_gib(), python=platform.python_version(),
                   load=os.getloadavg())


class _Tee:
    """A text stream that writes to the terminal's stream and to the raw file (one lock for both streams, so
    lines printed from threads and from stdout and stderr stay whole and in order)."""

    def __init__(self, term: TextIO, file: TextIO, lock: threading.Lock) -> None:
        self._term, self._file, self._lock = term, file, lock

    def write(self, s: str) -> int:
        with self._lock:
            self._file.write(s)
            return self._term.write(s)

    def flush(self) -> None:
        with self._lock:
            self._file.flush()
            self._term.flush()

    def isatty(self) -> bool:
        return self._term.isatty()

    def fileno(self) -> int:
        return self._term.fileno()

    @property
    def encoding(self) -> str:
        return self._term.encoding


def _exit_code(code: object) -> int:
    """SystemExit's code as the interpreter turns it into a status (a message is printed, status 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def _call(run: Callable[[], int | None]) -> int:
    try:
        return _exit_code(run())
    except SystemExit as exc:
        return _exit_code(exc.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        return 130
    except Exception:  # printed into the raw file as the interpreter would, then status 1
        traceback.print_exc()
        return 1


def main(run: Callable[[], int | None], script: str, results: Path = RESULTS) -> int:
    """Run a bench's ``main`` with its output kept (see the module's docstring); its exit status."""
    if os.environ.get("BENCH_RECORD", "").strip().lower() in OFF or {"-h", "--help"} & set(sys.argv[1:]):
        return _call(run)
    label = os.environ.get("BENCH_LABEL", "").strip()
    if label and not LABEL.fullmatch(label):
        print(f"BENCH_LABEL={label!r}: letters, digits and '-' only (it ends the file name)", file=sys.stderr)
        return 2
    m = machine()
    path = result_path(results, script, m.started, label)
    path.parent.mkdir(parents=True, exist_ok=True)
    name = Path(script).resolve().relative_to(ROOT) if Path(script).resolve().is_relative_to(ROOT) else script
    t0 = time.monotonic()
    saved_env = os.environ.get("BENCH_RECORD")
    with path.open("x", encoding="utf-8") as f:
        f.write(header(m, str(name)))
        lock = threading.Lock()
        out, err = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = _Tee(out, f, lock), _Tee(err, f, lock)
        os.environ["BENCH_RECORD"] = "0"  # children that are bench scripts: one run, one file
        try:
            code = _call(run)
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            sys.stdout, sys.stderr = out, err
            if saved_env is None:
                os.environ.pop("BENCH_RECORD", None)
            else:
                os.environ["BENCH_RECORD"] = saved_env
        f.write(footer(code, time.monotonic() - t0, os.getloadavg(), datetime.now(timezone.utc)))
    print(f"raw output: {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}", file=sys.stderr)
    return code
