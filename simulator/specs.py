"""Knob specs for the demo and the CLI (pure)."""

from __future__ import annotations

from simulator.runtime.core import MODEL_KEYS, SPEED_METRICS, SpecError, parse_speed


def regress_spec(text: str) -> str:
    """``MODEL_KEY:METRIC:FRACTION`` (the demo's ``--regress``) -> speed spec ``KEY:METRIC=1-FRACTION``.

    ``qwen3:decode:0.08`` -> ``qwen3:decode=0.92`` (decode tok/s 8 % lower). KEY ``all`` or
    ``*`` means every model key.
    """
    parts = [p.strip() for p in text.split(":")]
    if len(parts) != 3:
        raise SpecError(f"regression {text!r}: expected MODEL_KEY:METRIC:FRACTION, e.g. qwen3:decode:0.08")
    key, metric, frac_text = parts
    if key not in MODEL_KEYS and key not in ("all", "*"):
        raise SpecError(f"regression {text!r}: unknown model key {key!r} (known: {', '.join(MODEL_KEYS)})")
    if metric not in SPEED_METRICS:
        raise SpecError(f"regression {text!r}: unknown metric {metric!r} (known: {', '.join(SPEED_METRICS)})")
    try:
        frac = float(frac_text)
    except ValueError:
        raise SpecError(f"regression {text!r}: fraction {frac_text!r} is not a number") from None
    if not 0.0 <= frac < 1.0:
        raise SpecError(f"regression {text!r}: fraction must be in [0, 1)")
    factor = format(round(1.0 - frac, 6), "g")
    spec = f"{metric}={factor}" if key in ("all", "*") else f"{key}:{metric}={factor}"
    parse_speed(spec)  # the result is always a valid speed spec
    return spec
