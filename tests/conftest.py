"""Shared fixtures: where the reference document is, and helpers for every tier."""

from __future__ import annotations

import json
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


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests that need llama-server run last: ``make test`` builds it in the background meanwhile.

    Under ``pytest -n N --dist loadgroup`` (``make test``'s slow tiers) every slow test module runs whole on one
    worker, so a module's fixtures (its redis-server, lab, release, real-engine run) are made once; the SSH tier
    (tests/ssh) is one group: its lab of network namespaces is one per session and holds the machine's lock
    (tests/ssh/netns.py) while it stands."""
    items.sort(key=lambda item: item.get_closest_marker("llama") is not None)
    if not getattr(config.option, "loadgroup", False):  # xdist sets it in each worker under --dist loadgroup
        return
    group: dict[str, str] = {}
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        group[item.nodeid] = "tests/ssh" if path.startswith("tests/ssh/") else path
        if item.get_closest_marker("slow") is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group[item.nodeid]))
    # longest groups first (make test passes --no-loadscope-reorder): handed out in collection order, a 90 s test
    # module met last keeps one worker busy while the others idle. A group not yet timed counts as the longest.
    took = _durations()
    items.sort(key=lambda item: -took.get(group[item.nodeid], float("inf")))


def _durations() -> dict[str, float]:
    """Each slow group's wall seconds in a recent make test (tests/durations.json; make test-durations rewrites it
    from build/slow-durations.json)."""
    try:
        raw = json.loads((ROOT / "tests" / "durations.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in raw.items()} if isinstance(raw, dict) else {}


@pytest.fixture(scope="session")
def seed_path() -> Path:
    return _seed_path()


@pytest.fixture(scope="session")
def seed_text(seed_path: Path) -> str:
    return seed_path.read_text(encoding="utf-8")
