"""Typed, frozen records of a report: thresholds, regressions, outliers, changes, verdict."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from contract.records import METRICS
from contract.vocab import Disagreement

if TYPE_CHECKING:
    from controller.report.telemetry import OutlierTelemetry

Verdict = Literal["pass", "regressed", "incomplete", "failed"]
Status = Literal["regressed", "improved", "within tolerance", "not significant", "no reference"]

# Metrics computed from another metric of the same row by the benchmark itself; a change of
# one shows up in its partner, so a regression of both is reported once, under the primary.
DERIVED: dict[str, str] = {"tpot_ms": "decode_tps", "ttft_ms": "prefill_tps", "accept_rate_len": "accept_rate"}
PRIMARY_METRICS: tuple[str, ...] = tuple(m for m in METRICS if m not in DERIVED)
ALL_METRICS: tuple[str, ...] = tuple(METRICS)
FLEET = "*"  # module / profile of a fleet-level or key-level finding


class ReportError(RuntimeError):
    """A report that cannot be built (unknown run, no rows, bad option)."""


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Thresholds(_Frozen):
    """What counts as a regression or an outlier. Fractions are relative (0.05 = 5 %)."""

    tolerance: float = Field(default=0.05, gt=0, lt=1)  # default for every metric
    per_metric: dict[str, float] = Field(default_factory=dict)  # e.g. {"accept_rate": 0.03}
    alpha: float = Field(default=0.01, gt=0, lt=1)  # key level (Wilcoxon over profiles) and per module
    alpha_profile: float = Field(default=0.05, gt=0, lt=1)  # one profile: sign test across modules
    min_modules_for_test: int = Field(default=5, ge=2)  # fewer: a single profile must move 3x the tolerance
    outlier_tolerance: float = Field(default=0.05, gt=0, lt=1)  # typical deviation from the fleet median
    outlier_alpha: float = Field(default=0.001, gt=0, lt=1)  # sign test over the module's cells
    z_floor: float = Field(default=0.01, gt=0)  # floor of the robust scale (log units): near-identical modules
    worst_cases: int = Field(default=3, ge=1)
    probe_tolerance: float = Field(default=0.05, gt=0, lt=1)  # release figure vs the agent's probe

    def tol(self, metric: str) -> float:
        return self.per_metric.get(metric, self.tolerance)


class Regression(_Frozen):
    """One thing that got worse. ``module`` and ``profile`` are ``'*'`` for fleet / all-profile findings."""

    module: str
    model_key: str
    profile: str
    metric: str
    baseline: float | None
    value: float | None
    change: float | None  # value / baseline - 1 (fraction; for ``correct`` None)
    against: str  # "baseline", "previous" or "baseline+previous" (or the other run's id in compare)
    p_value: float | None = None
    n: int = 0  # units behind the test (profiles, modules or cells)
    modules: tuple[str, ...] = ()  # modules that show it
    related: tuple[str, ...] = ()  # derived metrics that moved with it, e.g. "tpot_ms +8.7%"
    detail: str = ""

    def one_line(self) -> str:
        where = self.model_key if self.profile == FLEET else f"{self.model_key} {self.profile}"
        who = "fleet" if self.module == FLEET else self.module
        if self.metric == "correct":
            return f"{who}: {where}: answer now wrong (was right in {self.against})"
        ch = f"{self.change:+.1%}" if self.change is not None else "?"
        rel = f" ({', '.join(self.related)})" if self.related else ""
        return f"{who}: {where} {self.metric} {ch} vs {self.against}{rel}"


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
    factor: float  # typical performance relative to the fleet median (0.88 = 12 % slower)
    cells: int
    share_out: float  # share of its cells with |robust z| > 3 in the same direction
    p_value: float
    worst: tuple[WorstCase, ...] = ()

    def one_line(self) -> str:
        what = self.module if self.model_key == FLEET else f"{self.module} [{self.model_key}]"
        return f"{what}: typically {self.factor:.2f}x the fleet median ({self.cells} figures)"


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
    summary: pd.DataFrame = field(repr=False)  # per (model_key, profile, metric): fleet median, spread, count...
    rows: pd.DataFrame = field(repr=False)  # every row of the run, as stored
    reference: pd.DataFrame | None = field(repr=False)  # baseline figures per (model_key, profile)
    deviation: pd.DataFrame = field(repr=False)  # module x model_key: median deviation from the fleet (fraction)
    # per outlier: its device telemetry next to the fleet's (controller.report.telemetry); empty without telemetry
    outlier_telemetry: tuple[OutlierTelemetry, ...] = ()

    def telemetry_of(self, o: Outlier) -> OutlierTelemetry | None:
        return next((t for t in self.outlier_telemetry if (t.module, t.model_key) == (o.module, o.model_key)), None)
    # figures where the release's benchmark and the agent's probe disagree (probe rows never enter the verdict)
    disagreements: tuple[Disagreement, ...] = ()
    probe_checked: int = 0  # release rows that have a probe row beside them

    @property
    def verdict_line(self) -> str:
        from controller.report.render import verdict_line

        return verdict_line(self)

    def to_dict(self) -> dict[str, Any]:
        from controller.report.render import to_dict

        return to_dict(self)

    def to_json(self, indent: int | None = 2) -> str:
        from controller.report.render import to_json

        return to_json(self, indent)

    def to_markdown(self) -> str:
        from controller.report.render import to_markdown

        return to_markdown(self)

    def to_html(self) -> str:
        from controller.report.html import to_html

        return to_html(self)
