"""Fixtures of the real-engine tier: the engine's interpreter (.venv-engine) and random checkpoints made with it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.engine import engine_python, llama_server, make_models


@pytest.fixture(scope="session")
def engine_py() -> Path:
    path = engine_python()
    if path is None:
        pytest.skip("needs torch + transformers[serving]: .venv-engine (make engine; torch 2.13.0 CPU wheel on disk)")
    return path


@pytest.fixture(scope="session")
def engine_models(engine_py: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny random Qwen3-MoE checkpoints for qwen3 and qwen35 (shared with qwen35_mtp), made offline."""
    return make_models(engine_py, tmp_path_factory.mktemp("engine-models"), "transformers", "--keys", "qwen3,qwen35",
                       timeout=300)


@pytest.fixture(scope="session")
def llama_server_path() -> Path:
    server = llama_server()
    if server is None:
        pytest.skip("needs llama-server: make engine (builds it from the pinned llama.cpp source; cmake + ninja)")
    return server


@pytest.fixture(scope="session")
def llama_models(engine_py: Path, llama_server_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny random GGUF models for all seven keys, converted by llama.cpp's converter, made offline."""
    return make_models(engine_py, tmp_path_factory.mktemp("llama-models"), "llama.cpp")
