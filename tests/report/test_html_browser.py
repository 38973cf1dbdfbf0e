"""The HTML report in headless Chromium (Debian's /usr/bin/chromium): no console errors, no
failed or external requests, a screenshot saved."""

from __future__ import annotations

import os
import re
import shutil
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
    assert shot.stat().st_size > 20_000
    if os.environ.get("M1000_SAVE_REPORT_PNG"):  # refresh the README picture: docs/img/report.png
        shutil.copy(shot, Path(__file__).resolve().parents[2] / "docs" / "img" / "report.png")
