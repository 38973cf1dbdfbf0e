"""docs/tools/screenshots.py, run as the docs run it (into a tmp dir): the HTML report of a demo-like run
and the live view at 80 columns, each a PNG of the expected size that is not blank."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from tests.browser import CHROMIUM

pytestmark = [pytest.mark.slow, pytest.mark.browser]
ROOT = Path(__file__).resolve().parents[2]


def busy_share(path: Path) -> tuple[float, int]:
    """(share of pixels not of the most common colour, distinct colours) of a PNG."""
    with Image.open(path) as im:
        rgb = im.convert("RGB")
        colours = rgb.getcolors(maxcolors=rgb.width * rgb.height)
    assert colours is not None
    return 1 - max(n for n, _ in colours) / (rgb.width * rgb.height), len(colours)


def test_screenshots_of_the_report_and_the_live_view(tmp_path):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"needs Debian's chromium at {CHROMIUM}")
    res = subprocess.run([sys.executable, str(ROOT / "docs" / "tools" / "screenshots.py"), "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=240, cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    sizes = {name: tuple(wh) for name, wh in json.loads(res.stdout).items()}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["live-view.png", "report.png"]
    for name, (w, h) in sizes.items():
        with Image.open(tmp_path / name) as im:
            assert im.format == "PNG" and im.size == (w, h), name
    w, h = sizes["report.png"]
    assert w == 1300 and 1800 <= h <= 4000  # the whole page at a 1300 px window
    w, h = sizes["live-view.png"]
    assert 80 * 7 + 32 <= w <= 80 * 11 + 32  # 80 monospace columns and the box's padding
    assert 120 <= h <= 600  # a title, a header and four modules
    share, colours = busy_share(tmp_path / "report.png")
    assert share > 0.05 and colours > 200, (share, colours)
    share, colours = busy_share(tmp_path / "live-view.png")
    assert share > 0.05 and colours > 20, (share, colours)
