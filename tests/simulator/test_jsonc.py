"""Fast tier: the release's JSON (``m1000_sim.jsonc``, the C scanner and encoder without importing json) reads and
writes exactly what ``json.loads`` / ``json.dumps`` do, errors included, also in an interpreter without json."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.build import RUNTIME_DIR
from simulator.runtime import jsonc

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text()
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
                      | st.dictionaries(st.text(max_size=5) | st.integers() | st.floats() | st.booleans() | st.none(),
                                        inner, max_size=4), max_leaves=20)
LAYOUTS: tuple[dict[str, Any], ...] = ({}, {"indent": 2}, {"separators": (",", ":")}, {"indent": 0},
                                       {"indent": 1, "separators": (",", ":")})


@pytest.mark.slow  # 300 examples of nested JSON: 1.4-2.8 s, over the fast tier's budget of 2 s CPU
@settings(max_examples=300, deadline=None)
@given(values)
def test_dumps_and_loads_are_json_s(value: object) -> None:
    for kw in LAYOUTS:
        text = json.dumps(value, **kw)
        assert jsonc.dumps(value, **kw) == text, kw
        assert repr(jsonc.loads(text)) == repr(json.loads(text))
        assert repr(jsonc.loads(text.encode())) == repr(json.loads(text.encode()))


def _outcome(fn: Callable[..., object], arg: object) -> tuple[str, str]:
    try:
        return "ok", repr(fn(arg))
    except (ValueError, TypeError) as exc:
        return type(exc).__name__, str(exc)


MALFORMED = ["", " ", "{bad", "[1,]", '{"a": 1} x', '{"a": 1}}', "\ufeff{}", "nul", "[1e400]", '"\\ud800"', "01",
             '{"a" 1}', "[", '"\x01"', " [1, 2] \n", b'{"a": 1}', b"\xef\xbb\xbf{}", '{"a": 1}'.encode("utf-16"),
             b"\xff", b"[1] 2"]


@pytest.mark.parametrize("text", MALFORMED)
def test_malformed_and_odd_input_as_json(text: str | bytes) -> None:
    assert _outcome(jsonc.loads, text) == _outcome(json.loads, text)


@pytest.mark.parametrize("value", [{1j: 1}, {"a": object()}, [set()], {(1, 2): 3}])
def test_unserializable_as_json(value: object) -> None:
    for kw in LAYOUTS:
        assert (_outcome(lambda v, kw=kw: jsonc.dumps(v, **kw), value)
                == _outcome(lambda v, kw=kw: json.dumps(v, **kw), value))


def test_circular_as_json() -> None:
    loop: list[object] = []
    loop.append(loop)
    for kw in LAYOUTS:
        with pytest.raises(ValueError, match="Circular reference detected"):
            jsonc.dumps(loop, **kw)


def test_errors_in_an_interpreter_without_json() -> None:
    """The C scanner of 3.10/3.11 raises json's error only when json.decoder is loaded: what a release program sees."""
    code = ("import sys, jsonc\nassert 'json' not in sys.modules\nprint(repr(jsonc.loads(' {\"a\": [1, 2.5]} ')))\n"
            "try:\n    jsonc.loads('{\"a\": [1,]}')\nexcept ValueError as e:\n    print(type(e).__name__, e)\n")
    out = subprocess.run([sys.executable, "-S", "-c", code], env={"PYTHONPATH": str(RUNTIME_DIR)},
                         capture_output=True, text=True, timeout=60, check=True).stdout.splitlines()
    assert out == ["{'a': [1, 2.5]}", "JSONDecodeError Expecting value: line 1 column 10 (char 9)"]
