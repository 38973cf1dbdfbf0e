"""Whole-file helpers both sides use: a file's sha256, and a write readers never see half done."""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def sha256_file(path: Path, chunk: int = 1 << 20, check: Callable[[], None] | None = None) -> str:
    """The hex sha256 of the file at ``path``, read ``chunk`` bytes at a time; ``check`` (if given) is
    called every 64 chunks (a caller's deadline or cancel check; what it raises goes through). A missing
    file or a folder raises the OSError ``open`` raises."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        n = 0
        while block := f.read(chunk):
            h.update(block)
            n += 1
            if check is not None and n % 64 == 0:
                check()
    return h.hexdigest()


def write_atomic(path: Path, text: str, mode: int | None = None) -> None:
    """Write-then-rename: readers see the old file or the whole new one.

    The text goes to a temporary file beside ``path`` (``.<name>.<random>.tmp``, made by ``mkstemp``,
    so permissions 0600 unless ``mode`` says otherwise), is fsynced, then renamed over ``path``; on any
    failure the temporary file is removed. The folder is made on the first write only (no mkdir per
    write); the folder itself is not fsynced (a crash may keep the old file, never a torn one).
    """
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
