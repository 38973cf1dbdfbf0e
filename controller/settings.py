"""Controller settings: ``[fleet]`` and ``[controller]`` of the config file, ``FLEET_*`` variables."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field, field_validator, model_validator

from contract.records import UnknownModelKey, parse_model_keys
from contract.redact import redact_url
from contract.settings import BrokerSettings, SettingsError
from controller.errors import FleetctlError


class ConfigError(FleetctlError, SettingsError):
    """A controller setting that cannot be used (a secret or tokens file, a webhook URL, the API's address)."""


class ControllerSettings(BrokerSettings):
    """The controller (``fleetctl``, ``fleetctl serve``); section ``[controller]`` of the config file."""

    config_section: ClassVar[str] = "controller"
    # the agent's settings of these names read FLEET_METRICS_PORT ...: the controller's have their own variables
    env_names: ClassVar[dict[str, str]] = {name: f"FLEET_CONTROLLER_{name.upper()}"
                                           for name in ("metrics_host", "metrics_port")}

    inventory: Path = Field(default=Path("inventory.toml"), description="the lab's inventory (TOML)")
    history: Path | str | None = Field(
        default=None, description="run history: a SQLite file (default <data_dir>/history.sqlite), or a PostgreSQL "
                                  "database several controllers share (postgresql://user@host:port/db)")
    known_hosts: Path = Field(default=Path.home() / ".ssh" / "known_hosts", description="SSH host keys of modules")
    ssh_key: Path | None = Field(default=None, description="SSH private key for modules (default: none, a running "
                                                            "ssh-agent only; no ~/.ssh/config, no key search)")
    ssh_key_passphrase_file: Path | None = Field(
        default=None, description="file holding the passphrase of ssh_key (mode 0600); else ssh-agent is asked")
    metrics_host: str = Field(default="127.0.0.1", description="bind address of `fleetctl serve` /metrics")
    metrics_port: int = Field(default=9401, ge=0, le=65535, description="port of `fleetctl serve` /metrics")
    golden_tolerance: float = Field(default=0.03, gt=0, lt=1,
                                    description="a golden check's drift that makes a module bad (0.03 = 3 % worse "
                                                "than its own golden history)")
    golden_release: str | None = Field(
        default=None, description="the known-good release (path or URL) of scheduled golden checks (fleetctl serve)")
    golden_every_runs: int = Field(default=0, ge=0, description="fleetctl serve runs a golden check on an idle module "
                                                                 "after this many validations there (0: never)")
    golden_every_hours: float = Field(default=0.0, ge=0, description="... and this long after its last golden check, "
                                                                      "hours (0: never)")
    golden_models: tuple[str, ...] = Field(default=("qwen3",), min_length=1,
                                           description="the model keys of a scheduled golden check")
    raise_after: float = Field(default=3600.0, ge=0, description="fleetctl serve raises a run waiting on a module's "
                                                                "queue this long a priority level (up to high; again "
                                                                "after as long again), s (0: never)")
    api_host: str = Field(default="127.0.0.1", description="bind address of the HTTP API of `fleetctl serve`")
    api_port: int = Field(default=0, ge=0, le=65535, description="port of the HTTP API of `fleetctl serve` (0: off)")
    serve_url: str | None = Field(default=None, pattern=r"^https?://[^\s?#]+$", max_length=2048,
                                  description="where people open `fleetctl serve`'s pages (http://HOST:PORT): "
                                              "`fleetctl validate` prints a run's page, webhooks carry it")
    api_tokens_file: Path | None = Field(default=None,
                                         description="bearer tokens of the HTTP API: USER ROLE TOKEN a line (0600)")
    api_timeout: float = Field(default=10.0, gt=0,
                               description="a request's line and headers must arrive within this of the connection "
                                           "(or of the previous response), and its body within as long again, s; a "
                                           "slower client is closed")
    webhook_urls: tuple[str, ...] = Field(default=(), description="POST each run's verdict here (JSON, signed)")
    webhook_secret_file: Path | None = Field(default=None, description="HMAC-SHA256 key of the webhooks (0600)")
    release_url_hosts: tuple[str, ...] = Field(
        default=(), description="allow-list of release URL hosts: names, addresses or networks (10.0.0.0/8). Empty: "
                                "any host but loopback and the controller's own addresses; set: these only "
                                "(loopback too, if listed). Link-local and metadata addresses, the broker's and the "
                                "controller's own ports are refused whatever is listed")
    baseline_same_environment: bool = Field(
        default=False, description="refuse a comparison with a baseline unless every module measured in the "
                                   "baseline's environment (its fingerprint: driver, firmware, MUSA, torch_musa, "
                                   "Triton, TileLang, kernel, OS, agent); off: such a change is a warning")
    power_cycle_after: float | None = Field(
        default=None, ge=0, description="a module of a running run with a PDU outlet in the inventory and no heartbeat "
                                        "for this long is power-cycled through pdudaemon, once a run (the resumed run "
                                        "spends one of max_attempts); longer than offline_after, shorter than "
                                        "lost_after; default: 40 % of lost_after, 240 s of the default 600; 0: never, "
                                        "s")

    @field_validator("history", mode="before")
    @classmethod
    def _history_text(cls, v: object) -> object:
        """A path given as one (``Path``, from code and tests) is the file's name."""
        return str(v) if isinstance(v, Path) else v

    @field_validator("golden_models")
    @classmethod
    def _golden_keys(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        try:
            return parse_model_keys(v)
        except UnknownModelKey as exc:
            raise ValueError(str(exc)) from None

    @model_validator(mode="after")
    def _golden_schedule(self) -> ControllerSettings:
        if (self.golden_every_runs or self.golden_every_hours) and not self.golden_release:
            raise ValueError("golden_every_runs or golden_every_hours is set but golden_release is not: name the "
                             "known-good release the scheduled golden checks validate")
        return self

    @model_validator(mode="after")
    def _power_bound(self) -> ControllerSettings:
        if self.power_cycle_after and not self.offline_after < self.power_cycle_after < self.lost_after:
            raise ValueError(f"power_cycle_after ({self.power_cycle_after:g} s) must be longer than offline_after "
                             f"({self.offline_after:g} s) and shorter than lost_after ({self.lost_after:g} s): the "
                             "module must have time to come back before its run is given up")
        return self

    @property
    def cycle_after(self) -> float:
        """:attr:`power_cycle_after`, or its default: 40 % of lost_after (never below offline_after)."""
        return self.power_cycle_after or max(0.4 * self.lost_after, self.offline_after)

    @property
    def history_location(self) -> Path | str:
        """What the run history is opened from: its SQLite file, or its PostgreSQL URL (password and all)."""
        # a Path too: model_copy(update=...) does not run the validators
        where = self.history
        if isinstance(where, str) and where.startswith(("postgresql://", "postgres://")):
            return where
        return Path(where or self.data_dir / "history.sqlite").expanduser()

    @property
    def history_path(self) -> Path | str:
        """The run history as messages name it: its SQLite file, or its PostgreSQL URL without the credentials."""
        where = self.history_location
        return redact_url(where) if isinstance(where, str) else where
