"""Controller settings: ``[fleet]`` and ``[controller]`` of the config file, ``FLEET_*`` variables."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

from pydantic import Field

from agent.settings import BrokerSettings


class ControllerSettings(BrokerSettings):
    config_section: ClassVar[str] = "controller"

    inventory: Path = Field(default=Path("inventory.toml"), description="the lab's inventory (TOML)")
    history: Path | None = Field(default=None, description="run history (SQLite); default <data_dir>/history.sqlite")
    known_hosts: Path = Field(default=Path.home() / ".ssh" / "known_hosts", description="SSH host keys of modules")
    ssh_key: Path | None = Field(default=None, description="SSH private key for modules (default: agent/ssh config)")
    ssh_key_passphrase_file: Path | None = Field(
        default=None, description="file holding the passphrase of ssh_key (mode 0600); else ssh-agent is asked")
    metrics_host: str = Field(default="127.0.0.1", description="bind address of `fleetctl serve` /metrics")
    metrics_port: int = Field(default=9401, ge=0, le=65535, description="port of `fleetctl serve` /metrics")
    failures_for_bad: int = Field(default=3, ge=1, description="consecutive failed runs that make a module bad")

    @property
    def history_path(self) -> Path:
        return (self.history or self.data_dir / "history.sqlite").expanduser()
