"""Screenshots for the docs of what a person looks at, taken in headless Chromium (Debian's chromium).

    .venv/bin/python docs/tools/screenshots.py            # writes docs/img/report.png, docs/img/live-view.png
    .venv/bin/python docs/tools/screenshots.py --out DIR  # elsewhere (the slow test writes to a tmp dir)

- ``report.png``: the HTML report of a demo-like run (``make demo``'s four modules and seven model
  keys against the simulator's reference tables as the baseline; the last module 12 % slower, as
  ``fleetctl demo --slow 1.12``), the whole page at a 1300 x 900 window.
- ``live-view.png``: the live view of ``fleetctl validate`` in an 80-column terminal: the table that
  ``controller.cli.live.render`` makes for a run in progress (one module done, one benchmarking,
  one precompiling, one failed key), printed by rich at width 80 and exported as HTML (rich's
  ``export_svg`` would ask a CDN for its font; labs are offline), screenshot of the terminal's box.
  Only the run's records are made here: whatever columns the view has, the picture shows them.

Grafana's dashboards are not pictured: there is no Grafana in Debian and no dashboard-to-PNG path here.
The slow test ``tests/report/test_screenshots.py`` runs this script, so it cannot rot.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]
WIDTH, HEIGHT = 1300, 900  # the window
COLUMNS = 80
NOW = 1_780_000_000.0  # a fixed clock: the same picture every time


def demo_like_report_html(out: Path) -> Path:
    """The HTML report of a run like ``make demo``'s, written under ``out``."""
    from controller.cli.demo import module_names, reference_rows
    from controller.report import analyse
    from controller.report.render import write_report
    from controller.report.synth import fleet, rows_frame

    reference = rows_frame(reference_rows())
    names = module_names(4)
    cur = fleet(reference, modules=names, module_factor={names[-1]: 1 / 1.12}, seed=7, run_id="20261202-0930-demo")
    rep = analyse(cur, run_id="20261202-0930-demo", release="1.4.2", baseline=reference,
                  baseline_id="baseline:1.4.1:v1", expected_modules=names,
                  expected_keys=sorted(set(reference["model_key"])))
    (path,) = write_report(rep, "html", out)
    return path


def live_view_html() -> str:
    """The live view of a run in progress, as an 80-column terminal shows it (rich's HTML export)."""
    from rich.console import Console

    from contract.records import KeyOutcome, RunProgress, RunState, StepError
    from controller.cli.live import render
    from controller.fleet import RunView

    run, release = "20261202-0930-demo", "1.4.2"
    keys = 7
    progress = {
        "sim-01": RunProgress(run_id=run, module="sim-01", release=release, state=RunState.DONE, step="done",
                              keys_total=keys, keys_done=keys, progress=1.0, started_at=NOW - 512,
                              finished_at=NOW - 20, rows=92,
                              outcomes=tuple(KeyOutcome(model_key=f"k{i}", status="passed") for i in range(keys))),
        "sim-02": RunProgress(run_id=run, module="sim-02", release=release, state=RunState.BENCHMARKING,
                              step="benchmark", model_key="qwen35_mtp", keys_total=keys, keys_done=4, progress=0.62,
                              started_at=NOW - 498),
        "sim-03": RunProgress(run_id=run, module="sim-03", release=release, state=RunState.PRECOMPILING,
                              step="precompile", keys_total=keys, progress=0.18, started_at=NOW - 131),
        "sim-04": RunProgress(run_id=run, module="sim-04", release=release, state=RunState.DONE, step="done",
                              keys_total=keys, keys_done=keys, progress=1.0, started_at=NOW - 530,
                              finished_at=NOW - 5, rows=79,
                              outcomes=(KeyOutcome(model_key="qwen3vl", status="failed", error=StepError(
                                  step="server", model_key="qwen3vl", exit_code=1,
                                  message="/health not ready within 600 s")),)),
    }
    view = RunView(run_id=run, modules=tuple(progress), progress=progress)
    console = Console(record=True, width=COLUMNS, file=io.StringIO(), force_terminal=True, color_system="truecolor")
    console.print(render(view, now=NOW))
    return console.export_html(inline_styles=True)


def terminal_page(exported: str) -> str:
    """rich's export in a dark terminal box exactly ``COLUMNS`` characters wide."""
    box = (f"pre{{display:inline-block;width:{COLUMNS}ch;margin:0;padding:14px 16px;background:#0d1117;"
           "color:#e6edf3;font-size:15px;line-height:1.17;border-radius:6px;white-space:pre;overflow:hidden}"
           "body{margin:0;padding:0;background:#ffffff}")
    return exported.replace("</style>", box + "</style>", 1)


def take(out: Path, chromium: str = CHROMIUM) -> dict[str, tuple[int, int]]:
    """Write ``report.png`` and ``live-view.png`` under ``out``: {name: (width, height) in px}."""
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    sizes: dict[str, tuple[int, int]] = {}
    with tempfile.TemporaryDirectory() as tmp, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT}, device_scale_factor=1)
            external: list[str] = []
            page.on("request", lambda r: external.append(r.url) if not r.url.startswith(("file:", "data:")) else None)
            page.goto(demo_like_report_html(Path(tmp)).as_uri(), wait_until="load")
            page.screenshot(path=str(out / "report.png"), full_page=True)
            live = Path(tmp) / "live-view.html"
            live.write_text(terminal_page(live_view_html()), encoding="utf-8")
            page.goto(live.as_uri(), wait_until="load")
            page.locator("pre").screenshot(path=str(out / "live-view.png"))
            if external:
                raise SystemExit(f"screenshots: the pages asked for something outside: {external}")
        finally:
            browser.close()
    from PIL import Image  # matplotlib's dependency

    for name in ("report.png", "live-view.png"):
        with Image.open(out / name) as im:
            sizes[name] = im.size
    return sizes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "img", help="folder of the PNGs (docs/img)")
    ap.add_argument("--chromium", default=CHROMIUM, help="the Chromium to drive (Debian's)")
    args = ap.parse_args(argv)
    if not Path(args.chromium).exists():
        print(f"screenshots: no Chromium at {args.chromium} (Debian package chromium)", file=sys.stderr)
        return 2
    print(json.dumps(take(args.out, args.chromium)))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
