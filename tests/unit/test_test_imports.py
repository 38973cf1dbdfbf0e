"""Tests share code through ``tests/support/`` only: no file under ``tests/`` imports a test module
(``test_*.py``) or a conftest, its own folder's included.

Walks the sources with ``ast`` (nothing imported). A fixture another folder needs lives in ``tests.support``
and that folder's conftest imports it (so pytest registers it there); a helper another test module needs
moves to ``tests.support`` too. Helper modules of one folder (``tests/metrics/fleetfiles.py``) are not tests.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"


def _is_test_or_conftest(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "tests" and (parts[-1] == "conftest" or parts[-1].startswith("test_"))


def _imported(text: str, package: list[str]) -> list[tuple[str, int]]:
    """(dotted module, line) of every import in ``text`` of a file in ``package``; ``from pkg import name``
    gives ``pkg`` and ``pkg.name`` (the name may be a module); relative imports resolved; ``pytest_plugins``."""
    out: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - (node.level - 1)] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            out.append((module, node.lineno))
            out += [(f"{module}.{a.name}", node.lineno) for a in node.names]
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytest_plugins"
                                                   for t in node.targets):
            names = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else [node.value]
            out += [(n.value, node.lineno) for n in names if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    return out


def test_no_test_file_imports_a_test_module_or_a_conftest() -> None:
    bad = []
    for path in sorted(TESTS.rglob("*.py")):
        package = list(path.relative_to(ROOT).with_suffix("").parts[:-1])
        for module, line in _imported(path.read_text(encoding="utf-8"), package):
            if _is_test_or_conftest(module):
                bad.append(f"{path.relative_to(ROOT)}:{line}: imports {module} (move what it needs to tests.support)")
    assert not bad, "\n".join(bad)


def test_each_spelling_of_a_forbidden_import_is_caught() -> None:
    text = ("from tests.fleet.conftest import make_lab\nfrom .conftest import X\nimport tests.api.test_api\n"
            "from tests.fleet import test_dispatch\nfrom . import test_demo\npytest_plugins = ['tests.cli.conftest']\n"
            "from tests.support.lab import make_lab\nfrom tests.metrics.fleetfiles import heartbeat\nimport pytest\n")
    found = {m for m, _ in _imported(text, ["tests", "fleet"]) if _is_test_or_conftest(m)}
    assert found == {"tests.fleet.conftest", "tests.api.test_api", "tests.fleet.test_dispatch",
                     "tests.fleet.test_demo", "tests.cli.conftest"}
