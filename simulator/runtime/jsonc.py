"""JSON read and written as ``json.loads`` / ``json.dumps`` do, by the same C scanner and encoder (``_json``).

Importing ``json`` compiles the regular expressions of its decoder and encoder at import (``re``, with
``enum``, ``functools``, ``collections``): ~5 ms of CPU at the start of every interpreter the release's
scripts start, before the first thing it does, on every simulated module (100 cheap modules start at
once on 2 cores). The C scanner and encoder ``json`` itself uses need none of that. Results and errors
are those of ``json`` (``json.JSONDecodeError``, imported only when raised); without ``_json``
(another Python implementation) these are ``json.loads`` / ``json.dumps`` themselves.
Standard library only.
Kept by decision record docs/adr/0005-simulator-stand-ins.md (json measured beside it).
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_str: Any = None
_make_encoder: Any = None
_make_scanner: Any = None
try:
    from _json import encode_basestring_ascii as _str
    from _json import make_encoder as _make_encoder
    from _json import make_scanner as _make_scanner
except ImportError:  # pragma: no cover - CPython has it
    pass

_WS = " \t\n\r"  # json's whitespace


class _Decoder:
    """What ``_json.make_scanner`` reads from a ``json.JSONDecoder``: its defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}.__getitem__


_scan = _make_scanner(_Decoder()) if _make_scanner is not None else None


def _error(msg: str, doc: str, pos: int) -> ValueError:
    from json import JSONDecodeError  # only on malformed input

    return JSONDecodeError(msg, doc, pos)


def loads(data: str | bytes) -> Any:
    """``json.loads(data)``."""
    if isinstance(data, (bytes, bytearray)):
        if _scan is None or data[:1] in (b"\xef", b"\xfe", b"\xff") or b"\x00" in data[:4]:
            import json  # a BOM or UTF-16/32: json's own encoding detection

            return json.loads(data)
        data = data.decode("utf-8", "surrogatepass")
    if _scan is None or not isinstance(data, str):
        import json

        return json.loads(data)
    if data.startswith("\ufeff"):
        raise _error("Unexpected UTF-8 BOM (decode using utf-8-sig)", data, 0)
    end = len(data)
    pos = end - len(data.lstrip(_WS))
    try:
        obj, pos = _scan(data, pos)
    except StopIteration as exc:
        raise _error("Expecting value", data, exc.value) from None
    except (ValueError, SystemError):  # malformed inside: json's own error (the C scanner of 3.10 and 3.11
        import json  # raises it only once json.decoder is loaded, else a SystemError)

        return json.loads(data)
    if pos != end:
        pos = end - len(data[pos:].lstrip(_WS))
        if pos != end:
            raise _error("Extra data", data, pos)
    return obj


def _fail(obj: object) -> Any:
    raise TypeError(f"Object of type {obj.__class__.__name__} is not JSON serializable")


def dumps(obj: Any, *, indent: int | None = None, separators: tuple[str, str] | None = None) -> str:
    """``json.dumps(obj, indent=indent, separators=separators)`` (ensure_ascii, check_circular, allow_nan)."""
    if _make_encoder is None:
        import json

        return json.dumps(obj, indent=indent, separators=separators)
    item, key = separators or ((", ", ": ") if indent is None else (",", ": "))
    if indent is None:
        if isinstance(obj, str):
            return _str(obj)
        return "".join(_make_encoder({}, _fail, _str, None, key, item, False, False, True)(obj, 0))
    leaf = _make_encoder({}, _fail, _str, None, key, item, False, False, True)
    out: list[str] = []
    _pretty(obj, 0, " " * indent, item, key, leaf, set(), out)
    return "".join(out)


def _pretty(obj: Any, level: int, indent: str, item: str, key: str, leaf: Any, seen: set[int],
            out: list[str]) -> None:
    """json's indented layout (``json.encoder._make_iterencode``) for dicts and lists; leaves by the C encoder."""
    if isinstance(obj, (list, tuple, dict)):
        if not obj:
            out.append("{}" if isinstance(obj, dict) else "[]")
            return
        if id(obj) in seen:
            raise ValueError("Circular reference detected")
        seen.add(id(obj))
        inner = "\n" + indent * (level + 1)
        sep = item + inner
        if isinstance(obj, dict):
            out.append("{" + inner)
            for i, (k, v) in enumerate(obj.items()):
                if i:
                    out.append(sep)
                out.append(_key(k, leaf) + key)
                _pretty(v, level + 1, indent, item, key, leaf, seen, out)
            out.append("\n" + indent * level + "}")
        else:
            out.append("[" + inner)
            for i, v in enumerate(obj):
                if i:
                    out.append(sep)
                _pretty(v, level + 1, indent, item, key, leaf, seen, out)
            out.append("\n" + indent * level + "]")
        seen.discard(id(obj))
        return
    out.extend(leaf(obj, level))


def _key(k: Any, leaf: Any) -> str:
    """A dict key as json writes it: strings as such, numbers, booleans and None as their JSON text in quotes."""
    if isinstance(k, str):
        return _str(k)
    if isinstance(k, (bool, int, float)) or k is None:
        return _str("".join(leaf(k, 0)))
    raise TypeError(f"keys must be str, int, float, bool or None, not {k.__class__.__name__}")
