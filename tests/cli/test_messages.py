"""What fleetctl says when a newcomer gets something wrong (issue 27): one line naming what and where,
the fix when there is one, exit 2; what it prints when it did something a newcomer might not find."""

from __future__ import annotations

import pytest

from tests.support.cli import one_line, run_main


# --regress and --slow: one line, not the simulator's traceback; the reports' metric names work
@pytest.mark.parametrize(("args", "says"), [
    (["--regress", "qwen3:decode_tps:0.5x"], "regression 'qwen3:decode_tps:0.5x': fraction '0.5x' is not a number"),
    (["--regress", "qwen3:latency:0.08"],
     "regression 'qwen3:latency:0.08': unknown metric 'latency' (known: prefill, decode, accept, vision, all, or as "
     "the reports name them: prefill_tps, ttft_ms, decode_tps, tpot_ms, accept_rate, accept_rate_len, vision_fps)"),
    (["--regress", "qwen3:decode"], "regression 'qwen3:decode': expected MODEL_KEY:METRIC:FRACTION, e.g. "
                                    "qwen3:decode_tps:0.08"),
    (["--slow", "0.5"], "--slow 0.5: expected a factor above 1 (1.12: one module 12 % slower)"),
    (["--throttle"], "--throttle says why the slow module is slow: give --slow F too"),
])
def test_a_bad_demo_knob_is_one_line_before_anything_is_built(env, capsys, args, says):
    code, _, err = run_main(capsys, "demo", "--out", str(env / "demo"), *args)
    assert code == 2 and one_line(err) == f"fleetctl: error: {says}"
    assert not (env / "demo").exists()


@pytest.mark.parametrize(("regress", "speed"), [
    (("qwen3:decode_tps:0.08",), "qwen3:decode=0.92"),  # the name the reports print
    (("qwen3:decode:0.08",), "qwen3:decode=0.92"),
    (("all:tpot_ms:0.08", "qwen3vl:vision_fps:0.1"), "decode=0.925926,qwen3vl:vision=0.9"),  # TPOT 8 % longer
    ((), "1.0"),
])
def test_demo_regress_takes_the_reports_metric_names(regress, speed):
    from controller.cli.demo import DemoOptions, release_speed

    assert release_speed(DemoOptions(regress=regress, slow=1.12, throttle=True)) == speed


def test_demo_devices_is_the_hidden_old_name_of_modules(env, capsys):
    """docs/cli.md: "Old spellings kept hidden: ... demo --devices N" (-d/--devices is a selector elsewhere)."""
    code, out, _ = run_main(capsys, "demo", "--help")
    assert code == 0 and "--modules" in out and "--devices" not in out
    code, _, err = run_main(capsys, "demo", "--devices", "2", "--slow", "0.5", "--out", str(env / "demo"))
    assert code == 2 and "--slow 0.5" in one_line(err)  # still parsed, then the knob refused
