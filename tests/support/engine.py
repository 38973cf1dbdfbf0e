"""Where the real-engine tier's pieces are: the repository, its engine fixtures, the engine's interpreter."""

from __future__ import annotations

import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "engine"


def engine_python() -> Path | None:
    """The interpreter with torch + transformers[serving] (``make engine``), or None."""
    raw = os.environ.get("M1000_TEST_ENGINE_PYTHON")
    path = Path(raw) if raw else REPO / ".venv-engine" / "bin" / "python"
    return path if path.exists() else None


def llama_server(timeout: float = 2400.0) -> Path | None:
    """The llama-server ``make engine`` built, waiting for a build in progress (``make test`` starts one in the
    background); None when there is none."""
    from simulator.engine.llamacpp import wait_built

    built = wait_built(timeout)
    return built.server if built is not None else None
