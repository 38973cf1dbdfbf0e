"""The fleet's shared settings (broker, limits, TOML source), from the environment and a TOML file.

Precedence (highest first): explicit arguments, ``FLEET_*`` environment variables, the
TOML config file (``--config`` or ``FLEET_CONFIG``), defaults. ``FLEET_*`` names are matched
without regard to case; a list or tuple setting is given as JSON (``FLEET_RELEASE_ROOTS='["/a"]'``).
Built on plain pydantic (no pydantic-settings: ~2.3 MiB of RSS in each agent process). The broker password never
needs to be on a command line: put the URL in the config file (mode 0600) or give
``broker_password_file``; it is then merged into the URL in memory only.
"""

from __future__ import annotations

import difflib
import json
import os
import ssl
import sys
import types
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar, Union, get_args, get_origin
from urllib.parse import quote, urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from contract.redact import redact_url
from contract.removed_settings import drop_removed, warn_removed_env

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - agents on Python 3.10
    tomllib = None

DEFAULT_HOME = Path(os.environ.get("XDG_DATA_HOME", Path.home() / ".local" / "share")) / "m1000-fleet"


# Constants that were settings until issue 50 (ADR 0058): no lab needed another value.
# how long results (and a run's records) stay on the broker, s
RESULT_EXPIRES = 7 * 86400.0
# a run's soft limit comes this long (a fifth of run_time_limit at most) before its hard one
SOFT_LIMIT_MARGIN = 600.0


class SettingsError(ValueError):
    pass


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SettingsError(f"{path}: config file not found") from None
    if tomllib is None:  # pragma: no cover
        raise SettingsError(f"{path}: TOML config needs Python 3.11 (use FLEET_* variables on 3.10)")
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"{path}: not valid TOML: {exc}") from None
    return data


# Every section a config file may hold, whichever program reads it: one file can serve an agent and a
# controller on one machine, so each program skips the other's section (and checks only its own keys).
CONFIG_SECTIONS = ("fleet", "agent", "controller")


def _closest(word: str, choices: Iterable[str]) -> str | None:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return close[0] if close else None


def _sections() -> str:
    return ", ".join(f"[{s}]" for s in CONFIG_SECTIONS)


def _check_layout(path: Path, raw: dict[str, Any]) -> None:
    """Every top-level entry of the file is a known section (one line naming the file otherwise)."""
    for name, value in raw.items():
        if name in CONFIG_SECTIONS and not isinstance(value, dict):
            raise SettingsError(f"{path}: [{name}] must be a table")
        if not isinstance(value, dict):
            raise SettingsError(f"{path}: setting {name!r} is outside any section (settings go under {_sections()})")
        if name not in CONFIG_SECTIONS:
            close = _closest(name, CONFIG_SECTIONS)
            hint = f" (did you mean [{close}]?)" if close else ""
            raise SettingsError(f"{path}: unknown section [{name}]{hint}; the sections are {_sections()}")


def _file_values(cls: type[EnvSettings], path: Path | None) -> dict[str, Any]:
    """``[fleet]`` (shared broker settings) and ``[<section>]`` of the config file, merged.

    A section no program knows (``[controler]``), or a setting outside any section, is refused: a
    misspelled section would otherwise be skipped and its settings silently not applied. The other
    program's section is skipped unread (one file may serve both)."""
    if path is None:
        return {}
    raw = _read_toml(path)
    _check_layout(path, raw)
    shared = drop_removed(str(path), "fleet", raw.get("fleet", {}), ("fleet",))
    own = raw.get(cls.config_section, {}) if cls.config_section != "fleet" else {}
    own = drop_removed(str(path), cls.config_section, own, ("fleet", cls.config_section))
    for section, table, known in (("fleet", shared, BrokerSettings.model_fields),
                                  (cls.config_section, own, cls.model_fields)):
        unknown = sorted(set(table) - set(known))
        if not unknown:
            continue
        name = unknown[0]
        if section == "fleet" and name in cls.model_fields:
            hint = f" (it belongs under [{cls.config_section}])"
        else:
            close = _closest(name, known)
            hint = f" (did you mean {close!r}?)" if close else ""
        raise SettingsError(f"{path}: [{section}]: unknown setting {name!r}{hint}")
    return {**shared, **own}


_JSON_KINDS = (list, tuple, set, frozenset, dict)


def _wants_json(annotation: Any) -> bool:
    """A list, tuple, set or dict setting (or an optional one): its variable holds JSON."""
    origin = get_origin(annotation)
    if origin in _JSON_KINDS or annotation in _JSON_KINDS:
        return True
    if origin in (Union, types.UnionType):
        return any(_wants_json(a) for a in get_args(annotation) if a is not type(None))
    return False


def _env_values(cls: type[EnvSettings], environ: dict[str, str]) -> dict[str, Any]:
    """The variables (any case) of ``cls``'s fields: ``FLEET_<NAME>``, or the name ``cls.env_names`` gives."""
    lowered = {k.lower(): v for k, v in environ.items()}
    out: dict[str, Any] = {}
    for name, field in cls.model_fields.items():
        var = cls.env_var(name).lower()
        if var not in lowered:
            continue
        value: Any = lowered[var]
        if _wants_json(field.annotation):
            try:
                value = json.loads(value)
            except ValueError as exc:
                raise SettingsError(f"{var.upper()}: not valid JSON ({exc}); a list is written "
                                    '["a", "b"]') from None
        out[name] = value
    return out


class EnvSettings(BaseModel):
    """Settings read from arguments, then ``FLEET_*`` variables, then the TOML config file, then defaults."""

    model_config = ConfigDict(extra="ignore", frozen=True, validate_default=True, protected_namespaces=())
    config_section: ClassVar[str] = "fleet"
    env_prefix: ClassVar[str] = "FLEET_"
    # a setting whose name the other program's settings use for another thing (both have a metrics_port) reads
    # a variable of its own, so that an agent and a controller on one machine never read each other's
    env_names: ClassVar[dict[str, str]] = {}

    @classmethod
    def env_var(cls, name: str) -> str:
        """The environment variable of setting ``name``: ``FLEET_<NAME>`` unless :attr:`env_names` says another."""
        return cls.env_names.get(name) or f"{cls.env_prefix}{name}".upper()

    def __init__(self, **values: Any) -> None:
        path = os.environ.get("FLEET_CONFIG")
        warn_removed_env(os.environ, dict.fromkeys(("fleet", type(self).config_section)))
        found = {**_file_values(type(self), Path(path) if path else None), **_env_values(type(self), dict(os.environ))}
        super().__init__(**{**found, **values})


class BrokerSettings(EnvSettings):
    """What every Celery app of the fleet must agree on (agents and controller alike)."""

    config_section: ClassVar[str] = "fleet"

    broker_url: str = Field(
        default="filesystem://",
        description="redis://[user:pass@]host:6379/0, rediss://..., "
                    "sentinel://[user:pass@]s1:26379;sentinel://s2:26379;sentinel://s3:26379/0 (Redis Sentinel, "
                    "with broker_sentinel_master), or filesystem:// (embedded, one machine)",
    )
    broker_password_file: Path | None = Field(
        default=None, description="file holding the broker password (merged into the URL in memory only)")
    broker_sentinel_master: str | None = Field(
        default=None, description="name of the master the Sentinels of a sentinel:// broker_url watch")
    broker_tls_ca_file: Path | None = Field(default=None, description="CA certificate(s) the broker's TLS "
                                            "certificate must chain to (rediss://); default: the system's")
    broker_tls_cert_file: Path | None = Field(default=None, description="client certificate for the broker (TLS)")
    broker_tls_key_file: Path | None = Field(default=None, description="key of broker_tls_cert_file (mode 0600)")
    data_dir: Path = Field(default=DEFAULT_HOME, description="embedded broker and result folders")
    kernel_cache_dir: Path | None = Field(default=None, description="the fleet's kernel cache store, where agents "
                                          "publish and fetch compiled kernels and `fleetctl cache` looks; default "
                                          "<data_dir>/kernel-cache (next to the staged releases)")
    run_time_limit: float = Field(
        default=4 * 3600.0 + 600, gt=0,
        description="hard time limit of one run on one module, s; its soft limit is a fifth of it earlier, 600 s at "
                    "most (the agent ends the run cleanly 30 s before the soft limit, or a tenth of it before when "
                    "that is shorter)")
    heartbeat_interval: float = Field(default=5.0, gt=0, description="agent heartbeat period, s")
    offline_after: float = Field(default=30.0, gt=0, description="no heartbeat for this long: unreachable, s")
    lost_after: float = Field(default=600.0, gt=0,
                              description="no heartbeat for this long: the module's run is lost, s")
    queue_deadline: float = Field(
        default=0.0, ge=0, description="a run still waiting on a module's queue this long after its dispatch is given "
                                       "up there (its part fails, and a later delivery does not run it), s; 0: it "
                                       "waits as long as the module is busy")
    max_attempts: int = Field(default=2, ge=1, description="deliveries of one run to one module, at most")
    broker_visibility_timeout: float | None = Field(
        default=None, gt=0, description="Redis visibility timeout, s (default: hard time limit + 1 h)")

    @model_validator(mode="after")
    def _limits(self) -> BrokerSettings:
        if self.offline_after <= self.heartbeat_interval:
            raise ValueError("offline_after must be longer than heartbeat_interval")
        if self.lost_after < self.offline_after:
            raise ValueError("lost_after must not be shorter than offline_after")
        return self

    @model_validator(mode="after")
    def _sentinel(self) -> BrokerSettings:
        sentinel = self.is_sentinel
        if sentinel and not self.broker_sentinel_master:
            raise ValueError("a sentinel:// broker_url needs broker_sentinel_master (the master name the Sentinels "
                             "watch)")
        if self.broker_sentinel_master and not sentinel:
            raise ValueError("broker_sentinel_master is for a sentinel:// broker_url")
        return self

    @property
    def is_sentinel(self) -> bool:
        return urlsplit(self.broker_url).scheme == "sentinel"

    @model_validator(mode="after")
    def _tls(self) -> BrokerSettings:
        tls = (self.broker_tls_ca_file, self.broker_tls_cert_file, self.broker_tls_key_file)
        if any(tls) and urlsplit(self.broker_url).scheme != "rediss":
            raise ValueError("broker_tls_* settings need a rediss:// broker_url")
        if bool(self.broker_tls_cert_file) != bool(self.broker_tls_key_file):
            raise ValueError("broker_tls_cert_file and broker_tls_key_file go together")
        return self

    def broker_ssl_options(self) -> dict[str, Any] | None:
        """redis-py's TLS arguments for ``rediss://`` (certificate always verified), else None."""
        if urlsplit(self.broker_url).scheme != "rediss":
            return None
        opts: dict[str, Any] = {"ssl_cert_reqs": ssl.CERT_REQUIRED}
        if self.broker_tls_ca_file:
            opts["ssl_ca_certs"] = str(self.broker_tls_ca_file.expanduser())
        if self.broker_tls_cert_file and self.broker_tls_key_file:
            opts["ssl_certfile"] = str(self.broker_tls_cert_file.expanduser())
            opts["ssl_keyfile"] = str(self.broker_tls_key_file.expanduser())
        return opts

    @field_validator("broker_url")
    @classmethod
    def _scheme(cls, v: str) -> str:
        chunks = v.split(";")
        scheme = urlsplit(chunks[0]).scheme
        if scheme not in ("redis", "rediss", "sentinel", "filesystem", "memory"):
            raise ValueError(f"unsupported broker scheme {scheme!r} (redis, rediss, sentinel, filesystem)")
        if len(chunks) > 1 and scheme != "sentinel":
            raise ValueError("only a sentinel:// broker_url lists several servers (separated by ';')")
        for chunk in chunks:
            parts = urlsplit(chunk)
            if scheme == "sentinel" and (parts.scheme != "sentinel" or not parts.hostname):
                raise ValueError(f"{redact_url(chunk)!r}: every server of a sentinel broker_url is sentinel://host:port")
        return v

    def kernel_cache_root(self) -> Path:
        """The fleet's kernel cache store (``kernel_cache_dir``, else ``<data_dir>/kernel-cache``)."""
        return (self.kernel_cache_dir or self.data_dir / "kernel-cache").expanduser()

    @property
    def run_soft_time_limit(self) -> float:
        """The soft limit of one run: :attr:`run_time_limit` less a fifth of it, 600 s at most (4 h of 4 h 10 min)."""
        return self.run_time_limit - min(SOFT_LIMIT_MARGIN, self.run_time_limit / 5)

    @property
    def module_deadline(self) -> float:
        """Liveness bound: a started (run, module) is terminal this long after it started, whatever happens."""
        return self.run_time_limit + self.lost_after + 60.0

    @property
    def visibility_timeout(self) -> float:
        """Longer than the hard time limit, derived the same way by every app (unless set, for tests)."""
        return self.broker_visibility_timeout or self.run_time_limit + 3600.0

    def broker_url_with_secret(self) -> str:
        """The broker URL with the password from ``broker_password_file`` merged in (memory only).

        For Sentinel the password is the master's (and its replicas'); it goes into every server of
        the list, and kombu and Celery give it to the master only, not to the Sentinels.
        """
        if not self.broker_password_file:
            return self.broker_url
        secret = self.broker_password_file.read_text(encoding="utf-8").strip()
        out = []
        for chunk in self.broker_url.split(";"):
            parts = urlsplit(chunk)
            user = parts.username or ""
            host = parts.hostname or "localhost"
            port = f":{parts.port}" if parts.port else ""
            netloc = f"{quote(user, safe='')}:{quote(secret, safe='')}@{host}{port}"
            out.append(urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment)))
        return ";".join(out)

    def redacted_broker_url(self) -> str:
        return ";".join(redact_url(chunk) for chunk in self.broker_url.split(";"))


def load_settings(cls: type[BrokerSettings], config: str | Path | None = None, **overrides: Any) -> Any:
    """Settings of ``cls`` with ``config`` as the TOML file (else ``FLEET_CONFIG``)."""
    old = os.environ.get("FLEET_CONFIG")
    try:
        if config is not None:
            os.environ["FLEET_CONFIG"] = str(config)
        return cls(**{k: v for k, v in overrides.items() if v is not None})
    finally:
        if config is not None:
            if old is None:
                os.environ.pop("FLEET_CONFIG", None)
            else:
                os.environ["FLEET_CONFIG"] = old
