"""Prometheus config and alert rules pass promtool; the rule unit tests pass."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.metrics.dashboards import ROOT

PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="needs promtool (Debian package prometheus)")
DIR = ROOT / "deploy" / "prometheus"


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL
    return subprocess.run([PROMTOOL, *args], cwd=DIR, capture_output=True, text=True, timeout=60)


def test_check_rules() -> None:
    res = promtool("check", "rules", "rules/m1000.rules.yml")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS: 9 rules found" in res.stdout


def test_rule_unit_tests() -> None:
    res = subprocess.run([PROMTOOL or "", "test", "rules", "m1000.rules.test.yml"], cwd=DIR / "rules",
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr


def test_check_config() -> None:
    res = promtool("check", "config", "prometheus.yml")
    assert res.returncode == 0, res.stdout + res.stderr


def test_a_broken_rule_is_caught(tmp_path) -> None:
    bad = tmp_path / "bad.yml"
    bad.write_text("groups:\n  - name: x\n    rules:\n      - alert: X\n        expr: m1000_run_state{ == 1\n")
    res = promtool("check", "rules", str(bad))
    assert res.returncode != 0
