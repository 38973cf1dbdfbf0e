"""A small tmpfs for the tests that fill a disk for real (needs root and mount: skipped, saying so, without)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def mounted_tmpfs(mnt: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted on ``mnt`` with ``options`` (e.g. ``size=2m``), unmounted after."""
    mnt.mkdir(parents=True)
    if os.geteuid() != 0:
        pytest.skip("needs root to mount a small tmpfs")
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mnt)], capture_output=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount tmpfs: {res.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
