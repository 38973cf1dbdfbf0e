"""controller/report/model.py holds records only: it imports nothing from ``controller.report``.

Every import statement counts, wherever it stands (module level, inside a function, under
``TYPE_CHECKING``): the records are what every other report module imports, so one import back
would make a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path

import controller.report

MODEL = Path(controller.report.__file__).parent / "model.py"


def _imported(tree: ast.AST) -> list[str]:
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # a relative import: from inside controller.report
                names.append("." * node.level + (node.module or ""))
            else:
                names.append(node.module or "")
                names += [f"{node.module}.{a.name}" for a in node.names]
    return names


def test_model_imports_nothing_from_controller_report() -> None:
    found = [n for n in _imported(ast.parse(MODEL.read_text(encoding="utf-8")))
             if n.startswith(".") or n == "controller.report" or n.startswith("controller.report.")]
    assert not found, f"{MODEL} imports {found}"


def test_the_walk_sees_every_kind_of_import() -> None:
    code = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from controller.report.telemetry import X\n"
            "def f():\n    import controller.report.render\nfrom . import analysis\nfrom controller import report\n")
    assert sorted(_imported(ast.parse(code))) == sorted([
        "typing", "typing.TYPE_CHECKING", "controller.report.telemetry", "controller.report.telemetry.X",
        "controller.report.render", ".", "controller", "controller.report"])
