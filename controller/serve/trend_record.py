"""The wire model of one change-point finding, as ``GET /api/v1/trend`` and ``fleetctl trend -o json`` give it."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class TrendRecord(BaseModel):
    """One finding of ``fleetctl trend -o json``: its lead change point and what moved with it."""

    model_config = ConfigDict(extra="forbid")

    release: str = Field(description="the first release of the new level")
    model_key: str
    profile: str
    metric: str
    scope: str = Field(description="'fleet' (the fleet median of each run) or a module")
    size: str = Field(description="relative change of the level, as text (e.g. -8.1%)")
    ci: str = Field(description="its 95 % interval, as text")
    p: str = Field(description="p-value of the test (the split's t-test times the splits of its stretch), as text")
    in_force: str = Field(description="yes: the series still ends at the new level")
    drift: str = Field("", description="a drift: its slope per release, the slope's 95 % interval and the first "
                                       "release at the new level, as text ('' for a step)")
    size_value: float = Field(description="relative change of the level (-0.081: 8.1 % lower)")
    ci_low: float
    ci_high: float
    p_value: float
    index: int = Field(description="position of the release in the series (release order)")
    kind: str = Field("step", description="'step' (the level moved at one release) or 'drift' (it moved steadily "
                                          "over several: from 'release' to 'until')")
    until: str = Field("", description="the first release at the new level (a step: 'release')")
    end: int = Field(-1, description="position of 'until' in the series")
    slope_value: float | None = Field(None, description="a drift: relative change per release (0.005: +0.5 %)")
    slope_low: float | None = None
    slope_high: float | None = None
    moved_with: list[str] = Field(description="the other series of the finding: 'profile metric size'")
    moved: str = Field(description="the other series of the finding, counted per metric")
    values: list[float] = Field(description="the lead series, one value per release in release order")
    modules_moved: list[str] = Field(default_factory=list, description="a fleet finding: the modules whose own "
                                     "series moved at that release too (not findings of their own)")
