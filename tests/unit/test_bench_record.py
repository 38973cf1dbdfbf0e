"""``bench/record.py``: every bench script's output kept in ``bench/results/`` with a header that says where the
figures come from (time, commit, command, machine, load), unless ``BENCH_RECORD=0``; the script's exit status kept.

The recorder runs in this process with a temporary results folder (``results=``), as a bench script's
``record.main(main, __file__)`` runs it."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import pytest

from bench import record

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "bench" / "dispatch.py")


@pytest.fixture(autouse=True)
def _recording(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BENCH_RECORD", raising=False)
    monkeypatch.delenv("BENCH_LABEL", raising=False)
    monkeypatch.setattr(sys, "argv", [SCRIPT, "--jobs", "3"])


def _one_file(folder: Path) -> Path:
    files = list(folder.iterdir())
    assert len(files) == 1, files
    return files[0]


def test_output_is_kept_between_a_header_and_a_footer_and_a_missed_goal_still_exits_1(tmp_path, capsys):
    def bench() -> int:
        print("ratio 1.42")
        print("goal 1.3: missed", file=sys.stderr)
        return 1

    assert record.main(bench, SCRIPT, results=tmp_path) == 1
    path = _one_file(tmp_path)
    assert re.fullmatch(r"dispatch_\d{8}_\d{4}\.txt", path.name)
    lines = path.read_text().splitlines()
    assert lines[0] == "# bench/dispatch.py: raw output, kept by bench/record.py"
    assert re.fullmatch(r"# started   \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", lines[1])
    assert lines[3] == f"# command   {shlex.join(sys.orig_argv)}"
    assert lines[6] == ""
    assert re.fullmatch(r"# commit    [0-9a-f]{7,} \((clean|dirty: .+ differ from it)\)", lines[2])
    assert re.fullmatch(r"# machine   .+, \d+ CPUs \(\d+ usable\), \d+\.\d GiB memory, Python 3\.\d+\.\d+", lines[4])
    assert re.fullmatch(r"# load avg  \d+\.\d\d \d+\.\d\d \d+\.\d\d \(1, 5, 15 min\) at start", lines[5])
    assert lines[7:9] == ["ratio 1.42", "goal 1.3: missed"]
    assert re.fullmatch(r"# ended     \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC after \d+ s; exit 1", lines[10])
    assert re.fullmatch(r"# load avg  \d+\.\d\d \d+\.\d\d \d+\.\d\d \(1, 5, 15 min\) at end", lines[11])
    seen = capsys.readouterr()
    assert seen.out == "ratio 1.42\n"
    assert seen.err == f"goal 1.3: missed\nraw output: {path}\n"


def test_header_names_time_commit_command_machine_and_load():
    m = record.Machine(started=datetime(2026, 12, 2, 3, 40, 5, tzinfo=timezone.utc), commit="7a6cfdd",
                       dirty=("agent/a.py", "b", "c", "d", "e", "f", "g"),
                       command=".venv/bin/python bench/scale.py --sizes 1,100", cpu_model="AMD EPYC", cpus=2,
                       usable_cpus=2, mem_gib=23.5, python="3.11.7", load=(6.69, 4.8, 3.561))
    assert record.header(m, "bench/scale.py") == (
        "# bench/scale.py: raw output, kept by bench/record.py\n"
        "# started   2026-12-02 03:40:05 UTC\n"
        "# commit    7a6cfdd (dirty: agent/a.py, b, c, d, e and 2 more differ from it)\n"
        "# command   .venv/bin/python bench/scale.py --sizes 1,100\n"
        "# machine   AMD EPYC, 2 CPUs (2 usable), 23.5 GiB memory, Python 3.11.7\n"
        "# load avg  6.69 4.80 3.56 (1, 5, 15 min) at start\n\n")


def test_a_label_ends_the_name_and_a_second_run_in_the_same_minute_gets_a_file_of_its_own(tmp_path):
    at = datetime(2026, 12, 2, 3, 40, 59, tzinfo=timezone.utc)
    first = record.result_path(tmp_path, "bench/api_hostile.py", at, "before")
    assert first.name == "api_hostile_20261202_0340_before.txt"
    first.write_text("")
    assert record.result_path(tmp_path, "bench/api_hostile.py", at, "before").name == \
        "api_hostile_20261202_0340_before_2.txt"
    assert record.result_path(tmp_path, "bench/api_hostile.py", at).name == "api_hostile_20261202_0340.txt"


def test_bench_label_names_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv("BENCH_LABEL", "after")
    assert record.main(lambda: None, SCRIPT, results=tmp_path) == 0
    assert re.fullmatch(r"dispatch_\d{8}_\d{4}_after\.txt", _one_file(tmp_path).name)


def test_bench_record_0_keeps_nothing_and_keeps_the_status(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BENCH_RECORD", "0")

    def bench() -> int:
        print("ratio 0.9")
        return 1

    assert record.main(bench, SCRIPT, results=tmp_path) == 1
    assert list(tmp_path.iterdir()) == []
    assert capsys.readouterr().out == "ratio 0.9\n"


def test_help_is_not_a_run_and_keeps_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", [SCRIPT, "--help"])
    assert record.main(lambda: 0, SCRIPT, results=tmp_path) == 0
    assert list(tmp_path.iterdir()) == []


def test_children_of_a_recorded_bench_do_not_record_and_the_environment_is_restored(tmp_path) -> None:
    seen: list[str] = []

    def bench() -> None:
        out = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('BENCH_RECORD'))"],
                             capture_output=True, text=True, check=True)
        seen.append(out.stdout.strip())

    assert record.main(bench, SCRIPT, results=tmp_path) == 0
    assert seen == ["0"]
    assert "BENCH_RECORD" not in os.environ
    assert len(list(tmp_path.iterdir())) == 1


def test_a_message_given_to_system_exit_is_kept_with_status_1(tmp_path, capsys):
    def bench() -> None:
        raise SystemExit("run on 16 modules ended failed")

    assert record.main(bench, SCRIPT, results=tmp_path) == 1
    text = _one_file(tmp_path).read_text()
    assert "\nrun on 16 modules ended failed\n" in text
    assert "; exit 1\n" in text
    assert capsys.readouterr().err.startswith("run on 16 modules ended failed\n")


def test_a_crash_is_kept_with_its_traceback_and_status_1(tmp_path):
    def bench() -> None:
        raise ZeroDivisionError("no rows")

    assert record.main(bench, SCRIPT, results=tmp_path) == 1
    text = _one_file(tmp_path).read_text()
    assert "Traceback (most recent call last):" in text
    assert "ZeroDivisionError: no rows\n" in text


def test_a_bad_label_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BENCH_LABEL", "../x")
    assert record.main(lambda: 0, SCRIPT, results=tmp_path) == 2
    assert list(tmp_path.iterdir()) == []
    assert capsys.readouterr().err == ("BENCH_LABEL='../x': letters, digits and '-' only (it ends the file name)\n")
