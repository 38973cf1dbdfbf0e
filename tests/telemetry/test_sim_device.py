"""The simulated module's device tool (simulator/device/mthreads-gmi) and the knob that makes its card
throttle (fast tier: the real script, run as the agent runs it)."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from agent.telemetry import SAMPLES_FILE, Sampler, TelemetryConfig, read_samples, run_tool
from agent.telemetry.gmi_json import parse_json
from agent.telemetry.parse import parse_csv, parse_q
from agent.telemetry.plan import QueryPlan
from simulator import DEVICE_TOOL_DIR, ENV_DEVICE, ENV_DEVICE_DIR, ENV_DRIVER, SpecError, parse_device
from simulator.runtime.core import Knobs

TOOL = str(DEVICE_TOOL_DIR / "mthreads-gmi")
PLAN = QueryPlan.initial(TOOL)


def query(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(PLAN.argv(), capture_output=True, text=True, env={"PATH": os.environ["PATH"], **env},
                          timeout=10)


@pytest.fixture
def server(tmp_path: Path):
    """A stand-in for the simulated server: a live process whose phase the test sets."""
    proc = subprocess.Popen(["sleep", "60"])
    folder = tmp_path / "device"
    folder.mkdir()

    def phase(name: str) -> dict[str, str]:
        (folder / "phase").write_text(f"{name} {proc.pid}\n")
        return {ENV_DEVICE_DIR: str(folder)}

    yield phase
    proc.kill()
    proc.wait()


def reading(env: dict[str, str]):
    res = query(env)
    assert res.returncode == 0, res.stdout + res.stderr
    (r,) = parse_csv(res.stdout, PLAN.columns)
    return r


def test_values_follow_the_load(server) -> None:
    idle_no_server = reading({})
    assert idle_no_server.values["sm_clock_mhz"] == 600 and idle_no_server.values["memory_used_mib"] == 0
    assert idle_no_server.values["clock_event_reasons"] == 1 and idle_no_server.values["ecc_uncorrected"] == 0
    loaded = reading(server("idle"))
    assert loaded.values["memory_used_mib"] > 0 and loaded.values["utilization_pct"] == 0
    prefill, decode = reading(server("prefill")), reading(server("decode"))
    assert prefill.values["sm_clock_mhz"] == decode.values["sm_clock_mhz"] == 1800
    assert prefill.values["utilization_pct"] > decode.values["utilization_pct"] > 0
    assert prefill.values["power_w"] > decode.values["power_w"] > loaded.values["power_w"]
    assert decode.values["clock_event_reasons"] == 0 and decode.name == "MTT M1000 (simulated)"


def test_a_dead_server_leaves_an_idle_device(tmp_path: Path) -> None:
    (tmp_path / "phase").write_text("decode 2147483646\n")
    assert reading({ENV_DEVICE_DIR: str(tmp_path)}).values["utilization_pct"] == 0


def test_throttle_hot_lowclock(server) -> None:
    env = server("decode")
    t = reading({**env, ENV_DEVICE: "throttle:0.85"})
    assert t.values["sm_clock_mhz"] == 1530 and t.values["max_sm_clock_mhz"] == 1800
    assert t.values["temperature_c"] == 92 and t.values["clock_event_reasons"] == 0x48  # HW slowdown + thermal
    assert reading({**env, ENV_DEVICE: "throttle"}).values["sm_clock_mhz"] == 1476  # 0.82 by default
    hot = reading({**env, ENV_DEVICE: "hot"})
    assert hot.values["temperature_c"] == 92 and hot.values["sm_clock_mhz"] == 1800
    low = reading({**env, ENV_DEVICE: "lowclock:0.5"})
    assert low.values["max_sm_clock_mhz"] == 900 and low.values["sm_clock_mhz"] == 900
    assert low.values["clock_event_reasons"] == 0x2
    idle = reading({**server("idle"), ENV_DEVICE: "throttle"})
    assert idle.values["sm_clock_mhz"] == 600 and idle.values["clock_event_reasons"] == 1


def test_refusals_and_q(server) -> None:
    env = {**server("decode"), ENV_DEVICE: "noquery"}
    res = query(env)
    assert res.returncode == 2 and res.stdout.startswith('Field "clocks_event_reasons.active" is not a valid field')
    q = subprocess.run([TOOL, "-q"], capture_output=True, text=True, env={**env, ENV_DEVICE: "throttle"}, timeout=10)
    (r,) = parse_q(q.stdout)
    assert r.values["clock_event_reasons"] == 0x48 and r.values["sm_clock_mhz"] == 1476
    assert r.values["max_sm_clock_mhz"] == 1800 and r.values["memory_used_mib"] > 0
    fail = query({ENV_DEVICE: "fail"})
    assert fail.returncode == 9 and "GPU is lost" in fail.stderr


def test_a_hanging_card_is_cut_off(monkeypatch) -> None:
    monkeypatch.setenv(ENV_DEVICE, "hang")
    t0 = time.monotonic()
    assert run_tool(PLAN.argv(), 0.5, threading.Event()).outcome == "timeout"
    assert time.monotonic() - t0 < 3


def test_sampler_reads_the_reasons_from_q_when_the_query_lacks_them(tmp_path: Path, server, monkeypatch) -> None:
    for k, v in {**server("decode"), ENV_DEVICE: "noquery"}.items():
        monkeypatch.setenv(k, v)
    s = Sampler(TelemetryConfig(period_s=0.05, q_every=2, tool=TOOL), tmp_path / SAMPLES_FILE, run_id="r",
                module="m").start()
    end = time.monotonic() + 10
    while s.samples < 4 and time.monotonic() < end:
        time.sleep(0.02)
    s.stop()
    last = list(read_samples(tmp_path / SAMPLES_FILE))[-1]
    assert last.clock_event_reasons == 0 and last.sm_clock_mhz == 1800
    assert any("read from 'mthreads-gmi -q'" in n for n in s.notes)


def test_device_knob_slows_the_module_too() -> None:
    assert parse_device("throttle") == ("throttle", 0.82) and parse_device("lowclock:0.5") == ("lowclock", 0.5)
    assert parse_device("") == ("", None) and parse_device("hot") == ("hot", None)
    for bad in ("melting", "hot:0.5", "throttle:2", "throttle:x"):
        with pytest.raises(SpecError):
            parse_device(bad)
    k = Knobs().with_env({ENV_DEVICE: "throttle:0.89", "M1000_SIM_SPEED": "0.9"})
    assert k.speed.factor("qwen3", "decode") == pytest.approx(0.89 * 0.9)
    assert k.speed.factor("qwen3", "accept") == 1.0  # accept rates are not a matter of clocks
    assert Knobs().with_env({ENV_DEVICE: "hot"}).speed.factor("qwen3", "decode") == 1.0


def gmi(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([TOOL, *args], capture_output=True, text=True, env={"PATH": os.environ["PATH"], **env},
                          timeout=10)


@pytest.mark.parametrize("condition", ["", "throttle:0.85", "hot", "lowclock:0.5"])
@pytest.mark.parametrize("phase", ["idle", "prefill", "decode"])
def test_its_json_through_the_real_parser_says_what_its_csv_says(server, phase: str, condition: str) -> None:
    env = {**server(phase), ENV_DEVICE: condition}
    for flags in (("--query", "--json"), ("-q", "--json")):
        res = gmi(env, *flags)
        assert res.returncode == 0, res.stderr
        assert '"Power Draw ": "' in res.stdout  # the published spelling, trailing space and all
        got = parse_json(res.stdout)
        (j,) = got.readings
        c = reading(env)
        assert (j.gpu, j.name, j.uuid) == (c.gpu, c.name, c.uuid)
        assert dict(j.values) == dict(c.values) and not j.absent
        assert got.driver == "3.0.0-sim" and dict(got.firmware) == {0: "4.2.0-sim"}


def test_the_driver_knob() -> None:
    assert parse_json(gmi({ENV_DRIVER: "3.1.0-sim"}, "--query", "--json").stdout).driver == "3.1.0-sim"
    assert "Driver Version                          : 3.1.0-sim" in gmi({ENV_DRIVER: "3.1.0-sim"}, "-q").stdout
    bad = gmi({ENV_DRIVER: '3.1"; echo'}, "--query", "--json")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr == "M1000_SIM_DRIVER: only letters, digits, '.', '_', '+', '-'\n"


@pytest.mark.parametrize("condition", ["nojson", "noquery"])
def test_an_older_tool_refuses_json(condition: str) -> None:
    res = gmi({ENV_DEVICE: condition}, "--query", "--json")
    assert (res.returncode, res.stdout, res.stderr) == (2, "", "mthreads-gmi: unrecognized option '--json'\n")
    if condition == "nojson":
        assert reading({ENV_DEVICE: condition}).values["power_w"] == 18  # its CSV as before


def test_sampler_speaks_json_to_it(tmp_path: Path, server, monkeypatch) -> None:
    for k, v in {**server("decode"), ENV_DRIVER: "3.1.0-sim"}.items():
        monkeypatch.setenv(k, v)
    s = Sampler(TelemetryConfig(period_s=0.05, tool=TOOL), tmp_path / SAMPLES_FILE, run_id="r", module="m").start()
    end = time.monotonic() + 10
    while s.samples < 2 and time.monotonic() < end:
        time.sleep(0.02)
    s.stop()
    last = list(read_samples(tmp_path / SAMPLES_FILE))[-1]
    assert s.mode == "json" and s.notes == [] and s.driver == "3.1.0-sim"
    assert last.power_w == 52 and last.sm_clock_mhz == 1800 and last.clock_event_reasons == 0


@pytest.mark.parametrize(("condition", "phase", "watts"), [
    ("", "prefill", 68), ("", "decode", 52), ("", "idle", 21),
    ("hot", "prefill", 75), ("hot", "decode", 62), ("hot", "idle", 21),  # +10 W leakage, capped at the 75 W limit
    ("throttle", "prefill", 68), ("throttle", "decode", 55),  # 14 + 10 static, dynamic x 0.82
    ("lowclock", "prefill", 59), ("lowclock", "decode", 46),  # 14 static, dynamic x 0.85
])
def test_power_is_leakage_by_temperature_plus_dynamic_by_clock(server, condition, phase, watts) -> None:
    env = {**server(phase), **({ENV_DEVICE: condition} if condition else {})}
    assert reading(env).values["power_w"] == watts


def test_a_hotter_cards_leakage_is_a_test_knob(server) -> None:
    """``M1000_SIM_HOT_LEAK``: the hot card's extra watts under load (default 10), still capped at the limit."""
    hotter = {ENV_DEVICE: "hot", "M1000_SIM_HOT_LEAK": "20"}
    assert reading({**server("decode"), **hotter}).values["power_w"] == 72
    assert reading({**server("prefill"), **hotter}).values["power_w"] == 75
    assert reading({**server("idle"), **hotter}).values["power_w"] == 21
    res = query({**server("decode"), ENV_DEVICE: "hot", "M1000_SIM_HOT_LEAK": "2.5"})
    assert res.returncode == 2 and "M1000_SIM_HOT_LEAK: whole watts (digits only), not '2.5'" in res.stderr
