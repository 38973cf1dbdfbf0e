"""The agent's own settings (``[agent]`` of the config file) on top of the fleet's shared broker settings.

The shared part (broker URL, TLS, time limits, the TOML source, ``load_settings``) is
:mod:`contract.settings`; both sides import it from there.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import Field

from contract.settings import BrokerSettings


class AgentSettings(BrokerSettings):
    """One module's agent (``fleet-agent worker``); section ``[agent]`` of the config file."""

    config_section: ClassVar[str] = "agent"

    module: str = Field(default_factory=socket.gethostname, description="this module's name in the inventory")
    workdir: Path = Field(default=Path.home() / "m1000-fleet", description="releases, runs, caches, logs")
    model_root: Path = Field(default=Path.home() / "models", description="folder holding the model folders")
    server_port: int = Field(default=30000, ge=1, le=65535, description="port the release's server listens on")
    metrics_host: str = Field(default="127.0.0.1", description="bind address of /metrics")
    metrics_port: int = Field(default=9400, ge=0, le=65535, description="port of /metrics (0: off)")
    pushgateway_url: str | None = Field(default=None, description="push metrics here too (optional)")
    min_free_disk: int = Field(default=2 * 1024**3, ge=0, description="below this free disk the module is bad, bytes")
    release_roots: list[Path] = Field(
        default_factory=list,
        description="folders a run's tarball may be read from, besides the module's own release cache "
                    "(<workdir>/incoming, <workdir>/releases); empty: <data_dir>/releases (local transport)")
    telemetry_period: float = Field(default=1.0, ge=0, description="device telemetry period during runs, s (0: off)")
    final_state_replicas: int | None = Field(
        default=None, ge=0, description="Redis replicas that must acknowledge (WAIT) a run's final state and rows "
                                        "before they leave the outbox; default: 1 with a sentinel:// broker_url, "
                                        "else 0 (no WAIT)")
    kernel_cache: bool | Literal["trust-first"] = Field(
        default=False, description="share compiled TileLang kernels with the fleet: fetch a trusted archive (one two "
                                   "modules compiled identically; \"trust-first\": the first module's) instead of "
                                   "compiling, publish one after compiling (docs/howto/kernel-cache.md)")
    device_class: str = Field(default="M1000", min_length=1, max_length=64,
                              description="this module's device class: kernel caches are shared within a class")

    probe: bool = Field(default=True, description="cross-check each key's release benchmark with the agent's probe")
    probe_profiles: str = Field(default="128:128", description="sweep profiles the probe runs, comma separated")
    probe_sweep_slo: str = Field(default="", description="an SLO (e.g. ttft_p90_ms=4000,tpot_p90_ms=60) turns on the "
                                 "probe's SLO sweep per key: the capacity at SLO of the first probed profile; empty: "
                                 "off")

    def replicas_to_wait(self) -> int:
        """Replicas a final state waits for (``final_state_replicas``, else 1 with Sentinel, 0 without)."""
        if self.final_state_replicas is not None:
            return self.final_state_replicas
        return 1 if self.is_sentinel else 0

    def allowed_release_roots(self) -> list[Path]:
        """Where a requested tarball may live (symlinks resolved): release cache plus configured roots."""
        work = self.workdir.expanduser()
        extra = self.release_roots or [self.data_dir.expanduser() / "releases"]
        return [Path(os.path.realpath(p.expanduser())) for p in (work / "incoming", work / "releases", *extra)]
