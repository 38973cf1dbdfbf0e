"""Hand-made and recorded SSE streams for the probe's tests."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agent.probe.measure import Exchange
from agent.probe.records import ErrorKind

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "h200"


def event(obj: Any) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


def chat(content: str | None = None, *, role: bool = False, finish: str | None = None,
         usage: dict[str, Any] | None = None, choices: bool = True) -> bytes:
    delta: dict[str, Any] = {}
    if role:
        delta["role"] = "assistant"
    if content is not None:
        delta["content"] = content
    obj: dict[str, Any] = {"object": "chat.completion.chunk",
                           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}] if choices else []}
    if usage is not None:
        obj["usage"] = usage
    return event(obj)


def text(t: str, *, tokens: int | None = None, finish: str | None = None) -> bytes:
    obj: dict[str, Any] = {"object": "text_completion", "choices": [{"index": 0, "text": t, "finish_reason": finish}]}
    if tokens is not None:
        obj["usage"] = {"prompt_tokens": 128, "completion_tokens": tokens, "total_tokens": 128 + tokens}
    return event(obj)


def exchange(reads: Sequence[tuple[float, bytes]], end_ms: float, status: int | None = 200,
             error: ErrorKind | None = None, detail: str = "") -> Exchange:
    """An exchange whose reads arrive ``ms`` after the send instant."""
    return Exchange(status=status, reads=[(round(ms * 1e6), data) for ms, data in reads], end_ns=round(end_ms * 1e6),
                    error=error, detail=detail)


def recorded() -> dict[str, list[bytes]]:
    """The recorded transformers-serve streams: section name -> the raw bytes of each event."""
    out: dict[str, list[bytes]] = {}
    current: list[bytes] = []
    for line in (FIXTURES / "transformers-serve-sse.txt").read_bytes().split(b"\n"):
        if line.startswith(b"== "):
            current = out.setdefault(line[3:].decode().strip(), [])
        elif line.startswith(b"data:"):
            current.append(line + b"\n\n")
    return out


def peers() -> list[dict[str, float]]:
    lines = (FIXTURES / "peer-measurements.jsonl").read_text().splitlines()
    return [json.loads(x) for x in lines if x.strip()]
