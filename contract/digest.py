"""The seal of a run's final state: how many rows the module keeps for it and a digest of them.

Defined once, here: the agent seals the final state it publishes (:func:`seal`), the controller
checks what reached its history against that seal. The digest is over each row's canonical JSON
(``model_dump(mode="json")``, keys sorted, no spaces) in identity order, so it does not depend on
the order rows were stored, sent or read back in, nor on the transport (Redis, files, SQLite).

A seal is of one contract version (the final state's ``schema_version``: the version of the request it answers):
the fields later versions added (:data:`contract.compat.RECORD_FIELDS_ADDED`) are left out, so that a controller of
that version, which does not know them, computes the same digest; the controller checks at the lower of the seal's
version and its own (:func:`seal_version`, ADR 0051). Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel

from contract import compat
from contract.records import ResultRow, RunProgress

ALGORITHM = "sha256"


def canonical_json(value: Any) -> str:
    """One spelling of a JSON value: keys sorted, no whitespace, non-ASCII kept as is."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def versioned_dump(record: BaseModel, version: int | None = None,
                   added: Mapping[int, Mapping[str, tuple[str, ...]]] | None = None) -> dict[str, Any]:
    """``record``'s JSON as a reader of contract ``version`` knows it: the fields added after it
    (``added``, default :data:`contract.compat.RECORD_FIELDS_ADDED`) left out, in the records it holds too (None, or
    no field added since: the whole dump)."""
    dump = record.model_dump(mode="json")
    added = compat.RECORD_FIELDS_ADDED if added is None else added
    if version is None or all(v <= version for v in added):
        return dump
    return _known(record, dump, version, added)


def _known(record: BaseModel, dump: dict[str, Any], version: int, added: Mapping[int, Mapping[str, tuple[str, ...]]]
           ) -> dict[str, Any]:
    later = compat.fields_after(type(record).__name__, version, added)
    out: dict[str, Any] = {}
    for name, value in dump.items():
        if name in later:
            continue
        held = getattr(record, name, None)
        if isinstance(held, BaseModel):
            value = _known(held, value, version, added)
        elif isinstance(held, tuple | list) and all(isinstance(x, BaseModel) for x in held):
            value = [_known(x, v, version, added) for x, v in zip(held, value, strict=True)]
        elif isinstance(held, dict) and held and all(isinstance(x, BaseModel) for x in held.values()):
            value = {k: _known(held[k], value[k], version, added) for k in held}
        out[name] = value
    return out


def seal_version(p: RunProgress, controller: int = compat.CONTRACT) -> int:
    """The contract version a controller checks a final state's seal at: the lower of the seal's and its own."""
    return min(p.schema_version, controller)


def rows_digest(rows: Iterable[ResultRow], version: int | None = None) -> str:
    """``sha256:<hex>`` of the rows' canonical JSON lines in identity order (the same for any order of ``rows``),
    as a reader of contract ``version`` knows them (None: every field)."""
    lines = sorted((r.identity, canonical_json(versioned_dump(r, version))) for r in rows)
    h = hashlib.sha256()
    for _, line in lines:
        h.update(line.encode("utf-8"))
        h.update(b"\n")
    return f"{ALGORITHM}:{h.hexdigest()}"


def record_digest(record: BaseModel, version: int | None = None) -> str:
    """``sha256:<hex>`` of one record's canonical JSON (the telemetry summary a final state refers to), as a reader
    of contract ``version`` knows it."""
    text = canonical_json(versioned_dump(record, version))
    return f"{ALGORITHM}:{hashlib.sha256(text.encode('utf-8')).hexdigest()}"


def seal(p: RunProgress, rows: Iterable[ResultRow], version: int | None = None) -> RunProgress:
    """``p`` carrying the count and digest of ``rows`` (all the module keeps for the run: the release's and the
    probe's) and, when it carries a device telemetry summary, that summary's digest; ``version``: the contract
    version of the request it answers (its ``schema_version`` then; None: ``p``'s own)."""
    kept = list(rows)
    v = p.schema_version if version is None else version
    return p.model_copy(update={
        "schema_version": v, "stored_rows": len(kept), "rows_digest": rows_digest(kept, v),
        "telemetry_digest": record_digest(p.telemetry, v) if p.telemetry is not None else None})


def is_sealed(p: RunProgress) -> bool:
    return p.stored_rows is not None and p.rows_digest is not None
