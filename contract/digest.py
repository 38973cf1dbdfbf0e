"""The seal of a run's final state: how many rows the module keeps for it and a digest of them.

Defined once, here: the agent seals the final state it publishes (:func:`seal`), the controller
checks what reached its history against that seal. The digest is over each row's canonical JSON
(``model_dump(mode="json")``, keys sorted, no spaces) in identity order, so it does not depend on
the order rows were stored, sent or read back in, nor on the transport (Redis, files, SQLite).
Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel

from contract.records import ResultRow, RunProgress

ALGORITHM = "sha256"


def canonical_json(value: Any) -> str:
    """One spelling of a JSON value: keys sorted, no whitespace, non-ASCII kept as is."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def rows_digest(rows: Iterable[ResultRow]) -> str:
    """``sha256:<hex>`` of the rows' canonical JSON lines in identity order (the same for any order of ``rows``)."""
    lines = sorted((r.identity, canonical_json(r.model_dump(mode="json"))) for r in rows)
    h = hashlib.sha256()
    for _, line in lines:
        h.update(line.encode("utf-8"))
        h.update(b"\n")
    return f"{ALGORITHM}:{h.hexdigest()}"


def record_digest(record: BaseModel) -> str:
    """``sha256:<hex>`` of one record's canonical JSON (the telemetry summary a final state refers to)."""
    return f"{ALGORITHM}:{hashlib.sha256(canonical_json(record.model_dump(mode='json')).encode('utf-8')).hexdigest()}"


def seal(p: RunProgress, rows: Iterable[ResultRow]) -> RunProgress:
    """``p`` carrying the count and digest of ``rows`` (all the module keeps for the run: the release's and the
    probe's) and, when it carries a device telemetry summary, that summary's digest."""
    kept = list(rows)
    return p.model_copy(update={
        "stored_rows": len(kept), "rows_digest": rows_digest(kept),
        "telemetry_digest": record_digest(p.telemetry) if p.telemetry is not None else None})


def is_sealed(p: RunProgress) -> bool:
    return p.stored_rows is not None and p.rows_digest is not None
