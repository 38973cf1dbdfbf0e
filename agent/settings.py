"""The agent's own settings (``[agent]`` of the config file) on top of the fleet's shared broker settings.

The shared part (broker URL, TLS, time limits, the TOML source, ``load_settings``) is
:mod:`contract.settings`; both sides import it from there.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import ClassVar

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
    stop_grace: float = Field(default=15.0, gt=0, description="SIGTERM to SIGKILL of a release process group, s")
    min_free_disk: int = Field(default=2 * 1024**3, ge=0, description="below this free disk the module is bad, bytes")
    keep_releases: int = Field(default=3, ge=1, description="unpacked releases (and their kernel caches) kept under "
                                                            "<workdir>/releases, the newest used; this run's included")
    unpack_max_members: int = Field(default=100_000, ge=1, description="a release tarball with more members is "
                                                                       "refused (a release has a few thousand)")
    unpack_max_name_bytes: int = Field(default=1024, ge=1, le=4096, description="a tarball member whose path (or "
                                                                               "link target) is longer is refused")
    release_roots: list[Path] = Field(
        default_factory=list,
        description="folders a run's tarball may be read from, besides the module's own release cache "
                    "(<workdir>/incoming, <workdir>/releases); empty: <data_dir>/releases (local transport)")
    telemetry_period: float = Field(default=1.0, ge=0, description="device telemetry period during runs, s (0: off)")
    telemetry_min_samples: int = Field(default=20, ge=1, description="device samples a key's benchmark window "
                                                                     "needs inside it for an energy figure")
    telemetry_tool: str | None = Field(default=None, description="device tool (default: mthreads-gmi, else "
                                                                 "nvidia-smi, whichever is on PATH)")
    telemetry_fast: bool = Field(default=True, description="sample faster while a key's idle power and benchmark "
                                 "are measured, so that a short window gets telemetry_min_samples (bounded by the "
                                 "tool's measured cost)")
    telemetry_idle_window: float = Field(default=1.0, ge=0, description="idle power before each key's benchmark: "
                                         "the server up and idle, over a settled window this long, s (0: the samples "
                                         "before the server starts)")
    final_state_replicas: int | None = Field(
        default=None, ge=0, description="Redis replicas that must acknowledge (WAIT) a run's final state and rows "
                                        "before they leave the outbox; default: 1 with a sentinel:// broker_url, "
                                        "else 0 (no WAIT)")
    final_state_wait: float = Field(default=2.0, gt=0, le=60, description="how long one WAIT for those replicas "
                                                                          "may block, s")

    final_resend_interval: float = Field(
        default=30.0, gt=0, description="a final state the controller has not acknowledged is sent again (rows, "
                                        "telemetry, state) this often at first, then every tenth of its age (at "
                                        "most hourly) until result_expires, s")

    kernel_cache: bool = Field(default=False, description="share compiled TileLang kernels with the fleet: fetch a "
                               "trusted archive instead of compiling, publish one after compiling "
                               "(docs/howto/kernel-cache.md)")
    kernel_cache_trust_first: bool = Field(default=False, description="trust an archive the first module compiled "
                                           "(else only one two modules compiled identically)")
    device_class: str = Field(default="M1000", min_length=1, max_length=64,
                              description="this module's device class: kernel caches are shared within a class")

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
    probe: bool = Field(default=True, description="cross-check each key's release benchmark with the agent's probe")
    probe_profiles: str = Field(default="128:128", description="sweep profiles the probe runs, comma separated")
    probe_requests: int = Field(default=5, ge=1,
                                description="measured probe requests per profile (their median is the probe's figure; "
                                            "the first kept apart, the others' spread is the noise the cross-check "
                                            "judges with)")
    probe_tolerance: float = Field(default=0.02, gt=0, lt=1,
                                   description="the least relative difference of release and probe figures that can "
                                               "flag a row release_benchmark_disagrees (above it, the measured noise "
                                               "decides)")
    probe_repeat: int = Field(default=1, ge=1, le=20,
                              description="rounds of the per-key probe: figures pooled, each with its 95 % interval "
                                          "over the rounds, the noise judged from their spread (a key's PROBE_REPEAT "
                                          "variable overrides it)")
    probe_sweep_slo: str = Field(default="", description="an SLO (e.g. ttft_p90_ms=4000,tpot_p90_ms=60) turns on the "
                                 "probe's SLO sweep per key: the capacity at SLO of the first probed profile; empty: "
                                 "off")
    probe_sweep_budget: float = Field(default=300.0, gt=0, description="wall seconds of one key's SLO sweep, at most")
    warmup_request: bool = Field(default=True, description="time one short request once a key's server is ready "
                                 "(the first-request time, a judged start-up cost)")
