"""The lab's inventory: modules in a TOML file, validated, and device selectors.

```toml
[defaults]                     # optional, applied to every module
ssh_user = "dev"
model_root = "/home/dev/models"

[[module]]
name = "m1000-a01"
host = "192.0.2.11"
ssh_port = 22
labels = { rack = "a", board = "evt2" }
model_paths = { qwen3vl = "/data/Qwen3-VL-8B" }   # per-key override of model_root/<folder>
env = { SERVER_PORT = "30000" }                     # extra variables for the release's scripts
power = { pdudaemon = "http://pdu-host:16421", pdu = "rack-a-pdu", port = "3" }  # optional: its PDU outlet
console = "console-server:3001"     # optional: its serial console, a ser2net raw TCP port (or telnet://host:port)
```

Lazy imports: :attr:`Module.queue` imports :mod:`contract.celery_app` when a queue is named: it loads Celery
(``celery.app.base`` 123 ms of CPU, ``bench/import_costs.py``:
bench/results/import_costs_20261207_0346_lazy-libraries.txt), and ``fleetctl runs`` and ``status`` read the
inventory without naming a queue (``tests/cli/test_lean_verbs.py``).
"""

from __future__ import annotations

import re
import tomllib
import unicodedata
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from contract.records import MODEL_KEYS
from controller.errors import FleetctlError

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_LABEL = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


_CONTROL_NAMES = {"\n": "newline", "\r": "carriage return", "\t": "tab", "\x1b": "escape", "\x00": "NUL"}


def control_character(text: str) -> str | None:
    """The first control character of ``text`` (a newline, a tab, an escape, a line separator, a
    bidirectional override...), named, with its position; None when there is none."""
    for i, c in enumerate(text):
        if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp"):
            name = _CONTROL_NAMES.get(c) or unicodedata.name(c, "control").lower()
            return f"U+{ord(c):04X} {name} at position {i + 1}"
    return None


class InventoryError(FleetctlError, ValueError):
    """Bad inventory or selector; the message names the file, module and field."""


_PDU_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$")
_CONSOLE = re.compile(r"^(?P<telnet>telnet://)?(?:(?P<name>[A-Za-z0-9][A-Za-z0-9.-]{0,252})"
                      r"|\[(?P<v6>[0-9A-Fa-f:.]{2,45})\]):(?P<port>[0-9]{1,5})$")


def console_address(text: str) -> tuple[str, int, bool]:
    """``host:port`` (``[v6]:port``) of a serial console's ser2net raw TCP port, or ``telnet://host:port`` of a
    telnet one (labgrid's exporter serves its ports so) -> (host, port, telnet); ValueError naming what is wrong
    (pure)."""
    m = _CONSOLE.match(text)
    if m is None or not 1 <= int(m["port"]) <= 65535:
        raise ValueError(f"{text!r} is not host:port of a ser2net raw TCP port, nor telnet://host:port of a telnet "
                         "one (e.g. \"console-server:3001\", \"[2001:db8::5]:3001\"; port 1-65535)")
    return m["name"] or m["v6"], int(m["port"]), m["telnet"] is not None


class PowerEntry(BaseModel):
    """A module's outlet on a PDU that a pdudaemon server drives (``power = {...}`` of a module; ADR 0048)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pdudaemon: str = Field(description="the pdudaemon server's HTTP listener, http://host:port (its "
                                       "`listener = \"http\"`, port 16421 by default)")
    pdu: str = Field(description="the PDU's name in that server's configuration (its `pdus` table)")
    port: str = Field(description="the module's outlet on that PDU (as the PDU's driver numbers them)")

    @field_validator("pdudaemon")
    @classmethod
    def _url(cls, v: str) -> str:
        u = urlsplit(v)
        if u.scheme not in ("http", "https") or not u.hostname or u.path not in ("", "/") or u.query or u.username:
            raise ValueError(f"{v!r} is not http(s)://host:port of a pdudaemon HTTP listener (no path, query or "
                             "credentials)")
        return v.rstrip("/")

    @field_validator("port", mode="before")
    @classmethod
    def _port_number(cls, v: object) -> object:
        return str(v) if isinstance(v, int) and not isinstance(v, bool) else v

    @field_validator("pdu", "port")
    @classmethod
    def _part(cls, v: str) -> str:
        if not _PDU_PART.match(v):
            raise ValueError(f"{v!r}: 1-128 of letters, digits, '.', '_', ':', '-', starting with a letter or digit")
        return v

    def where(self) -> str:
        """The outlet in words: ``PDU rack-a-pdu port 3 (pdudaemon http://pdu-host:16421)``."""
        return f"PDU {self.pdu} port {self.port} (pdudaemon {self.pdudaemon})"


class Module(BaseModel):
    """One ``[[module]]`` of the inventory; ``[defaults]`` takes the same keys and applies them to every module
    (``labels``, ``model_paths`` and ``env`` are merged key by key)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="the module's name: its queue, its broker user, `--devices` selects by it "
                                  "(1-63 letters, digits, '.', '_', '-')")
    host: str = Field(default="127.0.0.1", description="address the controller reaches it at (SSH, /metrics)")
    ssh_user: str = Field(default="root", description="SSH user of deploy, push and logs")
    ssh_port: int = Field(default=22, ge=1, le=65535, description="SSH port")
    labels: dict[str, str] = Field(default_factory=dict, description="free labels: `--devices label=value` "
                                                                     "selects by them; Prometheus target labels")
    model_root: str = Field(default="/home/dev/models", description="folder holding the model folders on the module")
    model_paths: dict[str, str] = Field(default_factory=dict,
                                        description="per-key override of model_root/<folder>: model key -> folder")
    env: dict[str, str] = Field(default_factory=dict, description="extra variables for the release's scripts")
    workdir: str = Field(default="~/m1000-fleet", description="the agent's work folder on the module")
    metrics_port: int = Field(default=9400, ge=1, le=65535, description="port of the agent's /metrics")
    # "local": the module's worker reads the release from a path the controller can see
    # (simulated modules, same host). "ssh": the release is pushed over SSH first.
    transport: str = Field(default="ssh", description="'ssh': the release is pushed over SSH first; 'local': the "
                                                      "worker reads it from a path the controller can see "
                                                      "(simulated modules, same host)")

    power: PowerEntry | None = Field(default=None, description="its outlet: `{ pdudaemon = URL, pdu = NAME, port = "
                                                                "PORT }` (power-cycled when it hangs mid-run)")
    console: str | None = Field(default=None, description="its serial console: `host:port` of a ser2net raw TCP "
                                                          "port (`accepter: tcp,...`), or `telnet://host:port` of a "
                                                          "telnet one; read while the controller follows a run and "
                                                          "kept beside the kernel log")

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("must be 1-63 of letters, digits, '.', '_', '-' and start with a letter or digit")
        return v

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        for k, value in v.items():
            if not _LABEL.match(k):
                raise ValueError(f"label name {k!r} is not a Prometheus-safe label name")
            bad = control_character(value)
            if bad is not None:
                raise ValueError(f"label {k!r}: its value holds a control character ({bad}); labels are one line "
                                 "of text (tables, selectors, Prometheus labels)")
        return v

    @field_validator("model_paths")
    @classmethod
    def _model_paths(cls, v: dict[str, str]) -> dict[str, str]:
        for k in v:
            if k not in MODEL_KEYS:
                raise ValueError(f"unknown model key {k!r} (known: {', '.join(MODEL_KEYS)})")
        return v

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        for k in v:
            if not _ENV.match(k):
                raise ValueError(f"variable name {k!r} is not a valid environment variable name")
        return v

    @field_validator("console")
    @classmethod
    def _console(cls, v: str | None) -> str | None:
        if v is not None:
            console_address(v)
        return v

    @field_validator("transport")
    @classmethod
    def _transport(cls, v: str) -> str:
        if v not in ("ssh", "local"):
            raise ValueError("must be 'ssh' or 'local'")
        return v

    @property
    def queue(self) -> str:
        from contract.celery_app import queue_name

        return queue_name(self.name)


class Inventory(BaseModel):
    model_config = ConfigDict(frozen=True)

    path: str = ""
    modules: tuple[Module, ...]

    def select(self, selector: str) -> list[Module]:
        return select(self.modules, selector)


def _fmt_error(path: str, module: str | None, err: ValidationError) -> InventoryError:
    e = err.errors()[0]
    field = ".".join(str(x) for x in e["loc"]) or "?"
    who = f" module {module!r}:" if module else ""
    return InventoryError(f"{path}:{who} field {field!r}: {e['msg']}")


def parse_inventory(data: dict[str, Any], path: str = "<inventory>") -> Inventory:
    unknown = set(data) - {"defaults", "module"}
    if unknown:
        raise InventoryError(f"{path}: unknown top-level table {sorted(unknown)[0]!r} (expected 'defaults', 'module')")
    defaults = data.get("defaults", {})
    if not isinstance(defaults, dict):
        raise InventoryError(f"{path}: 'defaults' must be a table")
    raw = data.get("module", [])
    if not isinstance(raw, list) or not raw:
        raise InventoryError(f"{path}: no [[module]] entries")
    modules: list[Module] = []
    # casefolded name -> the name as written
    seen: dict[str, str] = {}
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict):
            raise InventoryError(f"{path}: module #{i + 1} is not a table")
        name = entry.get("name")
        label = str(name) if name else f"#{i + 1}"
        merged = {**defaults, **entry}
        for key in ("labels", "model_paths", "env"):
            if isinstance(defaults.get(key), dict) and isinstance(entry.get(key), dict):
                merged[key] = {**defaults[key], **entry[key]}
        try:
            m = Module.model_validate(merged)
        except ValidationError as exc:
            raise _fmt_error(path, label, exc) from None
        if m.name in seen.values():
            raise InventoryError(f"{path}: module {m.name!r}: field 'name': duplicate module name")
        twin = seen.get(m.name.casefold())
        if twin is not None:
            # queue names, Redis users and key patterns, work folders (case-insensitive file systems) collide
            raise InventoryError(f"{path}: module {m.name!r}: field 'name': differs from module {twin!r} only in "
                                 "case (their queues, broker keys and folders would collide): rename one")
        seen[m.name.casefold()] = m.name
        modules.append(m)
    return Inventory(path=path, modules=tuple(modules))


def load_inventory(path: str | Path) -> Inventory:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InventoryError(f"{p}: inventory file not found") from None
    except OSError as exc:
        raise InventoryError(f"{p}: cannot read inventory: {exc.strerror}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise InventoryError(f"{p}: not valid TOML: {exc}") from None
    return parse_inventory(data, str(p))


def select(modules: Iterable[Module], selector: str) -> list[Module]:
    """``all``; names; ``label=value``; comma-separated terms, united, in inventory order."""
    mods = list(modules)
    terms = [t.strip() for t in selector.split(",") if t.strip()]
    if not terms:
        raise InventoryError("empty device selector")
    chosen: set[str] = set()
    names = {m.name for m in mods}
    for term in terms:
        if term == "all":
            chosen |= names
        elif "=" in term:
            k, _, v = term.partition("=")
            hit = {m.name for m in mods if m.labels.get(k.strip()) == v.strip()}
            if not hit:
                raise InventoryError(f"device selector {term!r}: no module has label {k.strip()}={v.strip()}")
            chosen |= hit
        elif term in names:
            chosen.add(term)
        else:
            raise InventoryError(f"device selector {term!r}: unknown module (known: {', '.join(sorted(names))})")
    return [m for m in mods if m.name in chosen]
