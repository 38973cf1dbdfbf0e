"""The decision records (docs/adr/) stay true: each says its date and status in its header; a record that names
another as superseding, replacing or amending it is named back by that one; every link points at a file that
exists; no record cites a README section (the README is a front door whose sections move: cite a docs page); the
index lists every record."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ADR = Path(__file__).resolve().parents[2] / "docs" / "adr"
RECORDS = sorted(ADR.glob("[0-9][0-9][0-9][0-9]-*.md"))
HEADER = re.compile(r"^Date: (\d{4}-\d{2}-\d{2}) · Status: (accepted|proposed|superseded|rejected|deprecated)\b")
# "superseded by [ADR 0031](...)", "Amended by [0025](...)", "replaced by [ADR 0039](...)"
LATER = re.compile(r"(?:superseded|amended|replaced)(?: in part)? by \[(?:ADR )?(\d{4})\]", re.I)
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
README_CITATION = re.compile(r"\(README[,)]|README,? [\"A-Z]")


def _header(path: Path) -> str:
    """The lines after the title up to the first blank line: the record's date, status and issue."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out = []
    for line in lines[2:]:
        if not line.strip():
            break
        out.append(line)
    return " ".join(out)


def test_records_are_found() -> None:
    assert len(RECORDS) >= 50


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.name[:4])
def test_a_record_says_its_date_and_status(path: Path) -> None:
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0].startswith("# "), f"{path.name}: line 1 is not a title"
    assert HEADER.match(_header(path)), (
        f"{path.name}: line 3 must read 'Date: YYYY-MM-DD · Status: accepted|proposed|superseded|...'; it reads "
        f"{_header(path)[:80]!r}")


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.name[:4])
def test_a_later_record_names_the_one_it_changes(path: Path) -> None:
    number = path.name[:4]
    for later in LATER.findall(_header(path)):
        found = list(ADR.glob(f"{later}-*.md"))
        assert found, f"{path.name}: names ADR {later} as changing it; there is no such record"
        assert re.search(rf"\b{number}\b", found[0].read_text(encoding="utf-8")), (
            f"{found[0].name} changes {path.name} (so {path.name} says) but does not name it")
        assert int(later) > int(number), f"{path.name}: names an earlier record ({later}) as changing it"


@pytest.mark.parametrize("path", [*RECORDS, ADR / "README.md"], ids=lambda p: p.name[:4])
def test_links_point_at_files_that_exist(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    missing = [t for t in LINK.findall(text) if "://" not in t and not (path.parent / t).exists()]
    assert not missing, f"{path.name}: links to files that do not exist: {missing}"


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.name[:4])
def test_no_record_cites_a_readme_section(path: Path) -> None:
    hits = [line.strip()[:100] for line in path.read_text(encoding="utf-8").splitlines()
            if README_CITATION.search(line)]
    assert not hits, f"{path.name}: cites a README section (cite a docs page): {hits}"


def test_the_index_lists_every_record() -> None:
    index = (ADR / "README.md").read_text(encoding="utf-8")
    missing = [p.name for p in RECORDS if f"({p.name})" not in index]
    assert not missing, f"docs/adr/README.md does not list: {missing}"


def test_the_checks_see_what_they_check(tmp_path: Path) -> None:
    """The patterns find what they are for: a record without a status, a README citation, a dead link."""
    assert not HEADER.match("Date: 2026-12-06 (issue 49)")
    assert HEADER.match("Date: 2026-12-06 · Status: superseded by [ADR 0031](0031-x.md)")
    assert README_CITATION.search("needs it below 2,000 modules (README, Scale).")
    assert README_CITATION.search('(`bench/report.py`, README "Reports, Measured")')
    assert not README_CITATION.search("(`tests/fixtures/h200/README.md`, `bench/energy_h200.py`")
    assert LATER.findall("accepted; superseded in part by [ADR 0031](0031-postgresql-history.md)") == ["0031"]
    assert LINK.findall("see [x](../howto/x.md#a) and [y](https://e.org/)") == ["../howto/x.md", "https://e.org/"]
