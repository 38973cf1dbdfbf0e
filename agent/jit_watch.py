"""Kernels compiled while a key's benchmark measured: the release's TileLang cache listed before and after the step.

TileLang compiles a kernel just in time when a shape was not precompiled, and keeps the library it built under
``TILELANG_CACHE_DIR`` (default ``~/.tilelang/cache``). A kernel library that appears there while the benchmark
runs means the figures measured in that window may include a compile (seconds each). The agent lists the cache's
file names before and after the step (no ``stat`` but for the new files; the cost is measured in
``bench/jit_watch.py``, the choice against inotify in ADR 0023), and stamps the key's release rows with what it
found (:class:`contract.records.ResultRow` ``jit_kernels``, ``jit_kernel_names``, ``jit_first_s``).

:func:`list_cache` is the I/O; :func:`compiled` and :func:`annotate` are pure.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import NamedTuple

from contract.records import ResultRow

# what a compiled kernel leaves: TileLang's kernel_lib.so (tvm's .so), device binaries, and the simulator's stand-in
KERNEL_SUFFIXES: tuple[str, ...] = (".so", ".cubin", ".mubin", ".cubin.json")
DEFAULT_CACHE = (".tilelang", "cache")  # under HOME when TILELANG_CACHE_DIR is unset
# a listing stops here: a cache this big is named as such, not walked for minutes
MAX_ENTRIES = 200_000
NAMES_KEPT = 20  # names stamped on a row at most (the count is exact)


class Listing(NamedTuple):
    """Kernel-library files of the cache (paths relative to it, '/'-separated); ``complete`` False: cut short."""

    names: frozenset[str]
    complete: bool = True


class Compiled(NamedTuple):
    """Kernel libraries that appeared during a step: how many, which (sorted), when the first did (seconds
    after the step started; None: none, or unknown)."""

    kernels: int = 0
    names: tuple[str, ...] = ()
    first_s: float | None = None

    def one_line(self) -> str:
        if not self.kernels:
            return "no kernel compiled while measuring"
        more = f" and {self.kernels - NAMES_KEPT} more" if self.kernels > NAMES_KEPT else ""
        when = f", the first {self.first_s:.1f} s into the step" if self.first_s is not None else ""
        return (f"{self.kernels} kernel(s) compiled while measuring{when}: {', '.join(self.names[:NAMES_KEPT])}"
                f"{more}; the figures include compile time")


def cache_dir(env: Mapping[str, str]) -> Path | None:
    """The TileLang cache a release's scripts use: ``TILELANG_CACHE_DIR``, else ``$HOME/.tilelang/cache``."""
    given = env.get("TILELANG_CACHE_DIR", "").strip()
    if given:
        return Path(given)
    home = env.get("HOME", "").strip()
    return Path(home, *DEFAULT_CACHE) if home else None


def is_kernel(name: str) -> bool:
    return name.endswith(KERNEL_SUFFIXES) and ".tmp" not in name


def list_cache(root: Path | None, limit: int = MAX_ENTRIES) -> Listing:
    """Kernel-library names under ``root`` (none when it does not exist); directory entries only, no ``stat``."""
    if root is None:
        return Listing(frozenset())
    names: set[str] = set()
    seen = 0
    stack = [(str(root), "")]
    while stack:
        path, rel = stack.pop()
        try:
            with os.scandir(path) as it:
                for e in it:
                    seen += 1
                    if seen > limit:
                        return Listing(frozenset(names), complete=False)
                    name = f"{rel}{e.name}"
                    if e.is_dir(follow_symlinks=False):
                        stack.append((e.path, f"{name}/"))
                    elif is_kernel(e.name):
                        names.add(name)
        except OSError:  # absent, or removed under us: what was listed stands
            continue
    return Listing(frozenset(names))


def compiled(before: Listing, after: Listing, mtimes: Mapping[str, float] | None = None,
             started: float | None = None) -> Compiled:
    """What appeared between two listings; ``mtimes`` (name -> modification time) and ``started`` (the step's start,
    same clock) give when the first one did. A listing cut short (``MAX_ENTRIES``) finds nothing: a name beyond
    the cut in one listing only is not a compile."""
    if not (before.complete and after.complete):
        return Compiled()
    new = sorted(after.names - before.names)
    if not new:
        return Compiled()
    times = [mtimes[n] for n in new if mtimes and n in mtimes]
    first = round(max(0.0, min(times) - started), 3) if times and started is not None else None
    return Compiled(kernels=len(new), names=tuple(new), first_s=first)


def mtimes_of(root: Path, names: Iterable[str]) -> dict[str, float]:
    """Modification times of the new files only (a file gone since: left out)."""
    out: dict[str, float] = {}
    for n in names:
        try:
            out[n] = (root / n).stat().st_mtime
        except OSError:
            continue
    return out


def annotate(rows: Iterable[ResultRow], found: Compiled) -> list[ResultRow]:
    """The rows with the step's compiled kernels on each release row (probe rows were measured after it)."""
    if not found.kernels:
        return list(rows)
    update = {"jit_kernels": found.kernels, "jit_kernel_names": "; ".join(found.names[:NAMES_KEPT]),
              "jit_first_s": found.first_s}
    return [r.model_copy(update=update) if r.source == "release" else r for r in rows]


class Watch:
    """One benchmark step's watch: made as the step starts (the first listing), :meth:`stop` lists the cache again
    and says what appeared. ``clock``: the step's start in ``time.time()`` seconds (what file times are in)."""

    def __init__(self, env: Mapping[str, str], clock: float) -> None:
        self.root = cache_dir(env)
        self.started = clock
        self.before = list_cache(self.root)

    def stop(self) -> Compiled:
        after = list_cache(self.root)
        new = after.names - self.before.names
        times = mtimes_of(self.root, new) if self.root is not None and new else {}
        return compiled(self.before, after, times, self.started)
