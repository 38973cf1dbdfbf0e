"""This repository's agent and controller as they were at the last commit of the previous contract version (ADR 0051),
unpacked from git (``git archive``) for a lab that mixes versions: run them with ``PYTHONPATH`` on that folder, the
venv's dependencies shared."""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

import pytest

from contract.version import SCHEMA_VERSION

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("agent", "contract", "controller")


def previous_contract_commit(version: int = SCHEMA_VERSION) -> tuple[str | None, str]:
    """(the commit before the one that set ``SCHEMA_VERSION = <version>`` in contract/version.py, or None; why not:
    git's own words, or a shallow clone that lacks it)."""
    try:
        out = subprocess.run(["git", "-C", str(ROOT), "log", "--format=%H", "-S", f"SCHEMA_VERSION = {version}",
                              "--", "contract/version.py"], capture_output=True, text=True, timeout=60)
        if out.returncode != 0:
            return None, f"git log: {out.stderr.strip()[:200]}"
        first = out.stdout.split()[-1] if out.stdout.split() else None
        if first is None:
            return None, f"no commit sets SCHEMA_VERSION = {version}"
        parent = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet", f"{first}^"],
                                capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"git: {exc}"
    commit = parent.stdout.strip()
    return (commit, "") if commit else (None, f"{first[:12]}'s parent is not in this clone (a shallow clone? "
                                              "`git fetch --unshallow`)")


def earlier_tree(dest: Path) -> tuple[Path, str]:
    """(folder holding agent/, contract/ and controller/ of the previous contract version, its commit); the test is
    skipped, saying why, where this checkout has no such commit."""
    commit, why = previous_contract_commit()
    if commit is None:
        pytest.skip(f"no commit of contract {SCHEMA_VERSION - 1} in this checkout: {why}")
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", commit, *PACKAGES],
                         capture_output=True, timeout=120, check=True).stdout
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(tar)) as tf:
        tf.extractall(dest, filter="data")
    found = (dest / "contract" / "version.py").read_text(encoding="utf-8")
    assert f"SCHEMA_VERSION = {SCHEMA_VERSION - 1}" in found, f"{commit}: not contract {SCHEMA_VERSION - 1}"
    return dest, commit
