"""The C allocator of the agent's own processes (glibc): free pages handed back to the kernel, its one seam.

Python frees what an import or a start-up step built, but glibc keeps the freed pages in its heaps,
resident. ``trim`` hands them back (``malloc_trim(0)``). The worker calls it once it serves
(``agent.worker.settle``). Elsewhere than glibc it does nothing. (Capping glibc's per-thread arenas,
``MALLOC_ARENA_MAX=2``, was measured too and moved nothing: the threads allocate through pymalloc.)
"""

from __future__ import annotations

import ctypes
import sys


def trim() -> bool:
    """Give the heaps' free pages back to the kernel; False where there is no glibc ``malloc_trim``."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        malloc_trim = ctypes.CDLL(None).malloc_trim  # the interpreter's own libc; glibc only (musl has none)
    except (OSError, AttributeError):
        return False
    malloc_trim(0)
    return True
