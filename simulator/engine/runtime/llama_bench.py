"""The llama.cpp release's MTP and vision tables (``m1000_llama``), beside the shared sweep of :mod:`.bench`.

- **mtp** (``qwen35_mtp``, ``qwen35_fq_mtp``): GSM8K-style prompts (the reference document's prompt
  indices and ground truths; word prompts of the configured length), ``cache_prompt: false``. The accept
  rates come from the server's own counters, read from its ``/metrics`` before and after each request
  (``llamacpp:spec_decode_num_drafts_total``: verify steps, ``..._num_accepted_tokens_total``): the mean
  accepted length ``acclen = 1 + accepted / steps`` (what the server's log calls ``mean len``), so
  ``(acclen-1)/(4-1)`` and ``acclen/4`` with the seed's 4 draft tokens. The response's own counts
  (``timings.draft_n``, ``timings.draft_n_accepted``) must be there and agree: a response without them
  fails the key (the server is not drafting). A step may draft fewer than ``--spec-draft-n-max`` tokens,
  so ``draft_n`` alone does not give the steps.
- **vision** (``qwen3vl``): the same text with one image (a PNG of the configured size, made here) in a
  streamed ``/v1/chat/completions``. Vision(fps) = 1000 / the projector's encode time of the frame,
  read from the server's own log (``$SGLANG_MUSA_RELEASE_DIR/logs/<model>.server.log``: the time between
  its ``encoding mtmd batch`` and ``decoding image batch`` lines, microsecond timestamps);
  Prefill(tps) = new tokens / (TTFT - encode time), Decode(tps) = 1000 / TPOT.

The models are random weights: what a draft head accepts and what a random model answers is measured and
printed, and meaningless; every output says so (a note line above the MTP table, the stderr log).
"""

from __future__ import annotations

import base64
import os
import re
import struct
import time
import zlib
from typing import Any

from .bench import Bench, Client, fmt, median, words
from .common import EngineError

RANDOM_NOTE = ("note: random-weight models: the draft acceptance and the answers in this table are measured, "
               "and meaningless (a random MTP head agrees with its random model by chance only)")
_ANSWER = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?")
_STAMP = re.compile(r"^(\d+)\.(\d{2})\.(\d{3})\.(\d{3}) ")


def server_log(env: dict[str, str], model: str) -> str:
    """Where the start script has llama-server write its log (the vision table reads it)."""
    return os.path.join(env["SGLANG_MUSA_RELEASE_DIR"], "logs", f"{model}.server.log")


SPEC_COUNTERS = {"llamacpp:spec_decode_num_drafts_total": "steps",
                 "llamacpp:spec_decode_num_accepted_tokens_total": "accepted",
                 "llamacpp:spec_decode_num_draft_tokens_total": "drafted"}


def spec_counters(text: str) -> dict[str, float]:
    """llama-server's speculative-decoding counters from its ``/metrics`` text (pure)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.strip().partition(" ")
        if name in SPEC_COUNTERS:
            try:
                out[SPEC_COUNTERS[name]] = float(value)
            except ValueError:
                continue
    return out


def accept_rates(timings: dict[str, Any], before: dict[str, float], after: dict[str, float],
                 draft_tokens: int = 4) -> tuple[float, float, float]:
    """(acclen, accept rate (acclen-1)/(d-1), accept rate acclen/d) of one request (pure): verify steps and
    accepted drafts from the server's counters before and after it, checked against the response's counts."""
    drafted, accepted = timings.get("draft_n"), timings.get("draft_n_accepted")
    if not isinstance(drafted, int) or not isinstance(accepted, int):
        raise EngineError("the server reported no draft counts (timings.draft_n, draft_n_accepted): it is not "
                          "drafting (speculative decoding off?); no MTP figures")
    if "steps" not in after or "accepted" not in after:
        raise EngineError("the server's /metrics has no speculative-decoding counters (is it started with --metrics?)")
    steps = after["steps"] - before.get("steps", 0.0)
    acc = after["accepted"] - before.get("accepted", 0.0)
    if round(acc) != accepted:
        raise EngineError(f"the server's counters say {acc:g} drafts accepted, the response says {accepted}: another "
                          "request ran meanwhile?")
    acclen = 1 + acc / steps if steps > 0 else 1.0
    return acclen, (acclen - 1) / (draft_tokens - 1), acclen / draft_tokens


def log_stamp_us(line: str) -> int | None:
    """llama's log timestamp (``M.SS.mmm.uuu``, from the server's start) in microseconds, or None."""
    m = _STAMP.match(line)
    if not m:
        return None
    mi, s, ms, us = (int(g) for g in m.groups())
    return ((mi * 60 + s) * 1000 + ms) * 1000 + us


def encode_ms(log_lines: list[str]) -> list[float]:
    """The projector's encode time of every image in these server log lines (pure): from ``encoding mtmd
    batch`` to the next ``decoding image batch``."""
    out: list[float] = []
    start: int | None = None
    for line in log_lines:
        if "encoding mtmd batch" in line:
            start = log_stamp_us(line)
        elif "decoding image batch" in line and start is not None:
            end = log_stamp_us(line)
            if end is not None:
                out.append((end - start) / 1000)
            start = None
    return out


def png(width: int, height: int) -> bytes:
    """An RGB PNG with a gradient (standard library: zlib)."""
    rows = b"".join(b"\x00" + bytes((x * 7 + y * 3 + c * 50) % 256 for x in range(width) for c in range(3))
                    for y in range(height))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))



def counters(client: Client) -> dict[str, float]:
    """The server's speculative-decoding counters now."""
    status, text = client.get("/metrics")
    if status != 200 or not isinstance(text, str):
        raise EngineError(f"{client.url}/metrics answered HTTP {status}: start the server with --metrics")
    return spec_counters(text)


class ServerLog:
    """The lines the server appends to its log file (its other seam): read from where the last read ended."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.offset = os.path.getsize(path) if os.path.exists(path) else 0

    def mark(self) -> None:
        self.offset = os.path.getsize(self.path) if os.path.exists(self.path) else 0

    def new_lines(self) -> list[str]:
        if not os.path.exists(self.path):
            return []
        with open(self.path, encoding="utf-8", errors="replace") as fh:
            fh.seek(self.offset)
            text = fh.read()
        return text.splitlines()

    def wait_encodes(self, n: int, timeout: float = 5.0) -> list[float]:
        """The encode times of the last request's images (the log thread writes a moment after the answer)."""
        end = time.monotonic() + timeout
        while True:
            got = encode_ms(self.new_lines())
            if len(got) >= n or time.monotonic() > end:
                return got
            time.sleep(0.02)



def chat(bench: Bench, text: str, images: int, max_tokens: int, cache: bool) -> dict[str, Any]:
    """A streamed chat request of ``text`` and ``images`` copies of the configured PNG."""
    side = int(bench.cfg["vision"].get("image", 256))
    url = "data:image/png;base64," + base64.b64encode(png(side, side)).decode()
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}]
    parts += [{"type": "image_url", "image_url": {"url": url}} for _ in range(images)]
    return {"model": bench.model_id, "messages": [{"role": "user", "content": parts}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True,
            "cache_prompt": cache}


def run_mtp(bench: Bench, client: Client) -> list[dict[str, str]]:
    """The MTP table: GSM8K-style prompts, accept rates from the server's draft counts."""
    t = bench.table("mtp")
    m = bench.cfg["mtp"]
    rows = []
    first = bench.cfg["gsm8k"][0]
    warm = words(60_000, int(m.get("input") or first["input"]), bench.vocab)
    client.stream("/v1/completions", bench.completion(warm, 8, False))  # not reported (first-shape cost)
    for p in bench.cfg["gsm8k"][: int(m["prompts"])]:
        n_in = int(m.get("input") or p["input"])
        prompt = words(p["index"], n_in, bench.vocab)
        before = counters(client)
        res = client.stream("/v1/completions", bench.completion(prompt, int(m["output"]), False))
        acclen, acc, acc_len = accept_rates(res.timings, before, counters(client))
        found = _ANSWER.findall(res.text)
        pred = found[-1].replace(",", "") if found else "[invalid]"
        truth = str(p["truth"])
        bench.say(f"gsm8k:{p['index']}: {res.tokens} tokens, drafted {res.timings.get('draft_n')}, accepted "
                  f"{res.timings.get('draft_n_accepted')}, mean accepted length {acclen:.3f} (random weights: "
                  f"meaningless), TTFT {res.ttft_ms:.2f} ms")
        rows.append({
            "Model": t["model"], "Size": t["size"], "PrefillLen(tokens)": str(n_in), "Batch": "1", "NChip": "1",
            "Input(tokens)": str(n_in), "Output(tokens)": str(res.tokens),
            "Prefill(tps)": fmt(n_in / res.ttft_ms * 1000, 2), "TTFT(ms)": fmt(res.ttft_ms, 2),
            "Decode(tps)": fmt(1000 / res.tpot_ms if res.tpot_ms else 0.0, 2), "TPOT(ms)": fmt(res.tpot_ms, 2),
            "Prefix(tokens)": str(res.cached), "Prompt Index": str(p["index"]),
            "accept rate((acclen-1)/(4-1))": fmt(acc, 4), "accept rate(acclen/4)": fmt(acc_len, 4),
            "Prediction": pred, "Ground Truth": truth, "Correct": "TRUE" if pred == truth else "FALSE",
        })
    return rows


def run_vision(bench: Bench, client: Client, log: ServerLog) -> list[dict[str, str]]:
    """The vision table: one image per request, the projector's time from the server's log."""
    t = bench.table("vision")
    v = bench.cfg["vision"]
    new, out_len = int(bench.cfg["profiles"]["prefix_new"]), int(v["output"])
    rows = []
    client.stream("/v1/chat/completions", chat(bench, words(70_000, 8, bench.vocab), 1, 2, False))  # not reported
    for n, inp in enumerate(int(i) for i in v["inputs"]):
        new_here = min(new, inp)
        prefix = words(20_000 + n, inp - new_here, bench.vocab) if inp > new_here else ""
        if prefix:
            client.stream("/v1/chat/completions", chat(bench, prefix, 0, 1, True))
        ms, enc = [], []
        for r in range(bench.repeats):
            text = words(300 * n + r + 1, new_here, bench.vocab)
            log.mark()
            res = client.stream("/v1/chat/completions", chat(bench, f"{prefix} {text}" if prefix else text, 1,
                                                             out_len, bool(prefix)))
            got = log.wait_encodes(1)
            if not got:
                raise EngineError(f"vision {new_here}:{inp}: no image encoding in the server's log {log.path} "
                                  "(is the server running with its vision projector, at log level 4?)")
            ms.append(res)
            enc.append(sum(got))
        ttft, tpot, e_ms = median([m.ttft_ms for m in ms]), median([m.tpot_ms for m in ms]), median(enc)
        text_ms = ttft - e_ms
        bench.say(f"vision {new_here}:{inp}: image encoded in {e_ms:.3f} ms (server log), TTFT {ttft:.2f} ms, "
                  f"TPOT {tpot:.3f} ms, prompt {ms[-1].prompt_tokens} tokens of which {ms[-1].cached} reused")
        rows.append({
            "Model": t["model"], "Size": t["size"], "PrefillLen(k)": fmt(new_here / 1000),
            "Ctx(k)": str(bench.ctx_k), "Batch": "1", "NChip": "1", "Input(k)": fmt(inp / 1000),
            "Output(k)": fmt(out_len / 1000), "Prefill(tps)": fmt(new_here / text_ms * 1000 if text_ms > 0 else 0),
            "Decode(tps)": fmt(1000 / tpot if tpot else 0.0), "Vision(fps)": fmt(1000 / e_ms if e_ms > 0 else 0),
            "Precision": bench.model.get("dtype") or t.get("precision", ""),
        })
    return rows


def run_table(bench: Bench, client: Client, kind: str) -> str:
    """The rendered MTP or vision table of the key."""
    if kind == "mtp":
        return bench.render("mtp", run_mtp(bench, client), RANDOM_NOTE)
    if kind == "vision":
        log = ServerLog(server_log(dict(bench.env), bench.model["name"]))
        return bench.render("vision", run_vision(bench, client, log))
    raise EngineError(f"no {kind} table in this release")
