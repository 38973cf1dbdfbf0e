"""``bench/demo_power.py``, the verdict's error rates through the real path: how it sorts a report's findings and
states each rate (pure), and (slow) that a small run of it goes through the real path and reports every figure."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

from bench import demo_power
from bench.demo_power import classify, plan, summary, wilson

ROOT = Path(__file__).resolve().parents[2]


def _reg(module: str, key: str, profile: str, metric: str, change: float) -> NS:
    return NS(module=module, model_key=key, profile=profile, metric=metric, change=change)


def _report(regressions: list[NS], outliers: Sequence[NS] = (), energy: Sequence[NS] = (), change: float = -0.06,
            ci: tuple[float, float] = (-0.065, -0.055)) -> NS:
    return NS(regressions=regressions, outliers=list(outliers), energy_outliers=list(energy),
              changes=[NS(model_key="qwen3", metric="decode_tps", change=change, ci_low=ci[0], ci_high=ci[1])])


def test_the_planted_change_is_not_a_false_alarm_and_everything_else_is_sorted_by_kind() -> None:
    rep = _report([_reg("*", "qwen3", "*", "decode_tps", -0.06), _reg("*", "qwen3", "*", "tpot_ms", 0.064),
                   _reg("*", "qwen3", "*", "j_per_token", 0.06),  # slower decode, same power: true
                   _reg("*", "qwen35", "*", "prefill_tps", -0.07), _reg("*", "qwen3", "*", "warmup_s", 0.5)],
                  outliers=[NS(module="sim-02", model_key="*", metric="", factor=0.9)],
                  energy=[NS(module="sim-03", model_key="*", metric="j_per_token", factor=1.1)])
    o = classify(rep, 0.06, "qwen3", 7, "regressed")
    assert o.detected and o.covered
    assert o.false_speed == ("* qwen35 * prefill_tps -7.0%",)
    assert o.outliers == ("outlier sim-02 [*] speed 0.900x",)
    assert o.energy == ("outlier sim-03 [*] j_per_token 1.100x",)
    assert o.startup == ("regression * qwen3 * warmup_s +50.0%",) and o.any_outlier
    none = classify(_report([_reg("*", "qwen3", "*", "j_per_token", 0.06)], change=0.001, ci=(0.002, 0.004)),
                    0.0, "qwen3", 1, "regressed")
    assert not none.detected and none.energy and none.covered is False and not none.any_outlier


def test_the_summary_states_each_rate_with_its_wilson_interval_and_the_goals() -> None:
    lo, hi = wilson(0, 200)
    assert lo == 0.0 and hi == pytest.approx(0.01884, abs=2e-5)  # the Wilson upper bound of 0 in 200
    clean = [classify(_report([], change=0.0005, ci=(-0.003, 0.004)), 0.0, "qwen3", i, "pass") for i in range(20)]
    hit = [classify(_report([_reg("*", "qwen3", "*", "decode_tps", -0.06)]), 0.06, "qwen3", i, "regressed")
           for i in range(20)]
    lines, ok = summary(clean + hit)
    assert ok and len(lines) == 4
    assert "| 0% | 20 | - | 0/20 = 0.0% [0.0%, 16.1%] |" in lines[2] and "+0.05 pp" in lines[2]
    assert lines[3].startswith("| 6% | 20 | 20/20 = 100.0% [83.9%, 100.0%] |") and lines[3].endswith(
        "| 20/20 = 100.0% [83.9%, 100.0%] |")
    missed = classify(_report([], change=-0.045, ci=(-0.05, -0.04)), 0.06, "qwen3", 99, "pass")
    assert not summary([*clean, *hit, missed])[1]  # one planted 6 % not named: the goal is missed


def test_runs_are_interleaved_across_sizes_with_seeds_of_their_own() -> None:
    runs = plan(3, 2, [0.06, 0.08])
    assert runs == [(0.0, 0), (0.06, 100_000), (0.08, 200_000), (0.0, 1), (0.06, 100_001), (0.08, 200_001), (0.0, 2)]


@pytest.mark.slow
def test_a_small_bench_goes_through_the_real_path_and_reports_every_figure(tmp_path: Path) -> None:
    env = {**os.environ, "BENCH_RECORD": "0", "TMPDIR": str(tmp_path)}
    res = subprocess.run([sys.executable, str(ROOT / "bench" / "demo_power.py"), "--none", "2", "--planted", "1",
                          "--sizes", "0.06", "--fleets", "1"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=280)
    out = res.stdout + res.stderr
    assert res.returncode in (0, 1), out
    assert len([line for line in out.splitlines() if " run size " in line]) == 3, out
    header = next(line for line in out.splitlines() if line.startswith("| planted decode regression"))
    for figure in ("detected", "false regression", "any outlier", "energy", "start-up", "bias", "95 % interval"):
        assert figure in header
    assert any(line.startswith("| 0% | 2 | - |") for line in out.splitlines()), out
    six = next(line for line in out.splitlines() if line.startswith("| 6% | 1 |"))
    assert " pp " in six and "/1 = " in six  # a bias and a coverage of one run
    assert "goals (" in out and not list(tmp_path.glob("bench-demo-power-*"))  # its folder removed
    assert demo_power.GOAL_COVERAGE == 0.93
