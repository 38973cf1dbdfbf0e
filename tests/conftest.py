"""Shared fixtures: where the reference document is, and helpers for every tier."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

from tests.support.redis_server import shared_redis  # noqa: F401 - the fixture, registered by name

ROOT = Path(__file__).resolve().parent.parent

# No per-example deadline: on a loaded 2-core machine (make test builds llama.cpp beside the fast tier) one
# example of a property test passed alone and failed the default 200 ms deadline; pytest's 300 s timeout bounds
# a test that really hangs.
settings.register_profile("m1000", deadline=None)
settings.load_profile("m1000")


def _seed_path() -> Path:
    env = os.environ.get("M1000_SEED")
    if env:
        return Path(env)
    for base in (ROOT.parent / "shared" / "seeds", ROOT / "simulator" / "data"):
        for name in ("000_29a7ee896c0fa7ef.txt", "reference_tables.txt"):
            if (base / name).exists():
                return base / name
    raise FileNotFoundError("reference document not found: set M1000_SEED")


pytest_plugins = ["tests.support.budget"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that need llama-server run last: ``make test`` builds it in the background meanwhile. Test modules
    in the order of their time in a recent slow tier, longest first (tests/durations.json; a module not timed yet
    counts as the longest): ``pytest -n N --dist loadfile --no-loadscope-reorder`` (make test's slow tier) hands
    whole modules out in this order, and a 90 s module met last keeps one worker busy while the others idle."""
    from tests.support.budget import load_durations, module_of  # imported as a plugin first (pytest_plugins)

    took = load_durations(ROOT / "tests" / "durations.json")  # make test-durations writes it
    items.sort(key=lambda item: (item.get_closest_marker("llama") is not None,
                                 -took.get(module_of(item.nodeid), float("inf"))))


@pytest.fixture(scope="session")
def seed_path() -> Path:
    return _seed_path()


@pytest.fixture(scope="session")
def seed_text(seed_path: Path) -> str:
    return seed_path.read_text(encoding="utf-8")
