"""The built docs site loads nothing from the network (labs are offline): ``make docs`` runs this over its output.

``python docs/tools/check_offline.py docs/_build/html`` lists every place a page, a stylesheet or a script would
fetch from ``http(s)://`` or a protocol-relative ``//`` address, one a line, and exits 1; it exits 0 when there is
none. What loads: an element's ``src``/``srcset``/``data``/``poster``/``background``, a ``<link href>``, a meta
refresh, a CSS ``url()`` or ``@import`` (in files, ``<style>`` and ``style=""``), and a URL string in a script.
Links a reader follows (``<a href>``), XML namespaces (``xmlns``, ``http://www.w3.org/...`` in a script) and
URLs shown as text are not loads. Standard library only.
"""

from __future__ import annotations

import re
import sys
from html.parser import HTMLParser
from pathlib import Path

REMOTE = re.compile(r"^\s*(https?:)?//", re.I)
CSS_LOAD = re.compile(r"""url\(\s*['"]?\s*((?:https?:)?//[^'")\s]*)"""
                      r"""|@import\s+(?:url\(\s*)?['"]?\s*((?:https?:)?//[^'")\s;]*)""", re.I)
# a URL in a script's string literal, except the W3C's namespace names (createElementNS), which are never fetched
JS_LOAD = re.compile(r"""["'`]((?:https?:)?//(?!www\.w3\.org/)[^"'`\s]*)""", re.I)
LOAD_ATTRS = ("src", "srcset", "data", "poster", "background")


def css_loads(text: str) -> list[str]:
    return [a or b for a, b in CSS_LOAD.findall(text)]


def js_loads(text: str) -> list[str]:
    """URL literals of a script; comments dropped first (a licence header's URL is not a load)."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"(^|[^:\"'\\])//[^\n]*", r"\1", text)
    return JS_LOAD.findall(text)


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.found: list[str] = []
        self._in: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k.lower(): v or "" for k, v in attrs}
        for name in LOAD_ATTRS:
            if name in a and any(REMOTE.match(part) for part in a[name].split(",")):
                self.found.append(f"<{tag} {name}={a[name].strip()}>")
        if tag == "link" and REMOTE.match(a.get("href", "")):
            self.found.append(f"<link rel={a.get('rel', '')} href={a['href'].strip()}>")
        if tag == "meta" and a.get("http-equiv", "").lower() == "refresh" and re.search(r"url\s*=\s*(https?:)?//",
                                                                                           a.get("content", ""), re.I):
            self.found.append(f"<meta http-equiv=refresh content={a['content']}>")
        self.found += [f"<{tag} style=...url({u})>" for u in css_loads(a.get("style", ""))]
        self._in = tag if tag in ("style", "script") else None

    def handle_endtag(self, tag: str) -> None:
        self._in = None

    def handle_data(self, data: str) -> None:
        if self._in == "style":
            self.found += [f"<style> {u}" for u in css_loads(data)]
        elif self._in == "script":
            self.found += [f"<script> {u}" for u in js_loads(data)]


def check(site: Path) -> list[str]:
    """Every load from the network in the site, as ``path: what``, in path order."""
    out: list[str] = []
    for path in sorted(site.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(site)
        if path.suffix in (".html", ".htm"):
            page = _Page()
            page.feed(path.read_text(encoding="utf-8", errors="replace"))
            page.close()
            out += [f"{rel}: {what}" for what in page.found]
        elif path.suffix == ".css":
            out += [f"{rel}: url({u})" for u in css_loads(path.read_text(encoding="utf-8", errors="replace"))]
        elif path.suffix in (".js", ".mjs"):
            out += [f"{rel}: {u}" for u in js_loads(path.read_text(encoding="utf-8", errors="replace"))]
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: check_offline.py SITE_DIR (the built HTML, e.g. docs/_build/html)", file=sys.stderr)
        return 2
    found = check(Path(argv[0]))
    for line in found:
        print(f"{argv[0]}/{line}: loads from the network (the docs must work offline)", file=sys.stderr)
    if not found:
        print(f"docs: nothing in {argv[0]} loads from the network")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
