"""``fleetctl prometheus-targets``: Prometheus file_sd targets from the inventory.

One target group per module: ``host:metrics_port`` with labels ``module`` and the module's
inventory labels. Prometheus re-reads the file when it changes, so the file is replaced
atomically (write, then rename) and never read half-written.

Lazy imports: :func:`file_sd` imports :mod:`controller.inventory` (pydantic) when it runs: ``fleetctl --help``
imports this module with every verb's and costs ~0.14 s of CPU in all (``bench/cli.py``:
bench/results/cli_20261207_0057_defer-plugins.txt).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from contract.files import write_atomic
from controller.cli.invocation import session

if TYPE_CHECKING:
    from controller.inventory import Inventory, Module

TARGETS_FILE = "agents.json"
RESERVED_LABELS = frozenset({"module", "job", "instance"})


def target(m: Module) -> str:
    host = f"[{m.host}]" if ":" in m.host and not m.host.startswith("[") else m.host
    return f"{host}:{m.metrics_port}"


def file_sd(inventory: Inventory) -> list[dict[str, Any]]:
    """Pure: the file_sd JSON document for an inventory."""
    from controller.inventory import InventoryError

    groups: list[dict[str, Any]] = []
    for m in inventory.modules:
        bad = sorted(k for k in m.labels if k in RESERVED_LABELS or k.startswith("__"))
        if bad:
            raise InventoryError(f"{inventory.path}: module {m.name!r}: field 'labels': label name {bad[0]!r} is"
                                 " reserved for Prometheus targets")
        groups.append({"targets": [target(m)], "labels": {"module": m.name, **dict(sorted(m.labels.items()))}})
    return groups


def prometheus_targets(
    ctx: typer.Context,
    out: Path | None = typer.Option(None, "--out",
                                    help=f"folder to write {TARGETS_FILE} into (atomically); default stdout"),
) -> None:
    """Prometheus file_sd targets of every module (host:metrics_port, labels module + inventory labels)."""
    text = json.dumps(file_sd(session(ctx).inventory()), indent=2) + "\n"
    if out is None:
        sys.stdout.write(text)
    else:
        write_atomic(out / TARGETS_FILE, text, mode=0o644)  # readable by Prometheus
