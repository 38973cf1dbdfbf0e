"""Prose inside the product code (issue 50, item 6), read with ``tokenize`` and ``ast`` (nothing imported).

* Imports sit at a module's top. One inside a function is for start-up time, and says so: either it loads a
  library whose import cost ADR 0059 measured (``LAZY_LIBRARIES``), or its module's docstring has a paragraph
  starting ``Lazy imports:`` that names the figure and the bench that measured it (``bench/...``). An import
  under ``if TYPE_CHECKING:`` never runs and does not count.
* Comments say why, above the line they explain: a comment at the end of a code line is at most
  ``TRAILING_MAX`` characters, and such comments are at most ``TRAILING_SHARE`` of a package's code lines
  (the anchors of issue 50: 0.2-1.7 %).
* A comment does not narrate a measurement: one that quotes a figure (milliseconds, MiB, "3x", "~40",
  "measured ... 12") cites where it lives (``bench/`` or an ADR); the figures go in ``bench/results/`` and commits.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# each package, and the controller by its sub-packages (its top-level modules as "controller/")
UNITS = ("agent", "contract", "controller/", "controller/cli", "controller/fleet", "controller/history",
         "controller/remote", "controller/report", "controller/serve", "controller/service")
TRAILING_MAX = 60
TRAILING_SHARE = 0.02
# third-party libraries whose import a light verb or an idle agent must not pay (figures: ADR 0059)
LAZY_LIBRARIES = frozenset({
    "pandas", "pyarrow", "numpy", "scipy", "celery", "kombu", "redis", "fastapi", "fastapi_offline", "starlette",
    "uvicorn", "psycopg", "psycopg_pool", "paramiko", "fabric", "invoke", "jinja2", "rich", "prometheus_client",
    "tokenizers", "transformers", "psutil", "httpx", "matplotlib", "pynvml",
})
PRAGMAS = ("# noqa", "# type:", "# pragma", "# nosec")
MEASURED = re.compile(r"\d\s?(ms|us|µs|MiB|GiB)\b|\d(\.\d+)?x\b|~\d|\bmeasured\b.*\d|\d.*\bmeasured\b", re.IGNORECASE)
CITED = re.compile(r"bench/|ADR \d{4}|adr/\d{4}")


def _files(unit: str) -> list[Path]:
    found = (ROOT / unit).glob("*.py") if unit.endswith("/") else (ROOT / unit).rglob("*.py")
    return sorted(p for p in found if "scripts" not in p.parts)


def test_the_units_cover_every_module() -> None:
    covered = {p for unit in UNITS for p in _files(unit)}
    assert covered == {p for pkg in ("agent", "contract", "controller") for p in _files(pkg)}


def _lazy_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    out: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST, inside: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and getattr(child.test, "id", getattr(child.test, "attr", "")) == \
                    "TYPE_CHECKING":
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)) and inside:
                out.append(child)
            visit(child, inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(tree, False)
    return out


def _root(node: ast.Import | ast.ImportFrom) -> str:
    if isinstance(node, ast.ImportFrom):
        return "." if node.level else (node.module or "").split(".")[0]
    return node.names[0].name.split(".")[0]


def _says_why(tree: ast.Module) -> bool:
    doc = ast.get_docstring(tree) or ""
    para = next((p for p in doc.split("\n\n") if p.lstrip().startswith("Lazy imports:")), "")
    return bool(re.search(r"\d", para)) and "bench/" in para


def _comments(src: str) -> tuple[int, list[tuple[int, str]], list[tuple[int, str]]]:
    """(code lines, trailing comments, all comments) of one module."""
    toks = list(tokenize.generate_tokens(io.StringIO(src).readline))
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    code = {t.start[0] for t in toks if t.type not in skip}
    comments = [(t.start[0], t.string) for t in toks if t.type == tokenize.COMMENT]
    trailing = [(n, c) for n, c in comments if n in code and not c.startswith(PRAGMAS)]
    return len(code), trailing, comments


@pytest.mark.parametrize("pkg", UNITS)
def test_imports_sit_at_the_top_unless_a_measured_cost_says_otherwise(pkg: str) -> None:
    bad = []
    for path in _files(pkg):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        if _says_why(tree):
            continue
        for node in _lazy_imports(tree):
            if _root(node) not in LAZY_LIBRARIES:
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: {ast.unparse(node)}")
    assert not bad, f"{len(bad)} imports inside functions with no measured reason:\n" + "\n".join(bad)


@pytest.mark.parametrize("pkg", UNITS)
def test_comments_at_the_end_of_a_line_are_short_and_few(pkg: str) -> None:
    lines = 0
    trailing: list[str] = []
    long = []
    for path in _files(pkg):
        n, found, _ = _comments(path.read_text(encoding="utf-8"))
        lines += n
        trailing += [f"{path.relative_to(ROOT)}:{no}" for no, _ in found]
        long += [f"{path.relative_to(ROOT)}:{no}: {c}" for no, c in found if len(c) > TRAILING_MAX]
    assert not long, f"{len(long)} end-of-line comments over {TRAILING_MAX} characters:\n" + "\n".join(long)
    assert len(trailing) <= TRAILING_SHARE * lines, (
        f"{len(trailing)} end-of-line comments in {lines} code lines ({len(trailing) / lines:.1%}, "
        f"at most {TRAILING_SHARE:.0%})")


@pytest.mark.parametrize("pkg", UNITS)
def test_no_comment_narrates_a_measurement(pkg: str) -> None:
    bad = []
    for path in _files(pkg):
        _, _, comments = _comments(path.read_text(encoding="utf-8"))
        bad += [f"{path.relative_to(ROOT)}:{no}: {c}" for no, c in comments if MEASURED.search(c)
                and not CITED.search(c)]
    assert not bad, "comments quoting a measured figure without naming where it lives:\n" + "\n".join(bad)


def test_the_readers_find_what_they_look_for() -> None:
    src = ('"""A module.\n\nLazy imports: pandas costs 0.3 s (bench/cli.py).\n"""\n'
           "import os\n\n\ndef f():\n    import json\n    x = 1  # " + "w" * 70 + "\n\n\n"
           "if TYPE_CHECKING:\n    import sys\n")
    tree = ast.parse(src)
    assert [ast.unparse(n) for n in _lazy_imports(tree)] == ["import json"]
    assert _says_why(tree)
    assert not _says_why(ast.parse('"""Lazy imports: for speed."""'))
    n, trailing, _ = _comments(src)
    assert n == 7 and [no for no, _ in trailing] == [10]
    assert MEASURED.search("# measured 12 here") and not MEASURED.search("# measured by the bench")
    assert MEASURED.search("# 4x a lexsort") and MEASURED.search("# ~40 us each") and MEASURED.search("# 1.3 ms")
    assert not MEASURED.search("# at most 64 KiB, 300 s")
