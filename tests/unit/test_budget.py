"""The fast tier's budget (tests/support/budget.py) run for real: a pytest of its own over hand-made tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

TESTS = '''
import time

import pytest


def test_cheap():
    pass


def test_burns_cpu():
    end = time.process_time() + 0.6
    while time.process_time() < end:
        pass


def test_sleeps():
    time.sleep(1.2)


@pytest.mark.slow
def test_slow_burns_cpu():
    end = time.process_time() + 0.6
    while time.process_time() < end:
        pass
'''


def _pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_hand_made.py").write_text(TESTS)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.support.budget", "-q", "-p", "no:cacheprovider",
                           "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"), str(tmp_path), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.slow  # a pytest of its own, 4 s of tests
def test_a_fast_test_over_its_cpu_or_wall_budget_fails_the_run_naming_it(tmp_path: Path) -> None:
    r = _pytest(tmp_path, "--budget", "0.2", "--durations", "3", "--durations-out", str(tmp_path / "d.json"))
    assert r.returncode == 1, r.stdout
    over = r.stdout.split("fast-test budget", 1)[1].split("\n=", 1)[0].splitlines()
    named = [line.split("::", 1)[1].split(":", 1)[0] for line in over if "::" in line]
    assert named == ["test_burns_cpu", "test_sleeps"], r.stdout  # costliest CPU first; the slow one not judged
    assert "over the budget of 0.2 s CPU (1 s wall): make it cheaper or mark it slow" in r.stdout
    assert "4 passed" in r.stdout  # every test passed: the budget is what failed the run
    top = r.stdout.split("most CPU", 1)[1]
    assert top.index("test_burns_cpu") < top.index("test_cheap") and "test_slow_burns_cpu" in top
    took = json.loads((tmp_path / "d.json").read_text())
    assert list(took) == ["test_hand_made.py"]  # one group: the file
    assert 2.4 <= took["test_hand_made.py"] < 30  # two tests of 0.6 s CPU and one of 1.2 s asleep


@pytest.mark.slow  # two pytests of their own
def test_within_the_budget_or_with_it_off_the_run_passes(tmp_path: Path) -> None:
    for args in (("--budget", "5"), ("--budget", "0")):
        r = _pytest(tmp_path, *args)
        assert r.returncode == 0 and "fast-test budget" not in r.stdout and "most CPU" not in r.stdout, r.stdout
    # a durations file that cannot be written is one line; the tests' outcome stands
    r = _pytest(tmp_path, "--budget", "5", "--durations-out", "/proc/nowhere/d.json")
    assert r.returncode == 0 and "Traceback" not in r.stdout + r.stderr, r.stdout + r.stderr
    assert "--durations-out /proc/nowhere/d.json: not written: No such file or directory" in r.stdout
