"""What a release tarball holds for the pipeline: ``scripts/ci/musa/`` with its scripts, under one top folder.

The agent runs these files (:mod:`agent.steps` plans them, :func:`agent.unpack.find_top` finds the
folder holding ``scripts/ci/musa``); the controller checks a tarball's member names against them
before it dispatches (:class:`LayoutScan`, fed names as they are read, says as soon as every file is
seen), so that a file with a release's name but not its contents is refused once, in one line, not
by every module at unpack. Pure: names in, a verdict out.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable

from contract.records import MODEL_KEYS

WORKFLOW_DIR = "scripts/ci/musa"
CONFIG_JSON = f"{WORKFLOW_DIR}/tilelang_workflow_config.json"
GENERATE = f"{WORKFLOW_DIR}/generate_tilelang_workflow.sh"
SETUP_ENV = f"{WORKFLOW_DIR}/setup_env.sh"
PRECOMPILE = f"{WORKFLOW_DIR}/precompile_tilelang_kernels.sh"
BENCHMARK = f"{WORKFLOW_DIR}/run_tilelang_benchmark.sh"
PIPELINE_FILES = (CONFIG_JSON, GENERATE, SETUP_ENV, PRECOMPILE, BENCHMARK)


def start_script(key: str) -> str:
    """The script that starts ``key``'s server, as a path in the release."""
    return f"{WORKFLOW_DIR}/{MODEL_KEYS[key].start_script}"


def required_files(models: Iterable[str]) -> tuple[str, ...]:
    """The files a run of ``models`` needs in the release (paths under its top folder), in pipeline order."""
    out = list(PIPELINE_FILES)
    for key in models:
        path = start_script(key)
        if path not in out:
            out.append(path)
    return tuple(out)


class LayoutScan:
    """Member names of a tarball, fed one at a time: :meth:`add` says True once one top folder (the archive's
    root or a single folder under it) holds every required file; :meth:`missing` names what is not there."""

    def __init__(self, models: Iterable[str]) -> None:
        self.required = required_files(models)  # in pipeline order
        self._wanted = frozenset(self.required)
        # top folder ("" for the root) -> required files seen under it
        self._seen: dict[str, set[str]] = {}

    def add(self, name: str) -> bool:
        path = posixpath.normpath(name.lstrip("/"))  # "./top/x" -> "top/x"
        top, _, rest = path.partition("/")
        for folder, inner in (("", path), (top, rest)):
            if inner in self._wanted:
                seen = self._seen.setdefault(folder, set())
                seen.add(inner)
                if len(seen) == len(self.required):
                    return True
        return False

    @property
    def complete(self) -> bool:
        return any(len(seen) == len(self.required) for seen in self._seen.values())

    def missing(self) -> list[str]:
        """The required files the most complete top folder lacks, in pipeline order (all of them: none seen)."""
        best = max(self._seen.values(), key=len, default=set())
        return [f for f in self.required if f not in best]
