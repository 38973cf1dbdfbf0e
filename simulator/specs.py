"""Knob specs for the demo and the CLI (pure)."""

from __future__ import annotations

import math

from simulator.runtime.core import MODEL_KEYS, SPEED_METRICS, SpecError, parse_speed

# The metrics as the reports name them (result columns) -> (speed metric, whether the column is a time):
# a time worse by F is its throughput slower by the factor 1 / (1 + F), a throughput worse by F is 1 - F.
REPORT_METRICS: dict[str, tuple[str, bool]] = {
    "prefill_tps": ("prefill", False), "ttft_ms": ("prefill", True),
    "decode_tps": ("decode", False), "tpot_ms": ("decode", True),
    "accept_rate": ("accept", False), "accept_rate_len": ("accept", False),
    "vision_fps": ("vision", False),
    "server_ready_s": ("load", True),
}


def _known_metrics() -> str:
    return f"{', '.join(SPEED_METRICS)}, or as the reports name them: {', '.join(REPORT_METRICS)}"


def regress_spec(text: str) -> str:
    """``MODEL_KEY:METRIC:FRACTION`` (the demo's ``--regress``) -> speed spec ``KEY:METRIC=1-FRACTION``.

    ``qwen3:decode:0.08`` -> ``qwen3:decode=0.92`` (decode tok/s 8 % lower). KEY ``all`` or
    ``*`` means every model key. METRIC is a speed metric (``prefill``, ``decode``, ``accept``,
    ``vision``, ``all``) or a report's column for one (:data:`REPORT_METRICS`): ``decode_tps``
    is ``decode``; ``tpot_ms:0.08`` (TPOT 8 % longer) is ``decode`` at 1/1.08.
    """
    parts = [p.strip() for p in text.split(":")]
    if len(parts) != 3:
        raise SpecError(f"regression {text!r}: expected MODEL_KEY:METRIC:FRACTION, e.g. qwen3:decode_tps:0.08")
    key, metric, frac_text = parts
    if key not in MODEL_KEYS and key not in ("all", "*"):
        raise SpecError(f"regression {text!r}: unknown model key {key!r} (known: {', '.join(MODEL_KEYS)}, all)")
    if metric not in SPEED_METRICS and metric not in REPORT_METRICS:
        raise SpecError(f"regression {text!r}: unknown metric {metric!r} (known: {_known_metrics()})")
    try:
        frac = float(frac_text)
    except ValueError:
        raise SpecError(f"regression {text!r}: fraction {frac_text!r} is not a number") from None
    if not 0.0 <= frac < 1.0:
        raise SpecError(f"regression {text!r}: fraction must be in [0, 1) (0.08: 8 % worse)")
    speed_metric, is_time = REPORT_METRICS.get(metric, (metric, False))
    factor = format(round(1.0 / (1.0 + frac) if is_time else 1.0 - frac, 6), "g")
    spec = f"{speed_metric}={factor}" if key in ("all", "*") else f"{key}:{speed_metric}={factor}"
    parse_speed(spec)  # the result is always a valid speed spec
    return spec


def slow_factor(value: float) -> float:
    """The demo's ``--slow F`` (one module F times slower), checked: a finite factor above 1."""
    if not (math.isfinite(value) and value > 1.0):
        raise SpecError(f"--slow {value:g}: expected a factor above 1 (1.12: one module 12 % slower)")
    return value
