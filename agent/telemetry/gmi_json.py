"""Pure parser of ``mthreads-gmi --query --json``: the published shape to readings, driver and firmware.

The shape (``tests/fixtures/mthreads/query-json-s5000.json``, real output of an S5000 host): the driver
version at the top level, a ``"GPU"`` list whose items nest sections as ``-q`` prints them
(``"FB Memory Usage": {"Total": "81920MiB"}``, ``"Power Readings": {"Power Draw ": "96.66W"}``), every value a
string with its unit inside. Keys are matched as ``-q`` labels are (blanks collapsed, any case: the trailing
space of ``"Power Draw "`` is neither needed nor in the way), so each field is read at its ``-q`` paths
(:data:`agent.telemetry.fields.FIELDS`); a key missing on one card, or ``"N/A"``, reads as absent for that
field only. Anything else (not JSON, no ``"GPU"`` list) raises :class:`NotGmiJson`: the sampler then falls
back to the query CSV and ``-q``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from agent.telemetry.parse import Reading, convert, entries_reading, norm
from contract.vocab import BadInput

JSON_FLAGS = ("--query", "--json")  # what the published sample was produced with (its README)

Entries = list[tuple[tuple[str, ...], str]]


class NotGmiJson(BadInput):
    """The tool's answer is not ``--json`` output with a ``"GPU"`` list (the message says what it was)."""


@dataclass(frozen=True)
class GmiJson:
    """One answer: a reading per card, the driver (top level) and each card's firmware (``MTBios Version``)."""

    readings: tuple[Reading, ...]
    driver: str | None = None
    firmware: Mapping[int, str] = field(default_factory=dict)


def flatten(obj: object, path: tuple[str, ...] = ()) -> Entries:
    """(path of normalised keys, value) for every scalar under ``obj``, in document order (lists: each item)."""
    if isinstance(obj, Mapping):
        return [e for k, v in obj.items() for e in flatten(v, path + (norm(str(k)),))]
    if isinstance(obj, list):
        return [e for v in obj for e in flatten(v, path)]
    if obj is None or isinstance(obj, bool):
        return []
    return [(path, str(obj))]


def _text(card: Mapping[str, object], key: str) -> str | None:
    for k, v in card.items():
        if norm(str(k)) == key:
            got = convert(str(v), "text") if isinstance(v, str | int | float) and not isinstance(v, bool) else None
            return got if isinstance(got, str) else None
    return None


def parse_json(text: str, names: Sequence[str] | None = None) -> GmiJson:
    """``--json`` output -> one reading per item of its ``"GPU"`` list (numbered by ``"Index"``, else in order).

    ``names`` limits the fields read (default: every field with a ``-q`` path).
    """
    try:
        doc = json.loads(text)
    except ValueError as exc:
        first = text.strip().splitlines()[0][:80] if text.strip() else "nothing"
        raise NotGmiJson(f"not JSON ({exc.__class__.__name__}): {first!r}") from exc
    cards = next((v for k, v in doc.items() if norm(str(k)) == "gpu"), None) if isinstance(doc, dict) else None
    if isinstance(cards, Mapping):  # one card, printed as an object
        cards = [cards]
    if not isinstance(cards, list) or not cards or not all(isinstance(c, Mapping) for c in cards):
        raise NotGmiJson('JSON without a "GPU" list of cards')
    readings: list[Reading] = []
    firmware: dict[int, str] = {}
    used: set[int] = set()
    for position, card in enumerate(cards):
        index = convert(_text(card, "index") or "", "int")
        gpu = index if isinstance(index, int) and index not in used else position
        used.add(gpu)
        readings.append(entries_reading(gpu, flatten(card), names))
        bios = _text(card, "mtbios version")
        if bios:
            firmware[gpu] = bios
    return GmiJson(tuple(readings), _text(doc, "driver version"), firmware)
