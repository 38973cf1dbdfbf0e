"""Typed, frozen records of a report: thresholds, regressions, outliers, changes, telemetry, verdict.

Records only: how a report reads (text, JSON, HTML) is :mod:`controller.report.render`'s job,
how it is computed :mod:`controller.report.analysis`'s. This module imports nothing from
``controller.report`` (tests/report/test_model_boundary.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from contract.records import ENERGY_METRICS, METRICS, STARTUP_METRICS, WINDOW_METRICS
from contract.vocab import Capacity, Disagreement, ProbeInterval
from controller.errors import FleetctlError

Verdict = Literal["pass", "regressed", "incomplete", "failed"]
Status = Literal["regressed", "improved", "within tolerance", "not significant", "no reference"]

# Metrics computed from another metric of the same row by the benchmark itself; a change of
# one shows up in its partner, so a regression of both is reported once, under the primary.
DERIVED: dict[str, str] = {"tpot_ms": "decode_tps", "ttft_ms": "prefill_tps", "accept_rate_len": "accept_rate",
                           "tokens_per_j": "j_per_token"}
PRIMARY_METRICS: tuple[str, ...] = tuple(m for m in METRICS if m not in DERIVED)
ALL_METRICS: tuple[str, ...] = tuple(METRICS)
# the primary metrics that make a module a (speed) outlier; energy makes an energy outlier of its own, a module's
# start-up costs none (one start a key: judged fleet-wide over the modules' starts)
SPEED_PRIMARY: tuple[str, ...] = tuple(m for m in PRIMARY_METRICS if m not in WINDOW_METRICS)
ENERGY_PRIMARY: tuple[str, ...] = tuple(m for m in PRIMARY_METRICS if m in ENERGY_METRICS)
FLEET = "*"  # module / profile of a fleet-level or key-level finding
# default of Thresholds.startup_tolerance (docs/adr/0029-start-up-costs-judged.md)
STARTUP_TOLERANCE = 0.15


def profile_key(profile: str) -> tuple[tuple[int, int | str], ...]:
    """A profile's place in numeric order: ``128:128`` before ``1000:1000``, ``gsm8k:9`` before ``gsm8k:10``
    (numbers as numbers, text as text)."""
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", str(profile)) if p)


class ReportError(FleetctlError, RuntimeError):
    """A report that cannot be built (unknown run, no rows, bad option)."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Thresholds(_Frozen):
    """What counts as a regression or an outlier. Fractions are relative (0.05 = 5 %)."""

    tolerance: float = Field(default=0.05, gt=0, lt=1)  # default for every metric
    per_metric: dict[str, float] = Field(default_factory=dict)  # e.g. {"accept_rate": 0.03}
    # key level (Wilcoxon over profiles) and per module
    alpha: float = Field(default=0.01, gt=0, lt=1)
    # one profile: sign test across modules
    alpha_profile: float = Field(default=0.05, gt=0, lt=1)
    # fewer modules: a single profile must move three times the tolerance
    min_modules_for_test: int = Field(default=5, ge=2)
    # typical deviation from the fleet median
    outlier_tolerance: float = Field(default=0.05, gt=0, lt=1)
    # sign test over the module's cells
    outlier_alpha: float = Field(default=0.001, gt=0, lt=1)
    # floor of the robust scale (log units): near-identical modules
    z_floor: float = Field(default=0.01, gt=0)
    worst_cases: int = Field(default=3, ge=1)
    # release figure vs the agent's probe
    probe_tolerance: float = Field(default=0.05, gt=0, lt=1)
    # the energy metrics' (J/token, tokens/J): a release as fast that burns 10 % more is a regression
    energy_tolerance: float = Field(default=0.05, gt=0, lt=1)
    # the start-up costs' (server ready, first request, precompile): noisier than throughput, a load from disk and
    # a compile (docs/adr/0029-start-up-costs-judged.md)
    startup_tolerance: float = Field(default=STARTUP_TOLERANCE, gt=0, lt=1)
    # a start-up cost that moved less than this (seconds) is within tolerance: two figures read at the agent's
    # 50 ms ready-poll resolution differ by up to 0.1 s with nothing changed (ADR 0040)
    startup_floor_s: float = Field(default=0.1, ge=0)

    def tol(self, metric: str) -> float:
        if metric in ENERGY_METRICS:
            return self.per_metric.get(metric, self.energy_tolerance)
        if metric in STARTUP_METRICS:
            return self.per_metric.get(metric, self.startup_tolerance)
        return self.per_metric.get(metric, self.tolerance)


class Regression(_Frozen):
    """One thing that got worse. ``module`` and ``profile`` are ``'*'`` for fleet / all-profile findings."""

    module: str
    model_key: str
    profile: str
    metric: str
    baseline: float | None
    value: float | None
    # value / baseline - 1 (fraction; for ``correct`` None)
    change: float | None
    # "baseline", "previous" or "baseline+previous" (or the other run's id in compare)
    against: str
    p_value: float | None = None
    # units behind the test (profiles, modules or cells)
    n: int = 0
    modules: tuple[str, ...] = ()
    # derived metrics that moved with it, e.g. "tpot_ms +8.7%"
    related: tuple[str, ...] = ()
    detail: str = ""
    # 95 % interval of ``change`` (docs/adr/0018-intervals-of-findings.md): fleet-wide key findings, the
    # Hodges-Lehmann centre's signed-rank interval over profiles (ADR 0016); one profile fleet-wide, the fleet
    # median's order-statistic interval over modules; one module against its previous run, the median's over
    # profiles. None where there is none (fewer than 6 modules or profiles; ``correct``)
    ci_low: float | None = None
    ci_high: float | None = None


class WorstCase(_Frozen):
    model_key: str
    profile: str
    metric: str
    value: float
    fleet_median: float
    z: float


class Outlier(_Frozen):
    """A module (or one model key on a module) out of line with the rest of the fleet."""

    module: str
    model_key: str  # "*" when the whole module is out of line
    # typical performance relative to the fleet median (0.88 = 12 % slower)
    factor: float
    cells: int
    # share of its cells with |robust z| > 3 in the same direction
    share_out: float
    p_value: float
    worst: tuple[WorstCase, ...] = ()
    # 95 % interval of ``factor``: the median's order-statistic interval over the same figures' deviations
    # (docs/adr/0018-intervals-of-findings.md); None below 6 figures
    ci_low: float | None = None
    ci_high: float | None = None
    # "" a speed outlier (every speed figure); "j_per_token": an energy outlier (factor: the fleet's J/token over
    # the module's, 0.8 = it spends 25 % more energy per token)
    metric: str = ""


class Change(_Frozen):
    """A key-level comparison, whatever its outcome (nothing below tolerance is hidden)."""

    model_key: str
    metric: str
    against: str
    baseline: float | None
    value: float | None
    change: float | None
    p_value: float | None
    n: int
    status: Status
    ci_low: float | None = None  # 95 % interval of change (see Regression)
    ci_high: float | None = None


class Comparison(_Frozen):
    """One figure of an outlier module against the fleet (medians over the compared model keys)."""

    # sm_clock, max_sm_clock, temperature, power_limit, power, memory_used, reason:<name>, ...
    what: str
    value: float
    fleet: float | None
    unit: str
    keys: int
    unusual: bool
    text: str


class EnvDifference(_Frozen):
    """A module whose environment fingerprint differs from the one most modules of the run share."""

    module: str
    digest: str
    # e.g. "driver 3.1.0-sim (fleet 3.0.0-sim)"
    differences: tuple[str, ...]
    # modules with a fingerprint, and of those, in the fleet's environment
    fleet_modules: int
    majority_modules: int


class JitCompiled(_Frozen):
    """A model key whose benchmark compiled TileLang kernels while it measured (rows' ``jit_kernels``): its figures
    include compile time. ``kernels``: summed over its modules (each module's largest count of the run)."""

    model_key: str
    kernels: int
    modules: tuple[str, ...]
    # kernel libraries, as the rows name them
    names: tuple[str, ...] = ()


TelemetryStatus = Literal["explained", "nothing unusual", "no telemetry"]


class OutlierTelemetry(_Frozen):
    """An outlier's device telemetry next to the fleet's (built by :mod:`controller.report.telemetry`)."""

    module: str
    model_key: str  # as the outlier: "*" for the whole module
    status: TelemetryStatus
    # what is out of line, in words, strongest first
    findings: tuple[str, ...] = ()
    compared: tuple[Comparison, ...] = ()
    # why there is no telemetry, or what was compared
    note: str = ""


class TrendSeries(_Frozen):
    """One series of the report's "History" section: its values in release order and its change points
    (``marks``: the index of each one's first release, with its size, whether it is in force, whether it is
    at the run's release; ``ends``: where a drift reached its new level)."""

    model_key: str
    profile: str
    metric: str
    scope: str  # "fleet" or a module
    releases: tuple[str, ...]
    values: tuple[float, ...]
    marks: tuple[int, ...]
    sizes: tuple[float, ...]
    in_force: tuple[bool, ...]
    at_release: tuple[bool, ...]
    # each one's first release at the new level (a drift's; a step's: its mark)
    ends: tuple[int, ...] = ()


class HistorySection(_Frozen):
    """The report's "History" section (:func:`controller.report.trend.history_section`): the run's model keys'
    series with a change point in force or at the run's release; none under ``needed`` releases."""

    releases: int
    # fewest releases at which a change point can be named (default settings)
    needed: int
    series: tuple[TrendSeries, ...]
    # series that qualified but were not drawn
    more: int = 0


@dataclass(frozen=True, eq=False)
class Report:
    """Everything ``fleetctl report`` shows. Built by :func:`controller.report.analyse`."""

    run_id: str
    release: str
    baseline_id: str | None
    previous_ids: tuple[str, ...]
    verdict: Verdict
    regressions: tuple[Regression, ...]
    outliers: tuple[Outlier, ...]
    changes: tuple[Change, ...]
    notes: tuple[str, ...]
    modules: tuple[str, ...]
    thresholds: Thresholds
    # per (model_key, profile, metric): fleet median, spread, count...
    summary: pd.DataFrame = field(repr=False)
    rows: pd.DataFrame = field(repr=False)
    # baseline figures per (model_key, profile)
    reference: pd.DataFrame | None = field(repr=False)
    # module x model_key: median deviation from the fleet (fraction)
    deviation: pd.DataFrame = field(repr=False)
    # per outlier: its device telemetry next to the fleet's (controller.report.telemetry); empty without telemetry
    outlier_telemetry: tuple[OutlierTelemetry, ...] = ()
    # figures where the release's benchmark and the agent's probe disagree (probe rows never enter the verdict)
    disagreements: tuple[Disagreement, ...] = ()
    # release rows that have a probe row beside them
    probe_checked: int = 0
    # the capacity at SLO each module's probe measured (SLO sweep rows: agent.probe.sweep)
    capacities: tuple[Capacity, ...] = ()
    # the 95 % intervals of the per-key probes repeated over rounds (probe_repeat)
    probe_intervals: tuple[ProbeInterval, ...] = ()
    # change points across the release history of the run's model keys (None: not looked at)
    history: HistorySection | None = None
    # modules whose environment differs from the fleet's majority, and the warnings of environments that changed
    # since what the run is compared with (controller.report.environment)
    environment: tuple[EnvDifference, ...] = ()
    environment_changes: tuple[str, ...] = ()
    # model keys whose benchmark compiled kernels while it measured (controller.report.jit)
    jit_compiled: tuple[JitCompiled, ...] = ()
    # modules (or model keys of a module) whose energy per token is out of line with the fleet's
    energy_outliers: tuple[Outlier, ...] = ()
    # (module, why) for each module of the run refused at dispatch (reserved by another user, offline, bad): the run
    # is judged on the modules that ran (controller.fleet.refused_parts)
    refused: tuple[tuple[str, str], ...] = ()
    # the modules whose part failed, each with the logs kept of it (kernel log, agent journal, serial console)
    failed_parts: tuple[FailedPart, ...] = ()

    def telemetry_of(self, o: Outlier) -> OutlierTelemetry | None:
        """The outlier's device telemetry (None: none was attached)."""
        return next((t for t in self.outlier_telemetry if (t.module, t.model_key) == (o.module, o.model_key)), None)


# -- paired A/B on the same modules (controller.report.analysis.paired) ---------------------------------------
Arm = Literal["A", "B"]


class FailedPart(_Frozen):
    """A module whose part of the run was lost, failed a key or was started again, with the logs the controller kept
    of it (controller.fleet.kernel_logs): named beside the failure in the report."""

    module: str
    # "lost", "a key failed", "its agent started again mid-run"
    why: str
    # "kernel log and agent journal kept", "serial console kept", "kernel log not kept (...)"
    logs: tuple[str, ...]
    # the command that shows them ("" when nothing was kept)
    command: str = ""

    def line(self) -> str:
        """``sim-01 (lost): kernel log and agent journal kept; serial console kept: fleetctl logs r1 --module
        sim-01 --kernel``"""
        return f"{self.module} ({self.why}): {'; '.join(self.logs)}" + (f": {self.command}" if self.command else "")


class PairedRun(_Frozen):
    """One validation run of a paired comparison: which release (``arm``) and which round of A B B A it was."""

    run_id: str
    arm: Arm
    round: int = Field(ge=0)


class PairedChange(_Frozen):
    """One model key and metric, B against A on the same modules: the change, its 95 % interval, its test, and
    the smallest change this comparison would have named (``mdc``, from the measured paired noise)."""

    model_key: str
    metric: str
    # B / A - 1, the Hodges-Lehmann centre over profiles of the paired differences
    change: float
    # 95 % interval of change (the signed-rank test's; None below 6 profiles)
    ci_low: float | None
    ci_high: float | None
    # one-sided Wilcoxon signed-rank test across profiles
    p_value: float
    # 0 for a start-up or energy figure: one per (module, round), not per profile
    profiles: int
    # (module, round) pairs behind the figures
    pairs: int
    # the spread of one pair's difference (relative standard deviation)
    noise: float
    # minimum detectable change (magnitude; None: too few profiles for the test at alpha)
    mdc: float | None
    status: Status
    # the metric's tolerance it was judged with (start-up 15 %, energy 5 %, else 1 %)
    tolerance: float | None = None


class PairedReport(_Frozen):
    """The verdict of ``fleetctl ab A B``: every key-level change, the regressions among them."""

    release_a: str
    release_b: str
    rounds: int
    modules: tuple[str, ...]
    tolerance: float
    changes: tuple[PairedChange, ...]
    regressions: tuple[PairedChange, ...]
    verdict: Verdict
    notes: tuple[str, ...] = ()
