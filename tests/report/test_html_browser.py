"""The HTML report in headless Chromium (Debian's /usr/bin/chromium): no console errors, no
failed or external requests, a screenshot saved; every text of the figures at least 11 px at the
default zoom and inside its figure (the heatmap's colorbar label whole)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from controller.report import analyse
from controller.report.render import write_report
from controller.report.synth import fleet
from tests.browser import chromium_page

pytestmark = [pytest.mark.browser, pytest.mark.slow]


@pytest.fixture(scope="module")
def report_html(reference, tmp_path_factory) -> Path:
    prev = fleet(reference, module_factor={"m03": 0.88}, seed=21, run_id="run-a")
    cur = fleet(reference, module_factor={"m03": 0.88}, regress={("qwen3", "decode_tps"): 0.08}, seed=22,
                run_id="run-b")
    rep = analyse(cur, run_id="run-b", release="1.4.2", baseline=reference, baseline_id="baseline:1.4.1:v1",
                  previous=prev)
    (path,) = write_report(rep, "html", tmp_path_factory.mktemp("html"))
    return path


def test_html_is_self_contained(report_html):
    text = report_html.read_text(encoding="utf-8")
    assert text.count("<svg") == 3 and "REGRESSED run-b" in text
    for pattern in (r"https?://(?!www\.w3\.org)", r"<script", r"<link", r"@import", r"url\((?!#)", r"<img"):
        assert not re.search(pattern, text), pattern


def test_html_opens_in_chromium_without_errors(report_html, tmp_path):
    with chromium_page() as (page, seen):
        page.goto(report_html.as_uri(), wait_until="load")
        assert page.title() == "Fleet report run-b"
        assert "REGRESSED run-b" in page.inner_text("p.verdict")
        assert page.locator("svg").count() == 3
        box = page.locator("svg").first.bounding_box()
        assert box and box["width"] > 400 and box["height"] > 200
        shot = tmp_path / "report.png"
        page.screenshot(path=str(shot), full_page=True)
    assert seen.errors == [] and seen.failed == []
    assert seen.requested == [report_html.as_uri()]
    assert shot.stat().st_size > 20_000  # docs/img/report.png comes from docs/tools/screenshots.py


# every <text> of every figure: its text, the smallest font size of it and its tspans in CSS px as shown,
# and whether its box lies inside its figure's box (half a pixel of slack for antialiasing)
FIGURE_TEXTS = """() => [...document.querySelectorAll("svg")].map((svg, i) => {
  const box = svg.getBoundingClientRect(), scale = box.width / svg.viewBox.baseVal.width;
  return [...svg.querySelectorAll("text")].map(t => {
    const r = t.getBoundingClientRect();
    const sizes = [t, ...t.querySelectorAll("tspan")].map(e => parseFloat(getComputedStyle(e).fontSize));
    return {figure: i, text: t.textContent.trim(), px: Math.min(...sizes) * scale,
            inside: r.left >= box.left - 0.5 && r.right <= box.right + 0.5 && r.top >= box.top - 0.5
                    && r.bottom <= box.bottom + 0.5};
  });
}).flat()"""


# matplotlib's group of each text (text or glyph paths alike) whose box leaves its figure: (figure, group id)
TEXT_GROUPS_OUTSIDE = """() => [...document.querySelectorAll("svg")].map((svg, i) => {
  const box = svg.getBoundingClientRect();
  return [...svg.querySelectorAll('g[id^="text_"]')].filter(g => {
    const r = g.getBoundingClientRect();
    return r.width > 0 && (r.left < box.left - 0.5 || r.right > box.right + 0.5 || r.top < box.top - 0.5
                           || r.bottom > box.bottom + 0.5);
  }).map(g => [i, g.id]);
}).flat()"""


@pytest.fixture(scope="module")
def demo_like_html(reference, tmp_path_factory) -> Path:
    """Four modules as ``make demo`` has (a short heatmap: its colorbar label was cut there)."""
    cur = fleet(reference, modules=4, module_factor={"m03": 0.88}, seed=23, run_id="run-d")
    rep = analyse(cur, run_id="run-d", release="1.4.2", baseline=reference, baseline_id="baseline:1.4.1:v1")
    (path,) = write_report(rep, "html", tmp_path_factory.mktemp("demo-like"))
    return path


def test_no_figure_text_leaves_its_figure(report_html, demo_like_html):
    for html in (report_html, demo_like_html):
        with chromium_page() as (page, seen):
            page.goto(html.as_uri(), wait_until="load")
            outside = page.evaluate(TEXT_GROUPS_OUTSIDE)
        assert seen.errors == []
        assert outside == [], html


def test_figure_texts_are_readable_and_inside_their_figures(report_html):
    with chromium_page() as (page, seen):  # 1300 x 900, zoom 100 %
        page.goto(report_html.as_uri(), wait_until="load")
        found = page.evaluate(FIGURE_TEXTS)
    assert seen.errors == []
    assert {f["figure"] for f in found} == {0, 1, 2} and len(found) > 100
    small = [(f["text"], round(f["px"], 2)) for f in found if f["px"] < 11]
    assert small == []
    assert min(f["px"] for f in found) == pytest.approx(8.5 * 4 / 3, abs=0.01)  # the page does not shrink them
    assert [f["text"] for f in found if not f["inside"]] == []
    label = [f for f in found if f["figure"] == 2 and f["text"] == "% vs fleet median"]
    assert len(label) == 1 and label[0]["inside"]
    cells = [f["text"] for f in found if f["figure"] == 2 and abs(f["px"] - 8.5 * 4 / 3) < 0.01]
    assert len(cells) == 6 * 7 and all(re.fullmatch(r"0\.0|[+-]\d+\.\d", c) for c in cells), cells
