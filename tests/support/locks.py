"""A lock of this machine's, by name: held while a test uses fixed machine-wide names (a network namespace, a veth
pair, a subnet), so that two such fixtures, on two xdist workers or in two checkouts, wait for each other."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def machine_lock(name: str) -> Iterator[None]:
    """``<tmp>/m1000-fleet-<name>.lock``, held exclusively until the block ends (closing it lets it go)."""
    fd = os.open(Path(tempfile.gettempdir()) / f"m1000-fleet-{name}.lock", os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
