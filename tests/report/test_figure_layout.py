"""Every figure of the HTML report, as headless Chromium lays it out, for reports of 1, 2, 3 and 7 model keys (the
getting-started run has 2, ``make demo`` 7): each legend whole inside its figure, no two labels of a figure
overlapping; a screenshot of each page is kept for a person to look at. The check is
shown to catch what it is for: a legend clipped on purpose (as it was with 1 or 2 keys, issue 51) fails it.

Boxes are measured in the page: each text's own box (``getBBox``) mapped through its transform to the screen
(``getScreenCTM``), so that rotated tick labels are compared as the rotated rectangles they are, 1 px smaller on
each side (antialiasing); two overlap when no axis separates them (separating axis theorem).
"""

from __future__ import annotations

import functools
from itertools import combinations
from pathlib import Path

import pytest

from controller.cli.demo import module_names, reference_rows
from controller.report import analyse
from controller.report.render import html as html_mod
from controller.report.render import write_report
from controller.report.synth import fleet, rows_frame
from tests.browser import chromium_page

pytestmark = [pytest.mark.browser, pytest.mark.slow]

KEYS = {1: ["qwen3"], 2: ["qwen3", "qwen3vl"], 3: ["qwen3", "qwen35", "qwen35_fq"], 7: None}

# per figure: its box, its legend's box (if any), each text's four corners on the screen (1 px inside its box)
LAYOUT = """() => [...document.querySelectorAll("svg")].map(svg => {
  const box = svg.getBoundingClientRect(), pt = svg.createSVGPoint();
  const corners = el => {
    const b = el.getBBox(), m = el.getScreenCTM(), i = Math.min(1, b.width / 2), j = Math.min(1, b.height / 2);
    return [[b.x + i, b.y + j], [b.x + b.width - i, b.y + j], [b.x + b.width - i, b.y + b.height - j],
            [b.x + i, b.y + b.height - j]].map(([x, y]) => { pt.x = x; pt.y = y; const p = pt.matrixTransform(m);
                                                            return [p.x, p.y]; });
  };
  const rect = r => [r.left, r.top, r.right, r.bottom];
  const legends = [...svg.querySelectorAll('g[id^="legend_"]')].map(g => rect(g.getBoundingClientRect()));
  const texts = [...svg.querySelectorAll("text")].filter(t => t.textContent.trim())
    .map(t => ({text: t.textContent.trim(), corners: corners(t), legend: !!t.closest('g[id^="legend_"]')}));
  return {box: rect(box), legends, texts};
})"""


def _axes(poly: list[list[float]]) -> list[tuple[float, float]]:
    return [(poly[i][1] - poly[i - 1][1], poly[i - 1][0] - poly[i][0]) for i in range(len(poly))]


def overlap(a: list[list[float]], b: list[list[float]]) -> bool:
    """Two convex polygons (screen corners) overlap: no edge normal of either separates their projections."""
    for nx, ny in _axes(a) + _axes(b):
        pa = [x * nx + y * ny for x, y in a]
        pb = [x * nx + y * ny for x, y in b]
        if max(pa) <= min(pb) or max(pb) <= min(pa):
            return False
    return True


def problems(figures: list[dict]) -> list[str]:
    """What a reader would see wrong in the page's figures: a legend not whole inside its figure, two labels of a
    figure on top of each other."""
    found = []
    for n, fig in enumerate(figures):
        left, top, right, bottom = fig["box"]
        for lb in fig["legends"]:
            if lb[0] < left - 0.5 or lb[1] < top - 0.5 or lb[2] > right + 0.5 or lb[3] > bottom + 0.5:
                found.append(f"figure {n}: legend {[round(v) for v in lb]} leaves the figure "
                             f"{[round(v) for v in fig['box']]}")
        for a, b in combinations(fig["texts"], 2):
            if overlap(a["corners"], b["corners"]):
                found.append(f"figure {n}: {a['text']!r} overlaps {b['text']!r}")
    return found


def report_of(keys: list[str] | None, out: Path) -> Path:
    """A demo-like run (4 modules, the last 12 % slower) of these keys (None: all 7) against the reference."""
    reference = rows_frame(reference_rows())
    if keys is not None:
        reference = reference[reference["model_key"].isin(keys)]
    names = module_names(4)
    cur = fleet(reference, modules=names, module_factor={names[-1]: 1 / 1.12}, seed=7, run_id="run-1")
    rep = analyse(cur, run_id="run-1", release="1.4.2", baseline=reference, baseline_id="baseline:1.4.1:v1",
                  expected_modules=names, expected_keys=sorted(set(reference["model_key"])))
    (path,) = write_report(rep, "html", out)
    return path


def laid_out(path: Path, shot: Path) -> list[dict]:
    with chromium_page() as (page, seen):
        page.goto(path.as_uri(), wait_until="load")
        figures = page.evaluate(LAYOUT)
        page.screenshot(path=str(shot), full_page=True)
    assert seen.errors == []
    return figures


@pytest.mark.parametrize("n", sorted(KEYS))
def test_every_figure_has_its_legend_whole_and_no_label_on_another(n, tmp_path):
    path = report_of(KEYS[n], tmp_path)
    figures = laid_out(path, tmp_path / f"report-{n}-keys.png")
    assert len(figures) == 3  # decode, TTFT, heatmap
    assert [len(f["legends"]) for f in figures[:2]] == [1, 1]
    legend = [t["text"] for t in figures[0]["texts"] if t["legend"]]
    assert legend[:2] == ["no prefix: fleet median", "shared prefix: fleet median"]
    assert "tolerance: baseline ±5 %" in legend and "baseline" in legend
    assert problems(figures) == [], f"screenshot: {tmp_path / f'report-{n}-keys.png'}"
    assert (tmp_path / f"report-{n}-keys.png").stat().st_size > 50_000


def test_a_legend_clipped_on_purpose_fails_the_check(tmp_path, monkeypatch):
    """The legend in two columns whatever the width, as it was before it was fitted (two keys: wider than the
    figure, as the getting-started report's was): the check names it."""
    monkeypatch.setattr(html_mod, "curve_plot", functools.partial(html_mod.curve_plot, legend_cols=2))
    figures = laid_out(report_of(KEYS[2], tmp_path), tmp_path / "clipped.png")
    found = problems(figures)
    assert [p.split(":")[0] for p in found if "legend" in p] == ["figure 0", "figure 1"], found


def test_labels_on_top_of_each_other_fail_the_check():
    square = [[0.0, 0.0], [10.0, 0.0], [10.0, 5.0], [0.0, 5.0]]
    moved = [[x + 8, y + 3] for x, y in square]
    apart = [[x + 11, y] for x, y in square]
    tilted = [[13.0, 4.0], [17.0, 8.0], [13.0, 12.0], [9.0, 8.0]]  # its upright box meets the square's, it does not
    assert overlap(square, moved) and not overlap(square, apart) and not overlap(square, tilted)
    fig = {"box": [0, 0, 100, 100], "legends": [[10, 10, 90, 20]],
           "texts": [{"text": "a", "corners": square, "legend": False}, {"text": "b", "corners": moved,
                                                                         "legend": False}]}
    assert problems([fig]) == ["figure 0: 'a' overlaps 'b'"]
    fig["legends"] = [[10, 10, 101, 20]]
    assert problems([fig])[0].startswith("figure 0: legend [10, 10, 101, 20] leaves the figure")
