"""Profiles and request bodies of the probe (pure).

A profile is the seed's ``prefill_len:input_len``: ``input_len`` tokens of prompt, of
which the first ``input_len - prefill_len`` are a prefix shared by every request of the
profile (warmed first by a request that is not measured, as the seed's tables do) and the
last ``prefill_len`` are new to each request. ``128:128`` has no shared prefix.

``/v1/completions`` prompts are drawn as token ids (ids in ``[1000, 30000)``, valid in any vocabulary of at
least 30000) and sent as **text** by default, as sglang ``bench_serving``'s completions backend and the
release's own benchmark send them (tokenizing the prompt is part of a client's TTFT): the server's
``/detokenize`` writes the ids as text where it has one (sglang, vLLM, llama-server), else each id goes as
the word ``w<id>`` (one token each on word-level vocabularies: the simulator's, the llama.cpp release's
models). ``prompt="ids"`` sends the ids themselves (the server skips tokenizing). The mode is labelled in
the results (:data:`PromptMode`). ``/v1/chat/completions`` prompts are words in one text part plus
``images`` ``image_url`` parts (a 1x1 PNG as a data URL). With text the prompt's token count is the
server's tokenizer's business: the server's ``usage.prompt_tokens`` is reported.

Prompts are salted per run (cold by default: a server's prefix cache holds nothing of them).

Engine-specific fields (sglang's ``ignore_eos``, ``stream_options`` with
``continuous_usage_stats``) are added only while the server accepts them. A server that takes no
token ids (llama-server with a vision projector loaded answers 400 ``type must be string, but is
array``) gets the same prompts as text, each id written as the word ``w<id>``, for the rest of the run.
"""

from __future__ import annotations

import json
import random
from typing import Any, NamedTuple

from agent.probe.records import Api
from agent.probe.records import PromptKind as PromptKind
from agent.probe.records import PromptMode as PromptMode

ENGINE_FIELDS = ("ignore_eos", "stream_options")
PNG_1X1 = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQ"
           "AAAABJRU5ErkJggg==")
ID_LO, ID_HI = 1000, 30000


class Profile(NamedTuple):
    name: str
    prefill_len: int  # new tokens per request
    input_len: int  # whole prompt

    @property
    def prefix_len(self) -> int:
        return self.input_len - self.prefill_len


def parse_profile(text: str) -> Profile:
    """``"250:16000"`` -> Profile (prefill 250 new tokens after a 15750-token shared prefix)."""
    parts = text.strip().split(":")
    if len(parts) != 2 or not all(p.strip().isdigit() for p in parts):
        raise ValueError(f"profile {text.strip()!r}: expected prefill_len:input_len, e.g. 128:128 or 250:16000")
    new, total = (int(p) for p in parts)
    if new < 1 or total < new:
        raise ValueError(f"profile {text.strip()!r}: need 1 <= prefill_len <= input_len")
    return Profile(f"{new}:{total}", new, total)


def parse_profiles(text: str | tuple[str, ...] | list[str]) -> tuple[Profile, ...]:
    items = text.split(",") if isinstance(text, str) else list(text)
    out: list[Profile] = []
    for item in items:
        if item.strip():
            p = parse_profile(item)
            if p not in out:
                out.append(p)
    if not out:
        raise ValueError("no profile given")
    return tuple(out)


class Prompts:
    """Prompts of one run: the shared prefix of a profile, and a new part per request tag.

    ``salt`` makes them the run's own (cold: nothing a server cached from an earlier run matches
    more than a chance first token; the words of ``text`` prompts start with it, so not even that);
    the same seed and salt give the same prompts.
    """

    def __init__(self, seed: int = 0, salt: str = "") -> None:
        self.seed = seed
        self.salt = salt

    def _ids(self, tag: str, n: int) -> list[int]:
        rng = random.Random(f"{self.seed}:{self.salt}:{tag}")
        return [rng.randrange(ID_LO, ID_HI) for _ in range(n)]

    def _words(self, tag: str, n: int) -> str:
        return " ".join(f"{self.salt}{tag}w{i}" for i in range(n))

    def prefix(self, p: Profile, api: Api) -> str | list[int]:
        tag = f"p{p.input_len}"
        return self._ids(tag, p.prefix_len) if api == "completions" else self._words(tag, p.prefix_len)

    def prompt(self, p: Profile, api: Api, tag: str) -> str | list[int]:
        """The whole prompt of one request: the profile's shared prefix, then its own new part (completions:
        token ids, written as text by the session unless it sends ids)."""
        pre = self.prefix(p, api) if p.prefix_len else None
        if api == "completions":
            return (pre or []) + self._ids(f"n{p.input_len}:{tag}", p.prefill_len)  # type: ignore[operator]
        new = self._words(f"n{p.input_len}x{tag}", p.prefill_len)
        return f"{pre} {new}" if pre else new


def body(api: Api, model: str, prompt: str | list[int], max_tokens: int, *, images: int = 0,
         engine_fields: bool = True) -> dict[str, Any]:
    """A streaming request body; engine-specific fields only when ``engine_fields``."""
    out: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "temperature": 0, "stream": True}
    if api == "completions":
        out["prompt"] = prompt
    else:
        parts: list[dict[str, Any]] = [{"type": "text", "text": prompt if isinstance(prompt, str) else
                                        " ".join(map(str, prompt))}]
        parts += [{"type": "image_url", "image_url": {"url": PNG_1X1}} for _ in range(images)]
        out["messages"] = [{"role": "user", "content": parts}]
    if engine_fields:
        out["ignore_eos"] = True
        out["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    return out


def ids_as_text(ids: list[int]) -> str:
    """Token ids as a text prompt of as many words (``w<id>``: one token each on word-level vocabularies)."""
    return " ".join(f"w{i}" for i in ids)


def detokenized(status: int | None, raw: bytes) -> str | None:
    """The text of a ``/detokenize`` answer (sglang ``text``, llama-server ``content``, vLLM ``prompt``), or None."""
    if status != 200:
        return None
    try:
        obj = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(obj, dict):
        return None
    text = next((obj[k] for k in ("text", "content", "prompt") if isinstance(obj.get(k), str)), None)
    return text if text else None


def rejects_token_ids(status: int | None, message: str) -> bool:
    """An answer that says the server takes only a text prompt (retry with the ids as words)."""
    low = message.lower()
    return status == 400 and ("type must be string, but is array" in low or "prompt must be a string" in low)


def rejects_engine_fields(status: int | None, message: str) -> bool:
    """An answer that says the server does not take the engine-specific fields (retry once without)."""
    if status == 422:
        return True
    low = message.lower()
    return status == 400 and any(w in low for w in (*ENGINE_FIELDS, "continuous_usage_stats", "unexpected field",
                                                     "extra_forbidden", "extra inputs are not permitted"))
