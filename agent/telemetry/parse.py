"""Pure parsers of the device tool's output: ``--query-gpu`` CSV, ``-q`` text, error messages.

Nothing here runs a process. A value the tool does not have (``N/A``, ``[N/A]``,
``[Not Supported]``, ``[Unknown Error]``, empty) reads as absent for that field only; the
rest of the row is kept. Columns are mapped by position (the header, when there is one,
does not repeat the names asked for: ``clocks.sm`` comes back as ``clocks.current.sm
[MHz]``), and units are stripped whether or not ``nounits`` was honoured.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from agent.telemetry.fields import BY_NAME, FIELDS, REASONS, FieldSpec

Value = float | int | str

_ABSENT = {"", "n/a", "[n/a]", "not supported", "[not supported]", "unknown error", "[unknown error]",
           "not available", "[not available]", "unavailable", "[unavailable]", "[gpu is lost]", "gpu is lost",
           "insufficient permissions", "[insufficient permissions]"}
_NUMBER = re.compile(r"^([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s*([A-Za-z%/°]*)$")
_INVALID = re.compile(r'Field\s+"([^"]+)"\s+is\s+not\s+a\s+valid\s+field', re.IGNORECASE)
_GPU_HEADER = re.compile(r"^GPU(?:\s+\S+|\d+\S*)\s*$")


@dataclass(frozen=True)
class Reading:
    """One device in one answer of the tool: identity, the values it had, the fields it lacked."""

    gpu: int
    name: str | None = None
    uuid: str | None = None
    values: Mapping[str, float | int] = field(default_factory=dict)
    absent: frozenset[str] = frozenset()  # asked for, answered N/A / [Not Supported] / ...

    def merged(self, other: Reading, names: frozenset[str]) -> Reading:
        """This reading with ``names`` taken from ``other`` where it has them."""
        got = {k: v for k, v in other.values.items() if k in names}
        if not got:
            return self
        return Reading(self.gpu, self.name or other.name, self.uuid or other.uuid, {**self.values, **got},
                       self.absent - frozenset(got))


def convert(raw: str, kind: str) -> Value | None:
    """One cell: None when the tool has no value; units stripped; bitmasks from hex."""
    text = raw.strip().strip('"').strip()
    if text.lower() in _ABSENT:
        return None
    if kind == "text":
        return text
    if kind == "bitmask":
        try:
            return int(text, 16) if text.lower().startswith("0x") else int(text)
        except ValueError:
            return None
    m = _NUMBER.match(text)
    if not m:
        return None
    number = float(m.group(1))
    if kind == "int":
        return int(number)
    return number


def _rows(text: str) -> Iterator[list[str]]:
    for cells in csv.reader(line for line in text.replace("\r\n", "\n").split("\n") if line.strip()):
        yield [c.strip() for c in cells]


def parse_csv(text: str, columns: Sequence[FieldSpec]) -> tuple[Reading, ...]:
    """``--query-gpu`` output (``csv``, with or without header / units) -> one reading per device row.

    ``columns`` are the fields in the order asked. With a ``gpu`` (``index``) column, a row whose
    index is not a number is the header; without one, devices are numbered in row order and a
    row with no number at all is the header. Rows of the wrong width are skipped.
    """
    at = next((i for i, c in enumerate(columns) if c.name == "gpu"), None)
    numeric = [i for i, c in enumerate(columns) if c.kind in ("int", "float", "bitmask")]
    out: list[Reading] = []
    for cells in _rows(text):
        if len(cells) != len(columns):
            continue
        gpu = convert(cells[at], "int") if at is not None else len(out)
        if not isinstance(gpu, int) or (at is None and not any(
                convert(cells[i], columns[i].kind) is not None for i in numeric)):
            continue  # a header row
        values: dict[str, float | int] = {}
        absent: set[str] = set()
        texts: dict[str, str] = {}
        for i, (spec, cell) in enumerate(zip(columns, cells, strict=True)):
            if i == at:
                continue
            v = convert(cell, spec.kind)
            if spec.kind == "text":
                if isinstance(v, str):
                    texts[spec.name] = v
            elif v is None or isinstance(v, str):
                absent.add(spec.name)
            else:
                values[spec.name] = v
        out.append(Reading(gpu, texts.get("name"), texts.get("uuid"), values, frozenset(absent)))
    return tuple(out)


def invalid_field(text: str) -> str | None:
    """The query name a tool refused (``Field "x" is not a valid field to query.``), if any."""
    m = _INVALID.search(text)
    return m.group(1) if m else None


# -- -q text ---------------------------------------------------------------------------------
def norm(label: str) -> str:
    """A label as paths match it: blanks collapsed (``"Power Draw "`` is ``"power draw"``), lower case."""
    return " ".join(label.split()).lower()


def q_entries(block: Sequence[str]) -> list[tuple[tuple[str, ...], str]]:
    """(path of normalised labels, value) for every ``label : value`` line of one device's block.

    A line's parents are the less indented lines above it, with or without values of their own
    (``HW Slowdown : Not Active`` is the parent of ``HW Thermal Slowdown``).
    """
    stack: list[tuple[int, str]] = []
    out: list[tuple[tuple[str, ...], str]] = []
    for line in block:
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip(" \t"))
        label, sep, value = line.strip().partition(":")
        while stack and stack[-1][0] >= indent:
            stack.pop()
        name = norm(label)
        if sep and value.strip():
            out.append((tuple(n for _, n in stack) + (name,), value.strip()))
        stack.append((indent, name))
    return out


def _q_blocks(text: str) -> list[list[str]]:
    """The indented lines under each ``GPU <bus id>`` (or ``GPU0``) line at the left margin."""
    blocks: list[list[str]] = []
    current: list[str] | None = None
    for line in text.replace("\r\n", "\n").split("\n"):
        if not line.strip():
            continue
        if line[:1] not in (" ", "\t"):
            current = [] if _GPU_HEADER.match(line.strip()) else None
            if current is not None:
                blocks.append(current)
        elif current is not None:
            current.append(line)
    return blocks


def _q_value(entries: list[tuple[tuple[str, ...], str]], spec: FieldSpec) -> Value | None:
    if spec.kind == "bitmask":
        return _q_reasons(entries, spec)
    if spec.name == "ecc_uncorrected":
        return _q_ecc(entries, spec)
    wanted = [tuple(norm(p) for p in path) for path in spec.q_paths]
    # the first occurrence of a path is what -q means (later ones are repeats)
    index = dict(entries)
    for path in wanted:
        if path in index:
            v = convert(index[path], spec.kind)
            if v is not None:
                return v
    return None


def _q_reasons(entries: list[tuple[tuple[str, ...], str]], spec: FieldSpec) -> int | None:
    prefixes = [tuple(norm(p) for p in path) for path in spec.q_paths]
    labels = {norm(label): bit for bit, _, label in REASONS}
    mask, seen = 0, False
    for path, value in entries:
        if not any(path[: len(p)] == p and len(path) > len(p) for p in prefixes):
            continue
        bit = labels.get(path[-1])
        if bit is None:
            continue
        seen = True
        if norm(value) == "active":
            mask |= bit
    return mask if seen else None


def _q_ecc(entries: list[tuple[tuple[str, ...], str]], spec: FieldSpec) -> int | None:
    prefixes = [tuple(norm(p) for p in path) for path in spec.q_paths]
    total, seen = 0, False
    for path, value in entries:
        if not any(path[: len(p)] == p for p in prefixes):
            continue
        if "uncorrectable" in path[-1] or ("double bit" in path and path[-1] == "total"):
            v = convert(value, "int")
            if isinstance(v, int):
                total += v
                seen = True
    return total if seen else None


def parse_q(text: str, names: Sequence[str] | None = None) -> tuple[Reading, ...]:
    """``-q`` text -> one reading per device block (devices numbered in the order printed).

    ``names`` limits the fields read (default: every field with a ``-q`` path).
    """
    return tuple(entries_reading(i, q_entries(block), names) for i, block in enumerate(_q_blocks(text)))


def entries_reading(gpu: int, entries: list[tuple[tuple[str, ...], str]],
                    names: Sequence[str] | None = None) -> Reading:
    """One device's reading from its (path of normalised labels, value) entries, read at each field's ``-q``
    paths (``-q`` text and ``--json`` name their fields alike). ``names`` limits the fields read."""
    specs = [BY_NAME[n] for n in names] if names is not None else [f for f in FIELDS if f.q_paths]
    values: dict[str, float | int] = {}
    absent: set[str] = set()
    name = uuid = None
    for spec in specs:
        if not spec.q_paths:
            continue
        v = _q_value(entries, spec)
        if spec.name == "name":
            name = v if isinstance(v, str) else None
        elif spec.name == "uuid":
            uuid = v if isinstance(v, str) else None
        elif v is None or isinstance(v, str):
            absent.add(spec.name)
        else:
            values[spec.name] = v
    return Reading(gpu, name, uuid, values, frozenset(absent))
