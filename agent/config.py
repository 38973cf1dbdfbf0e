"""How this module runs a validation: :class:`AgentConfig`, frozen, built from the agent's settings."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.fields import FieldInfo

from agent.kernel_cache import KernelCacheConfig
from agent.settings import AgentSettings
from agent.telemetry import TelemetryConfig

# What were [agent] settings until issue 50 (ADR 0058): the defaults of the fields below, set on an AgentConfig
# by the tests and benches that need another value.
STOP_GRACE = 15.0  # SIGTERM to SIGKILL of a release process group, s
# unpacked releases (and their kernel caches) kept under <workdir>/releases, this run's included
KEEP_RELEASES = 3
UNPACK_MAX_MEMBERS = 100_000  # a release has a few thousand
UNPACK_MAX_NAME_BYTES = 1024  # a member's path or link target, bytes
PROBE_REQUESTS = 5
# the least relative difference of release and probe that can flag a row
PROBE_TOLERANCE = 0.02
PROBE_SWEEP_BUDGET = 300.0  # wall seconds of one key's SLO sweep


def _setting(name: str) -> Any:
    """The field of :class:`AgentSettings` ``name``, for the field of the same name here: one default, one bound,
    one description."""
    field: FieldInfo = copy.copy(AgentSettings.model_fields[name])
    return field


def _profiles(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip())


# the fields of AgentConfig that are the agent's settings, as they are
MIRRORED = ("server_port", "probe", "probe_sweep_slo")


class AgentConfig(BaseModel):
    """How this module runs a validation (frozen; pass it, never read globals). The fields that are [agent]
    settings take their default, bounds and meaning from :class:`AgentSettings` (:data:`MIRRORED`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    module: str
    workdir: Path
    server_host: str = "127.0.0.1"
    server_port: int = _setting("server_port")
    fetch_timeout: float = Field(default=1800.0, gt=0, description="sha256 of the tarball, s")
    unpack_timeout: float = Field(default=1800.0, gt=0)
    keep_releases: int = Field(default=KEEP_RELEASES, ge=1, description="unpacked releases kept, the newest used "
                               "(this one too)")
    unpack_max_members: int = Field(default=UNPACK_MAX_MEMBERS, ge=1, description="members of a tarball, at most")
    unpack_max_name_bytes: int = Field(default=UNPACK_MAX_NAME_BYTES, ge=1, le=4096,
                                       description="a member's path, at most, bytes")
    generate_timeout: float = Field(default=1800.0, gt=0)
    environment_timeout: float = Field(default=600.0, gt=0)
    precompile_timeout: float = Field(default=7200.0, gt=0)
    ready_timeout: float = Field(default=1200.0, gt=0, description="server start until /health answers 200, s")
    benchmark_timeout: float = Field(default=3600.0, gt=0, description="per model key, s")
    stop_grace: float = Field(default=STOP_GRACE, gt=0, description="SIGTERM to SIGKILL of a process group, s")
    port_free_timeout: float = Field(default=30.0, gt=0, description="wait for the port to be free again, s")
    poll_interval: float = Field(default=0.5, gt=0, description="cancel / readiness polling period, s")
    warmup_request: bool = Field(default=True, description="time one short request once a key's server is ready "
                                 "(its first-request time, a judged start-up cost)")
    key_env: dict[str, dict[str, str]] = Field(default_factory=dict, description="extra env per model key")
    base_env: dict[str, str] | None = Field(default=None, description="scripts' base env (default: the agent's)")
    telemetry: TelemetryConfig = Field(default_factory=TelemetryConfig, description="device sampling during runs")
    probe: bool = _setting("probe")
    probe_profiles: tuple[str, ...] = Field(
        default=_profiles(AgentSettings.model_fields["probe_profiles"].default),
        description="sweep profiles the probe runs (the probe_profiles setting, split)")
    probe_requests: int = Field(default=PROBE_REQUESTS, ge=1, description="measured probe requests per profile "
                                "(their median; the spread of all but the first is the cross-check's noise)")
    probe_warmup: int = Field(default=0, ge=0, description="probe warm-up requests (the benchmark warmed the server)")
    probe_tolerance: float = Field(default=PROBE_TOLERANCE, gt=0, lt=1, description="release vs probe, relative: "
                                   "the least band (the measured noise widens it)")
    probe_repeat: int = Field(default=1, ge=1, le=20, description="rounds of the per-key probe (a key's "
                              "PROBE_REPEAT variable overrides it)")
    probe_timeout: float = Field(default=600.0, gt=0, description="one probe request, wall s")
    probe_sweep_slo: str = _setting("probe_sweep_slo")
    probe_sweep_budget: float = Field(default=PROBE_SWEEP_BUDGET, gt=0, description="one key's SLO sweep, wall s")
    kernel_cache: KernelCacheConfig | None = Field(default=None, description="the fleet's shared kernel cache "
                                                   "(None: off)")

    @classmethod
    def from_settings(cls, settings: AgentSettings, **overrides: Any) -> AgentConfig:
        """From :class:`agent.settings.AgentSettings`, plus overrides (those not None)."""
        values: dict[str, Any] = {
            "module": settings.module,
            "workdir": Path(settings.workdir).expanduser().resolve(),
            **{name: getattr(settings, name) for name in MIRRORED},
            "probe_profiles": _profiles(settings.probe_profiles),
            "telemetry": TelemetryConfig(enabled=settings.telemetry_period > 0,
                                         period_s=settings.telemetry_period or 1.0),
            "kernel_cache": KernelCacheConfig(root=settings.kernel_cache_root(),
                                              trust_first=settings.kernel_cache == "trust-first",
                                              device_class=settings.device_class) if settings.kernel_cache else None,
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


# a key's variable (MODEL_KEYS env, configured or requested key_env)
PROBE_REPEAT_VAR = "PROBE_REPEAT"


def key_probe_repeat(kenv: dict[str, str], default: int) -> tuple[int, str | None]:
    """The rounds of a key's probe: its ``PROBE_REPEAT`` variable, else ``default``; with why a bad value was
    set aside (the key still runs, with ``default``)."""
    raw = kenv.get(PROBE_REPEAT_VAR)
    if raw is None or not raw.strip():
        return default, None
    if not raw.strip().isdigit() or not 1 <= int(raw) <= 20:
        return default, f"{PROBE_REPEAT_VAR}={raw!r}: a whole number from 1 to 20 (the setting's {default} used)"
    return int(raw), None
