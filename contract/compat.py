"""The version policy between a controller and its agents (ADR 0051), pure: which contract versions run together.

The contract version is ``schema_version`` (:data:`contract.version.SCHEMA_VERSION`): on every record, and on every
heartbeat, where the controller reads it (the agent's own advertisement). The rules:

- an agent runs requests of its own contract version and of the one before (:func:`runs_request`); a request of
  another version is refused before anything runs;
- a controller of version C sends each module a request of the lower of C and the module's version
  (:func:`judge`): a module one behind gets a request of its own version, one ahead gets C (which it still runs);
  a module further apart cannot run the controller's requests and is refused by ``fleetctl validate`` before the
  run is created, naming ``fleetctl deploy``;
- what either side only reads (progress, rows, heartbeats, telemetry) is read tolerantly: a field it does not know
  is ignored (``contract.records.Record``); a request, what an agent is asked to run, stays strict;
- a version only adds: a field added to a request has a default meaning "as before" (:data:`REQUEST_FIELDS_ADDED`,
  dropped for an older agent by :func:`request_for`, refused when set), nothing an older reader needs stops being
  written.

Upgrade order (docs/operations/upgrades.md): the controller first, then the agents, one at a time or all at once.
Imports nothing heavy (``fleetctl version`` reads it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from contract.version import SCHEMA_VERSION

CONTRACT = SCHEMA_VERSION
# fields a request gained in a version (version -> field names): a controller drops them for an agent of an earlier
# version (:func:`request_for`); none yet: contract 2 changed how records are read, not what a request holds
REQUEST_FIELDS_ADDED: Mapping[int, tuple[str, ...]] = {}

# fields a record the other side reads gained in a version (version -> record class -> field names): a seal
# (contract.digest) of an earlier version leaves them out; none yet
RECORD_FIELDS_ADDED: Mapping[int, Mapping[str, tuple[str, ...]]] = {}

Standing = Literal["current", "behind", "ahead", "refused", "unknown"]


def fields_after(record: str, version: int,
                 added: Mapping[int, Mapping[str, tuple[str, ...]]] = RECORD_FIELDS_ADDED) -> frozenset[str]:
    """The fields of the record class named ``record`` that versions after ``version`` added."""
    return frozenset(f for v, by in added.items() if v > version for f in by.get(record, ()))


def runs_request(request: int, agent: int = CONTRACT) -> bool:
    """Whether an agent of contract ``agent`` runs a request of version ``request``: its own, or the one before."""
    return agent - 1 <= request <= agent


@dataclass(frozen=True)
class Compat:
    """How a module of contract ``agent`` (None: no heartbeat read) stands against a controller of ``controller``."""

    agent: int | None
    controller: int
    standing: Standing
    # the request version it is sent; None: none it runs (refused)
    request: int | None

    @property
    def runs(self) -> bool:
        return self.request is not None

    def shown(self) -> str:
        """The ``contract`` column of ``fleetctl devices``: the module's version, and a flag when it differs."""
        if self.agent is None:
            return ""
        if self.standing == "current":
            return str(self.agent)
        return f"{self.agent} ({self.standing})"

    def note(self, module: str) -> str:
        """One line for a module not at the controller's version ('' for one that is, or unknown)."""
        a, c = self.agent, self.controller
        deploy = f"`fleetctl deploy --devices {module}`"
        if self.standing == "behind":
            return f"agent contract {a}, one behind the controller's {c}: runs; upgrade it with {deploy}"
        if self.standing == "ahead":
            return (f"agent contract {a}, one ahead of the controller's {c}: runs; upgrade the controller "
                    "(the controller goes first: docs/operations/upgrades.md)")
        if self.standing == "refused":
            works = f"agent contract {a}: this controller (contract {c}) works with agents of {c - 1} to {c + 1}"
            if a is not None and a < c:
                return f"{works}; upgrade it with {deploy}"
            return f"{works}; upgrade the controller, or install its agent with {deploy}"
        return ""


def judge(agent: int | None, controller: int = CONTRACT) -> Compat:
    """How a module whose heartbeat says contract ``agent`` stands against this controller (pure).

    Unknown (no heartbeat, or one without a version): sent the controller's own version; whether it is up at all
    is the module's state's business, not this policy's."""
    if agent is None:
        return Compat(None, controller, "unknown", controller)
    if agent == controller:
        return Compat(agent, controller, "current", controller)
    if agent == controller - 1:
        return Compat(agent, controller, "behind", agent)
    if agent == controller + 1 and runs_request(controller, agent):
        return Compat(agent, controller, "ahead", controller)
    return Compat(agent, controller, "refused", None)


def refused_line(refused: Mapping[str, Compat], controller: int = CONTRACT, shown: int = 4) -> str:
    """One line: the modules that cannot run this controller's requests, and what to do (pure)."""
    names = sorted(refused)
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    listed = ", ".join(f"{m} (contract {refused[m].agent})" for m in names[:shown])
    deploy = f"`fleetctl deploy --devices {','.join(names)}`"
    behind = all(c.agent is not None and c.agent < controller for c in refused.values())
    todo = f"upgrade them with {deploy}" if behind else f"upgrade the controller, or install its agent with {deploy}"
    return (f"{listed}{more}: cannot run this controller's requests (contract {controller}; agents of contract "
            f"{controller - 1} to {controller + 1} can): {todo}, or leave them out with --devices; no run was created")


def request_for(payload: Mapping[str, Any], version: int,
                added: Mapping[int, tuple[str, ...]] = REQUEST_FIELDS_ADDED) -> dict[str, Any]:
    """A request's JSON as an agent of contract ``version`` reads it: its ``schema_version`` that version, the fields
    added after it dropped (ValueError naming the field when one is set: the older agent could not honour it)."""
    out = dict(payload)
    current = int(out.get("schema_version", CONTRACT))
    for v in range(version + 1, current + 1):
        for name in added.get(v, ()):
            value = out.pop(name, None)
            if value not in (None, "", (), [], {}):
                raise ValueError(f"request field {name} (contract {v}) is set; an agent of contract {version} "
                                 "cannot honour it")
    out["schema_version"] = version
    return out
