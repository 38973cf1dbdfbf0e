"""The shape of the code, read with ``ast`` (nothing imported): no import circle among the project's
modules, and every module under agent/, contract/, controller/ small, saying its one job first.

An import inside a function counts (a lazy import still ties the two modules together); one under
``if TYPE_CHECKING:`` does not (it never runs).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("agent", "contract", "controller", "simulator")
SMALL = ("agent", "contract", "controller")
MAX_LINES = 520  # the "about 500"


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports (a ``from pkg import sub`` names the submodule)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for a in node.names:
                sub = f"{base}.{a.name}"
                found.add(sub if sub in modules else base)
        for inner in ast.iter_child_nodes(node):
            visit(inner)

    visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
    out = set()
    for mod in found:
        while mod and mod not in modules:  # ``import a.b.c`` of a name inside a module: the module
            mod = mod.rpartition(".")[0]
        if mod and mod != name:
            out.add(mod)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    return out


def test_cycle_finder_finds_a_circle_and_passes_a_tree() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_no_import_circle_among_the_projects_modules() -> None:
    modules = _modules()
    graph = {name: _imported(name, path, modules) for name, path in modules.items()}
    circles = _cycles(graph)
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


def _small_modules() -> list[Path]:
    # a scripts/ folder (no __init__) holds programs sent to the modules (``python -c``) byte for byte, not modules
    return [p for pkg in SMALL for p in sorted((ROOT / pkg).rglob("*.py")) if p.parent.name != "scripts"]


@pytest.mark.parametrize("path", _small_modules(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_each_module_is_small_and_says_its_job_first(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    lines = text.count("\n")
    assert lines <= MAX_LINES, f"{path.relative_to(ROOT)}: {lines} lines (more than {MAX_LINES}): split it by job"
    doc = ast.get_docstring(ast.parse(text))
    if path.name == "__init__.py" and not text.strip():
        return  # an empty package marker
    assert doc and doc.strip(), f"{path.relative_to(ROOT)}: no docstring saying what its one job is"


MAX_FUNCTION_LINES = 80  # issue 50: "no function of the product code over ~80 lines"
# Functions still longer, "<path>:<name>" -> the issue whose work splits it: remove the entry when that work lands
# (none now: the last four, issue 50 item 3's, were split by that work).
LONG_FUNCTIONS_ALLOWED: dict[str, str] = {}


def _long_functions(path: Path, limit: int = MAX_FUNCTION_LINES) -> dict[str, int]:
    """``<path>:<name>`` -> lines, for each function (nested ones too) longer than ``limit`` lines."""
    rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
    out = {}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > limit:
                out[f"{rel}:{node.name}"] = length
    return out


def test_long_function_finder_counts_def_to_last_line(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(80))
    (tmp_path / "m.py").write_text(f"def short():\n{body[: body.rindex(chr(10))]}\n\n"
                                   f"async def long():\n{body}\n", encoding="utf-8")
    assert _long_functions(tmp_path / "m.py") == {"m.py:long": 81}


def test_no_product_function_over_80_lines() -> None:
    found: dict[str, int] = {}
    for pkg in SMALL:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            found.update(_long_functions(path))
    over = {k: v for k, v in found.items() if k not in LONG_FUNCTIONS_ALLOWED}
    listed = "\n".join(f"  {k}: {v} lines" for k, v in sorted(over.items()))
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines (split each into named steps):\n{listed}"
    stale = sorted(set(LONG_FUNCTIONS_ALLOWED) - set(found))
    assert not stale, f"no longer over {MAX_FUNCTION_LINES} lines, take them off LONG_FUNCTIONS_ALLOWED: {stale}"
