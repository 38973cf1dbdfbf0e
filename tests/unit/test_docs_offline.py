"""The docs site loads nothing from the network: ``docs/tools/check_offline.py``, which ``make docs`` runs over the
built site (and ``make test`` runs ``make docs``), finds each way a page could fetch from http(s), and only those."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    """A script of the docs, not a package: loaded from its file."""
    spec = importlib.util.spec_from_file_location("check_offline", ROOT / "docs" / "tools" / "check_offline.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


check_offline = _load()

PAGE = """<!doctype html><html><head>
<link rel="stylesheet" href="https://cdn.example/furo.css">
<link rel="stylesheet" href="_static/furo.css">
<link rel="preconnect" href="//fonts.example">
<meta http-equiv="refresh" content="0; url=https://elsewhere.example/">
<style>@import url("https://fonts.example/inter.css"); .a { background: url(_static/x.png) }</style>
<script src="https://cdn.example/mathjax.js"></script>
<script src="_static/doctools.js"></script>
<script>fetch("https://api.example/track"); // see https://docs.example/comment
document.createElementNS("http://www.w3.org/2000/svg", "svg")</script>
</head><body>
<img src="https://img.example/logo.png"><img srcset="a.png 1x, https://img.example/b.png 2x">
<div style="background-image: url('//img.example/bg.png')"></div>
<svg xmlns="http://www.w3.org/2000/svg"></svg>
<a href="https://github.com/pradyunsg/furo">furo</a>
<pre>curl http://controller:8080/api/v1/runs</pre>
</body></html>
"""


def test_every_way_a_page_loads_from_the_network_is_found_and_nothing_else(tmp_path):
    (tmp_path / "index.html").write_text(PAGE)
    (tmp_path / "_static").mkdir()
    (tmp_path / "_static" / "site.css").write_text(
        "@import 'https://fonts.example/a.css';\n.i { background: url('data:image/svg+xml,<svg "
        "xmlns=\"http://www.w3.org/2000/svg\"/>') }\n.j { background: url(https://img.example/j.png) }\n")
    (tmp_path / "_static" / "site.js").write_text(
        "/* (c) https://licence.example */\n// https://comment.example\nconst ns = 'http://www.w3.org/2000/svg';\n"
        "load('https://cdn.example/more.js');\n")
    assert check_offline.check(tmp_path) == [
        "_static/site.css: url(https://fonts.example/a.css)",
        "_static/site.css: url(https://img.example/j.png)",
        "_static/site.js: https://cdn.example/more.js",
        "index.html: <link rel=stylesheet href=https://cdn.example/furo.css>",
        "index.html: <link rel=preconnect href=//fonts.example>",
        "index.html: <meta http-equiv=refresh content=0; url=https://elsewhere.example/>",
        "index.html: <style> https://fonts.example/inter.css",
        "index.html: <script src=https://cdn.example/mathjax.js>",
        "index.html: <script> https://api.example/track",
        "index.html: <img src=https://img.example/logo.png>",
        "index.html: <img srcset=a.png 1x, https://img.example/b.png 2x>",
        "index.html: <div style=...url(//img.example/bg.png)>",
    ]
    assert check_offline.main([str(tmp_path)]) == 1


def test_make_docs_runs_the_check_over_the_built_site():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    docs = re.search(r"^docs:.*?(?=^\S)", makefile, re.M | re.S)
    assert docs is not None
    assert "docs/tools/check_offline.py docs/_build/html" in docs.group(0)
