"""A docs page's shown outputs against what its commands print (tests/support/guide_output.py): what varies between
runs is normalised away, anything else that differs is a mismatch (the getting-started test fails on it), and a
mismatch is written back into the page in place (``make guide-outputs``)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tests.support.guide import Command, parse_guide, runnable
from tests.support.guide_output import mismatch, normalise, regenerated, rewrite, spans

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "getting-started.md"

SAMPLE = """\
Text.

```console
$ fleetctl version
fleetctl 0.1.0 (records schema 1, Python 3.11.7)
$ fleetctl report latest
# Fleet report 20261202-032302-f991
...
| qwen3 | decode_tps | baseline | 22.87 | 22.88 | +0.0% | 0.023 | within tolerance |
...
$ true
```
"""


def test_each_command_carries_the_output_the_page_shows_and_where():
    version, report, true = runnable(parse_guide(SAMPLE))
    assert version.shown == ("fleetctl 0.1.0 (records schema 1, Python 3.11.7)",)
    assert report.shown == ("# Fleet report 20261202-032302-f991", "...",
                            "| qwen3 | decode_tps | baseline | 22.87 | 22.88 | +0.0% | 0.023 | within tolerance |",
                            "...")
    assert true.shown == ()
    lines = SAMPLE.split("\n")
    assert lines[version.shown_at] == version.shown[0] and lines[report.shown_at] == report.shown[0]


@pytest.mark.parametrize(("page", "printed"), [
    ("run 20261202-032302-f991: release 1.4.2 (715778f93d51)",
     "run 20261206-212846-5c51: release 1.4.2 (2d340af72a67)"),
    ("│ sim-01 │ idle  │ 1 s ago   │ -0 s       │ 75.4 GiB  │",
     "│ sim-01 │ idle  │ 12 s ago   │ 0 s        │ 169.6 GiB  │"),
    ("| qwen3 | prefill_tps | 76.3 | 75.96 | -0.4% | 0.00049 |",
     "| qwen3 | prefill_tps | 76.3 | 75.85 | -0.6% | 3.8e-06 |"),
    ("fleetctl 0.1.0 (records schema 1, Python 3.11.7)", "fleetctl 0.1.0 (records schema 1, Python 3.11.12)"),
    ("┏━━━━━━━━┳━━━━━━━━━━━┓", "┏━━━━━━━━┳━━━━━━━━━━━━━┓"),
    ("qwen3   models/Qwen3-30B-A3B-GPTQ-Int4", "qwen3\tmodels/Qwen3-30B-A3B-GPTQ-Int4"),
])
def test_what_varies_between_runs_is_normalised_away(page, printed):
    assert normalise(page) == normalise(printed)


@pytest.mark.parametrize(("page", "printed"), [
    ("fleetctl 0.1.0 (records schema 1)", "fleetctl 0.2.0 (records schema 1)"),  # a version is not a figure
    ("baseline 1.4.1@v1 (baseline:1.4.1:v1): 92 rows, 7 model keys", "baseline 1.4.1@v1 (baseline:1.4.1:v1): 91 rows, "
     "7 model keys"),
    ("│ sim-01 │ idle │", "│ sim-01 │ busy │"),
    ("wrote reports/report.html", "wrote /home/lab/m1000-lab/reports/report.html"),
])
def test_anything_else_that_differs_is_not(page, printed):
    assert normalise(page) != normalise(printed)


def test_dots_stand_for_any_lines_and_the_rest_must_match_in_order():
    shown = ["head", "...", "middle 1.5", "...", "tail"]
    assert spans(shown, ["head", "a", "b", "middle 2.5", "c", "tail"]) == [(0, 1), (3, 4), (5, 6)]
    assert spans(shown, ["head", "middle 2.5", "tail"]) == [(0, 1), (1, 2), (2, 3)]
    assert spans(shown, ["head", "a", "tail"]) is None  # no middle
    assert spans(shown, ["head", "middle 2.5", "tail", "more"]) is None  # the page ends on "tail", not on "..."
    assert spans(["a", "b"], ["a", "b", "c"]) is None and spans(["a", "b", ""], ["a", "b"]) is not None
    assert spans([], ["something"]) is None and spans([], []) == [(0, 0)]


def page_devices_block() -> Command:
    (cmd,) = [c for c in runnable(parse_guide(PAGE.read_text(encoding="utf-8"))) if c.text.endswith(" devices")]
    assert "..." not in cmd.shown and len(cmd.shown) >= 5
    return cmd


def test_the_getting_started_check_fails_when_the_page_shows_another_output_than_the_command_prints():
    """The page's own `devices` block: it matches what it shows (other times, disk sizes), and a page without the
    `reserved` column (as the page was, issue 51) or with another state no longer does."""
    cmd = page_devices_block()
    printed = "\n".join(line.replace("1 s ago", "13 s ago").replace(" GiB", "1 GiB") for line in cmd.shown)
    assert mismatch(cmd, printed, "/tmp/abcd") is None
    without = tuple(line.replace(" reserved ┃", "").replace("━━━━━━━━━━╇", "").replace("━━━━━━━━━━┳", "")
                    .replace("──────────┴", "").replace("│          │        │", "│        │") for line in cmd.shown)
    assert without != cmd.shown
    found = mismatch(dataclasses.replace(cmd, shown=without), printed, "/tmp/abcd")
    assert found is not None and "reserved" in found.describe()
    assert mismatch(cmd, printed.replace(" idle ", " busy "), "/tmp/abcd") is not None


def test_the_test_home_is_written_as_the_pages():
    cmd = runnable(parse_guide("```console\n$ ls\n/home/lab/m1000-lab/x\n```\n"))[0]
    assert mismatch(cmd, "/tmp/q7zr/m1000-lab/x", "/tmp/q7zr") is None
    assert mismatch(cmd, "/tmp/q7zr/m1000-lab/y", "/tmp/q7zr") is not None


def test_regenerated_blocks_keep_the_pages_shortening():
    printed = ["head 2", "a", "b", "middle 2.5", "c", "d", "tail 7"]
    assert regenerated(["head 1", "...", "middle 1.5", "...", "tail 7"], printed) == [
        "head 2", "...", "middle 2.5", "...", "tail 7"]
    assert regenerated(["old"], printed) == printed  # not shortened: all of it
    assert regenerated(["head", "...", "gone", "...", "tail 7"], printed) is None  # edit by hand


def test_rewrite_replaces_each_commands_output_in_place():
    version, report, _ = runnable(parse_guide(SAMPLE))
    new = rewrite(SAMPLE, [(version, ["fleetctl 0.2.0 (records schema 1, Python 3.11.7)", "extra"]),
                           (report, ["# Fleet report x", "..."])])
    assert new == SAMPLE.replace("fleetctl 0.1.0 (records schema 1, Python 3.11.7)",
                                 "fleetctl 0.2.0 (records schema 1, Python 3.11.7)\nextra").replace(
        "# Fleet report 20261202-032302-f991\n...\n| qwen3 | decode_tps | baseline | 22.87 | 22.88 | +0.0% | 0.023 | "
        "within tolerance |\n...\n", "# Fleet report x\n...\n")
    assert [c.shown for c in runnable(parse_guide(new))][0][1] == "extra"
