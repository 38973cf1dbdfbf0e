"""Grafana's provisioning files, expanded the way Grafana expands them (Go's os.ExpandEnv), give the
documented datasource URL, with and without M1000_PROMETHEUS_URL set; no file holds a ${...} form
that Grafana would read as an empty variable (shell defaults such as ${VAR:-default})."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.metrics.dashboards import ROOT

GO = shutil.which("go")
pytestmark = pytest.mark.skipif(GO is None, reason="needs go (Debian package golang-go)")

# docs/metrics.md: the datasource URL, where deploy/compose.yaml's Prometheus listens
DOCUMENTED_URL = "http://127.0.0.1:9090"


@pytest.fixture(scope="module")
def expandenv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("expandenv")
    env = {**os.environ, "GOCACHE": str(out / "cache")}
    subprocess.run([GO or "go", "build", "-o", str(out / "expandenv"), "main.go"],
                   cwd=ROOT / "tests" / "metrics" / "expandenv", env=env, check=True, timeout=120)
    return out / "expandenv"


def grafana_reads() -> list[Path]:
    """The provisioning files Grafana reads: everything under what compose.yaml mounts at /etc/grafana/provisioning."""
    compose = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text(encoding="utf-8"))
    mounts = dict(v.rsplit(":", 2)[:2][::-1] for v in compose["services"]["grafana"]["volumes"] if v.startswith("."))
    folder = (ROOT / "deploy" / mounts["/etc/grafana/provisioning"]).resolve()
    assert folder == ROOT / "grafana" / "provisioning"
    return sorted(p for p in folder.rglob("*") if p.is_file())


def expand(tool: Path, path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("M1000_")}
    return subprocess.run([str(tool), str(path)], env={**base, **env}, capture_output=True, text=True, timeout=30)


def test_grafana_reads_the_datasource_and_dashboard_provider_files() -> None:
    names = [p.relative_to(ROOT).as_posix() for p in grafana_reads()]
    assert names == ["grafana/provisioning/dashboards/m1000.yml", "grafana/provisioning/datasources/prometheus.yml"]


@pytest.mark.parametrize("env", [{}, {"M1000_PROMETHEUS_URL": "http://prometheus.lab:9090"}], ids=["unset", "set"])
def test_the_datasource_url_is_the_documented_one_as_grafana_expands_it(expandenv: Path, env: dict[str, str]) -> None:
    res = expand(expandenv, ROOT / "grafana" / "provisioning" / "datasources" / "prometheus.yml", **env)
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""
    sources = yaml.safe_load(res.stdout)["datasources"]
    assert [(s["uid"], s["url"]) for s in sources] == [("m1000-prometheus", DOCUMENTED_URL)]


def test_no_provisioning_file_holds_a_form_grafana_does_not_expand(expandenv: Path) -> None:
    for path in grafana_reads():
        res = expand(expandenv, path)
        assert (res.returncode, res.stderr) == (0, ""), path
        assert isinstance(yaml.safe_load(res.stdout), dict), path


def test_a_shell_default_expands_to_nothing_and_is_reported(expandenv: Path, tmp_path: Path) -> None:
    bad = tmp_path / "ds.yml"
    bad.write_text("datasources:\n  - url: ${M1000_PROMETHEUS_URL:-http://127.0.0.1:9090}\n", encoding="utf-8")
    res = expand(expandenv, bad)
    assert res.returncode == 1
    assert yaml.safe_load(res.stdout) == {"datasources": [{"url": None}]}
    assert res.stderr == (f"expandenv: {bad}: ${{M1000_PROMETHEUS_URL:-http://127.0.0.1:9090}} is not a variable "
                          "Grafana expands (it reads as empty)\n")
    res = expand(expandenv, bad, M1000_PROMETHEUS_URL="http://prometheus.lab:9090")
    assert yaml.safe_load(res.stdout) == {"datasources": [{"url": None}]}
