"""Parser for the result tables that SGLang-MUSA's ``run_tilelang_benchmark.sh`` prints.

Pure: text in, rows out. Handles every table shape of the reference document (the
no-prefix / shared-prefix sweep table, the MTP GSM8K table, the VL vision table) and
the ways such text gets mangled: CRLF, runs of spaces instead of tabs, reordered
columns, unknown extra columns (kept in ``extra``), missing optional columns. A table
that cannot be read raises :class:`TableError` naming the line. Rows whose figures break
the relations the seed obeys are kept but flagged, and so are figures no benchmark can
measure (``<metric>_invalid_zero``, ``_negative``, ``_inf``, ``_nan``: the report leaves
such a figure out) and a profile a table has twice (``duplicate_row`` on the later row).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from contract.records import ResultRow, TableKind

# header text (normalised: lower case, no blanks) -> (field, multiplier to the row's unit)
_COLUMNS: dict[str, tuple[str, float]] = {
    "model": ("model", 1),
    "size": ("size", 1),
    "prefilllen(tokens)": ("prefill_len", 1),
    "prefilllen(k)": ("prefill_len", 1000),
    "prefilllen": ("prefill_len", 1),
    "ctx(k)": ("ctx_k", 1),
    "batch": ("batch", 1),
    "nchip": ("nchip", 1),
    "input(tokens)": ("input_tokens", 1),
    "input(k)": ("input_tokens", 1000),
    "output(tokens)": ("output_tokens", 1),
    "output(k)": ("output_tokens", 1000),
    "prefill(tps)": ("prefill_tps", 1),
    "ttft(ms)": ("ttft_ms", 1),
    "decode(tps)": ("decode_tps", 1),
    "tpot(ms)": ("tpot_ms", 1),
    "profile": ("profile", 1),
    "prefix(tokens)": ("prefix_tokens", 1),
    "measuredoutput(tokens)": ("measured_output", 1),
    "promptindex": ("prompt_index", 1),
    "acceptrate((acclen-1)/(4-1))": ("accept_rate", 1),
    "acceptrate(acclen/4)": ("accept_rate_len", 1),
    "prediction": ("prediction", 1),
    "groundtruth": ("ground_truth", 1),
    "correct": ("correct", 1),
    "vision(fps)": ("vision_fps", 1),
    "precision": ("precision", 1),
}
# Multi-word headers, so that a header written with single spaces can still be split.
_MULTIWORD = sorted(
    ("Prompt Index", "accept rate((acclen-1)/(4-1))", "accept rate(acclen/4)", "Ground Truth"),
    key=len,
    reverse=True,
)
_INT = {"prefill_len", "batch", "nchip", "input_tokens", "output_tokens", "prefix_tokens", "measured_output",
        "prompt_index"}
_FLOAT = {"ctx_k", "prefill_tps", "ttft_ms", "decode_tps", "tpot_ms", "accept_rate", "accept_rate_len",
          "vision_fps"}
_TEXT = {"model", "size", "profile", "prediction", "ground_truth", "precision"}
_REQUIRED: dict[TableKind, tuple[str, ...]] = {
    "sweep": ("model", "input_tokens"),
    "mtp": ("model", "prompt_index"),
    "vision": ("model", "input_tokens", "vision_fps"),
}
_METRIC_FIELDS = ("prefill_tps", "ttft_ms", "decode_tps", "tpot_ms", "vision_fps", "accept_rate", "accept_rate_len")
_ZERO_ALLOWED = frozenset({"accept_rate"})  # (acclen-1)/(4-1) is 0 when no draft token was accepted
DUPLICATE = "duplicate_row"  # the row's profile came earlier in the same table

# Relative tolerance of the relation checks; the seed's own rows agree to < 0.1 %.
RELATION_TOLERANCE = 0.03


class TableError(ValueError):
    """A table that cannot be read. ``line`` is 1-based in the parsed text."""

    def __init__(self, message: str, line: int, source: str = "") -> None:
        self.line = line
        self.source = source
        where = f"{source}:{line}" if source else f"line {line}"
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True)
class Table:
    kind: TableKind
    # the header's line (1-based) and its original texts; the nearest non-table text line above it, if any
    header_line: int
    columns: tuple[str, ...]
    rows: tuple[ResultRow, ...]
    title: str = ""
    unknown_columns: tuple[str, ...] = field(default=())


def _norm(h: str) -> str:
    return re.sub(r"\s+", "", h).lower()


def _split(line: str) -> list[str]:
    if "\t" in line:
        return [c.strip() for c in line.split("\t")]
    return [c.strip() for c in re.split(r" {2,}", line.strip())]


def _split_header(line: str) -> list[str]:
    if "\t" in line:
        return _split(line)
    cells = _split(line)
    if all(_norm(c) in _COLUMNS for c in cells):
        return cells
    # single spaces between columns: protect the known multi-word names, then split on blanks
    text = line.strip()
    for i, name in enumerate(_MULTIWORD):
        text = text.replace(name, f"\x00{i}\x00")
    return [re.sub(r"\x00(\d+)\x00", lambda m: _MULTIWORD[int(m.group(1))], p) for p in text.split()]


def _is_header(line: str) -> bool:
    cells = _split_header(line)
    if not cells or _norm(cells[0]) != "model" and "model" not in {_norm(c) for c in cells}:
        return False
    known = sum(1 for c in cells if _norm(c) in _COLUMNS)
    return known >= 3


def _is_trailer(line: str, width: int) -> bool:
    """Plain text right under a table (no tabs, far fewer words than columns): the table ended."""
    return "\t" not in line and len(line.split()) < max(2, width // 2)


def _to_bool(text: str) -> bool:
    t = text.strip().lower()
    if t in ("true", "1", "yes", "y"):
        return True
    if t in ("false", "0", "no", "n"):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _kind(fields: set[str]) -> TableKind:
    if "prompt_index" in fields:
        return "mtp"
    if "vision_fps" in fields:
        return "vision"
    return "sweep"


def check_relations(row: ResultRow, tolerance: float = RELATION_TOLERANCE) -> tuple[str, ...]:
    """Relations the seed obeys: TTFT = prefill_len / prefill tok/s; TPOT = 1000 / decode tok/s."""
    flags: list[str] = []
    if row.ttft_ms and row.prefill_tps and row.prefill_len:
        expect = row.prefill_len / row.prefill_tps * 1000.0
        if abs(row.ttft_ms - expect) > tolerance * expect + 0.01:
            flags.append("ttft_vs_prefill")
    if row.tpot_ms and row.decode_tps:
        expect = 1000.0 / row.decode_tps
        if abs(row.tpot_ms - expect) > tolerance * expect + 0.01:
            flags.append("tpot_vs_decode")
    for name in _METRIC_FIELDS:
        why = figure_problem(getattr(row, name), zero_ok=name in _ZERO_ALLOWED)
        if why:
            flags.append(f"{name}_invalid_{why}")
    return tuple(flags)


def figure_problem(v: float | None, zero_ok: bool = False) -> str:
    """Why a measured figure cannot be (``nan``, ``inf``, ``negative``, ``zero``), or ``""``."""
    if v is None:
        return ""
    if v != v:
        return "nan"
    if v in (float("inf"), float("-inf")):
        return "inf"
    if v < 0:
        return "negative"
    return "zero" if v == 0 and not zero_ok else ""


def _row(kind: TableKind, fields: list[tuple[str, float] | None], headers: list[str], cells: list[str],
         lineno: int, source: str) -> ResultRow:
    values: dict[str, object] = {}
    extra: dict[str, str] = {}
    for spec, header, cell in zip(fields, headers, cells, strict=True):
        if spec is None:
            extra[header] = cell
            continue
        name, mult = spec
        if cell == "" or cell.lower() in ("-", "n/a", "na", "none"):
            continue
        try:
            if name in _INT:
                num = float(cell) * mult
                if abs(num - round(num)) > 1e-6:
                    raise ValueError(f"not a whole number: {cell!r}")
                values[name] = int(round(num))
            elif name in _FLOAT:
                values[name] = float(cell) * mult
            elif name == "correct":
                values[name] = _to_bool(cell)
            else:
                values[name] = cell
        except ValueError as exc:
            raise TableError(f"column {header!r}: {exc}", lineno, source) from exc
    for req in _REQUIRED[kind]:
        if req not in values:
            raise TableError(f"missing value for required column {req!r}", lineno, source)
    if kind == "mtp":
        values["profile"] = f"gsm8k:{values['prompt_index']}"
    elif kind == "vision":
        values["profile"] = f"vision:{values.get('prefill_len', values['input_tokens'])}:{values['input_tokens']}"
    elif "profile" not in values:
        values["profile"] = f"{values.get('prefill_len', values['input_tokens'])}:{values['input_tokens']}"
    if kind != "mtp" and "prefix_tokens" not in values and "prefill_len" in values:
        values["prefix_tokens"] = int(values["input_tokens"]) - int(values["prefill_len"])  # type: ignore[call-overload]
    row = ResultRow(table=kind, extra=extra, **values)  # type: ignore[arg-type]
    flags = check_relations(row)
    return row.model_copy(update={"flags": flags}) if flags else row


def parse_tables(text: str, source: str = "") -> list[Table]:
    """Every result table in ``text`` (benchmark stdout or the results file)."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    tables: list[Table] = []
    title = ""
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip():
            i += 1
            continue
        if not _is_header(line):
            title = line.strip()
            i += 1
            continue
        header_no = i + 1
        headers = _split_header(line)
        norms = [_norm(h) for h in headers]
        dup = {n for n in norms if norms.count(n) > 1 and n in _COLUMNS}
        if dup:
            raise TableError(f"duplicate column {sorted(dup)[0]!r} in header", header_no, source)
        specs = [_COLUMNS.get(n) for n in norms]
        kind = _kind({s[0] for s in specs if s})
        missing = [r for r in _REQUIRED[kind] if r not in {s[0] for s in specs if s}]
        if missing:
            raise TableError(f"{kind} table header lacks column {missing[0]!r}", header_no, source)
        rows: list[ResultRow] = []
        seen: set[str] = set()
        i += 1
        while i < len(lines) and lines[i].strip():
            if _is_header(lines[i]) or _is_trailer(lines[i], len(headers)):
                break
            cells = _split(lines[i])
            if len(cells) != len(headers) and "\t" not in lines[i]:
                cells = lines[i].split()
            while len(cells) > len(headers) and cells[-1] == "":
                cells.pop()
            if len(cells) != len(headers):
                raise TableError(
                    f"row has {len(cells)} cells, header has {len(headers)}", i + 1, source
                )
            row = _row(kind, specs, headers, cells, i + 1, source)
            if row.profile in seen:
                row = row.model_copy(update={"flags": (*row.flags, DUPLICATE)})
            seen.add(row.profile)
            rows.append(row)
            i += 1
        if not rows:
            raise TableError("table header with no rows", header_no, source)
        tables.append(Table(
            kind=kind, header_line=header_no, columns=tuple(headers), rows=tuple(rows), title=title,
            unknown_columns=tuple(h for h, s in zip(headers, specs, strict=True) if s is None),
        ))
        title = ""
    return tables


def parse_rows(text: str, source: str = "") -> list[ResultRow]:
    return [r for t in parse_tables(text, source) for r in t.rows]


def stamp(rows: Iterable[ResultRow], **ids: str) -> list[ResultRow]:
    """The same rows with run_id / module / release / model_key filled in."""
    return [r.model_copy(update=ids) for r in rows]


# Titles of the seed's reference tables -> model key (for importing the seed as a baseline).
SEED_TITLES: tuple[tuple[str, str], ...] = (
    ("Qwen3.5_FQ-35B-A3B (MoE GPTQ，GPTQ INT4 (W4A16)) 开启 MTP", "qwen35_fq_mtp"),
    ("Qwen3.5-35B-A3B-GPTQ-Int4 (MoE GPTQ，GPTQ INT4(W4A16)) 开启 MTP", "qwen35_mtp"),
    ("Qwen3.5_FQ-35B-A3B", "qwen35_fq"),
    ("Qwen3.6_FQ-35B-A3B", "qwen36_fq"),
    ("Qwen3.5-35B-A3B-GPTQ-Int4", "qwen35"),
    ("Qwen3-30B-A3B-GPTQ-Int4", "qwen3"),
    ("Qwen3-VL-8B", "qwen3vl"),
)


def seed_key_for(table: Table, previous_key: str | None) -> str:
    """Which model key a table of the reference document belongs to.

    The VL vision table follows the VL sweep table with no title of its own.
    """
    if table.kind == "vision" and not table.title:
        if previous_key is None:
            raise TableError("vision table without a model title", table.header_line)
        return previous_key
    for prefix, key in SEED_TITLES:
        if table.title.startswith(prefix):
            return key
    raise TableError(f"no model key for table titled {table.title!r}", table.header_line)


def parse_seed(text: str, source: str = "") -> dict[str, list[ResultRow]]:
    """The reference document's tables, keyed by model key, rows stamped with the key."""
    out: dict[str, list[ResultRow]] = {}
    prev: str | None = None
    for table in parse_tables(text, source):
        key = seed_key_for(table, prev)
        out.setdefault(key, []).extend(stamp(table.rows, model_key=key))
        prev = key
    return out
