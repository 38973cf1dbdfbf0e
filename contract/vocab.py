"""The fleet's shared vocabulary: names both sides use with one meaning, besides the wire records.

The run id check and the error of input that cannot be used (:class:`BadInput`, the root of the agent's input
errors, caught by the controller too); the steps that leave a log; the figures the probe cross-checks and its
record of a disagreement; the device's clock-event reasons, their labels and which of them slow a busy device down;
the shape of a metric in a catalog and the rule for a safe label value. The agent and the controller import them
from here.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from contract.records import RUN_ID_RULE, Frozen, is_run_id


# --------------------------------------------------------------------------- input and run ids
class BadInput(ValueError):
    """Input that cannot be used (tarball, request, configuration): one clear line."""


def check_run_id(run_id: str) -> str:
    if not is_run_id(run_id):
        raise BadInput(f"run id {run_id!r}: use {RUN_ID_RULE}")
    return run_id


# --------------------------------------------------------------------------- step logs
# The steps that leave a log in a run's ``logs/`` folder (``NN-step[-key].log``), in pipeline order: the
# agent names its logs only so (``RunStore.next_log``), ``fleetctl logs --step`` takes only these.
LOG_STEPS: tuple[str, ...] = ("fetch", "unpack", "configure", "generate", "environment", "precompile", "server",
                              "benchmark")


# --------------------------------------------------------------------------- the probe's cross-check
COMPARED: tuple[str, ...] = ("ttft_ms", "tpot_ms", "prefill_tps", "decode_tps")


class Disagreement(Frozen):
    """One figure on which the release's benchmark and the probe disagree."""

    module: str = ""
    model_key: str = ""
    profile: str
    metric: str
    release: float
    probe: float
    change: float  # release / probe - 1
    # the band the difference was judged against, relative to the probe's figure
    noise: float | None = None
    # which of the two moved and by how much beyond the noise
    why: str = ""

    def one_line(self) -> str:
        band = "" if self.noise is None or self.why else f", beyond the noise band of +-{self.noise:.1%}"
        where = f"{self.model_key} {self.profile}".strip()
        line = f"{where} {self.metric}: release {self.release:.4g}, probe {self.probe:.4g} ({self.change:+.1%}{band})"
        return f"{line}: {self.why}" if self.why else line


class ProbeInterval(Frozen):
    """One figure of a per-key probe repeated ``repeats`` times (``probe_repeat``): its 95 % t interval."""

    module: str = ""
    model_key: str = ""
    profile: str
    figure: str  # e.g. ttft_p50_ms, tpot_p90_ms, output_tps
    low: float
    high: float
    repeats: int

    def one_line(self) -> str:
        return (f"{self.model_key} {self.profile} {self.figure}: {(self.low + self.high) / 2:.4g} "
                f"[{self.low:.4g}, {self.high:.4g}] over {self.repeats} rounds")


# --------------------------------------------------------------------------- the probe's SLO sweep
# A capacity row is a probe row whose profile is ``capacity:<swept profile>``: batch = the highest concurrency
# that met the SLO (None: none did), ttft_ms / tpot_ms its TTFT and TPOT p50, extra its figures (agent.probe.sweep).
CAPACITY_PREFIX = "capacity:"


class Capacity(Frozen):
    """The capacity at SLO one module's probe measured for one model key and profile."""

    module: str = ""
    model_key: str = ""
    profile: str
    slo: str  # e.g. ttft_p90_ms=4000,tpot_p90_ms=60
    # the highest concurrency that met it; None: concurrency 1 broke it
    concurrency: int | None = None
    output_tps: float | None = None
    request_rps: float | None = None
    ttft_p90_ms: float | None = None
    tpot_p90_ms: float | None = None
    # why the sweep stopped: slo, saturated, budget, max_load, stopped
    stop: str = ""
    levels: str = ""  # each level tried, e.g. 1:met,2:met,4:broken

    def one_line(self) -> str:
        if self.concurrency is None:
            return f"{self.model_key} {self.profile}: no load meets {self.slo} (stopped: {self.stop})"
        tps = f", {self.output_tps:.1f} output tok/s" if self.output_tps is not None else ""
        return f"{self.model_key} {self.profile}: concurrency {self.concurrency}{tps} at {self.slo} ({self.stop})"


# --------------------------------------------------------------------------- device clock-event reasons
# NVML clocks event reasons (nvmlClocksEventReason*): bit -> (name, what -q calls it)
REASONS: tuple[tuple[int, str, str], ...] = (
    (0x1, "gpu_idle", "Idle"),
    (0x2, "applications_clocks_setting", "Applications Clocks Setting"),
    (0x4, "sw_power_cap", "SW Power Cap"),
    (0x8, "hw_slowdown", "HW Slowdown"),
    (0x10, "sync_boost", "Sync Boost"),
    (0x20, "sw_thermal_slowdown", "SW Thermal Slowdown"),
    (0x40, "hw_thermal_slowdown", "HW Thermal Slowdown"),
    (0x80, "hw_power_brake_slowdown", "HW Power Brake Slowdown"),
    (0x100, "display_clock_setting", "Display Clock Setting"),
)
# reasons that slow a busy device down (idle, sync boost and display settings are not a slowdown)
SLOWDOWN_REASONS: frozenset[str] = frozenset({
    "sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown",
    "applications_clocks_setting"})
REASON_LABELS: dict[str, str] = {name: label for _, name, label in REASONS}


# --------------------------------------------------------------------------- metric catalogs
class MetricSpec(NamedTuple):
    # as exposed (histograms: the base name; counters: with _total)
    name: str
    type: str  # gauge | counter | histogram | info
    labels: tuple[str, ...]
    # seconds | bytes | ratio | tokens_per_second | frames_per_second | celsius | timestamp_seconds | count | joules |
    # watts | tokens_per_joule
    unit: str
    # | joules | watts | tokens_per_joule
    help: str


_SAFE = re.compile(r"^[A-Za-z0-9_.:+-]{1,64}$")


def label_value(text: str | None, fallback: str = "unknown") -> str:
    """A bounded, safe label value: the text if it is a short plain token, else ``fallback``."""
    return text if text and _SAFE.match(text) else fallback
