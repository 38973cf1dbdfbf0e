"""``MODEL_KEY=<key> run_tilelang_benchmark.sh``: measure the running ``llama-server``, print the seed's tables.

Standard library only (Python 3.10+): one keep-alive ``http.client`` connection, streamed requests,
server-sent events read line by line. Per key, the tables its reference table list names:

- **sweep** (every text key and qwen3vl): streamed ``/v1/completions`` of word prompts (one word is one
  token of these models), ``ignore_eos`` and ``max_tokens`` = the profile's output. TTFT at the first
  chunk with text, TPOT = (last text chunk - first) / (tokens - 1), tokens from ``usage``. No-prefix
  profiles send ``cache_prompt: false`` (llama-server reuses the slot's cached prefix by default: a
  measured prompt must be computed); shared-prefix profiles warm the prefix once and then send
  ``cache_prompt: true``, as the reference document's prefix-cache rows, and report the server's own
  count of reused tokens (``timings.cache_n``) as Prefix(tokens).
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
import http.client
import json
import os
import re
import struct
import sys
import time
import zlib
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from .common import EngineError, fail, read_json, release_file, write_atomic
from .serve import server_log
from .workflow import find_model

PROG = "run_tilelang_benchmark.sh"
RANDOM_NOTE = ("note: random-weight models: the draft acceptance and the answers in this table are measured, "
               "and meaningless (a random MTP head agrees with its random model by chance only)")
_ANSWER = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?")
_STAMP = re.compile(r"^(\d+)\.(\d{2})\.(\d{3})\.(\d{3}) ")


class Measurement(NamedTuple):
    ttft_ms: float
    tpot_ms: float
    tokens: int
    tokens_from: str  # "usage" or "chunks"
    cached: int  # the server's reused prompt tokens (timings.cache_n, else usage's cached_tokens)
    text: str
    chunks: int  # chunks with non-empty text
    timings: dict[str, Any]  # llama-server's own figures of the request (last event that carried them)
    prompt_tokens: int


def sse_events(lines: Iterable[tuple[float, bytes]]) -> Iterator[tuple[float, dict[str, Any]]]:
    """``(time, data object)`` of every ``data:`` line; ``[DONE]`` ends the stream."""
    for t, raw in lines:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            return
        try:
            obj = json.loads(payload)
        except ValueError:
            raise EngineError(f"malformed server-sent event: {payload[:120]!r}") from None
        if not isinstance(obj, dict):
            raise EngineError(f"server-sent event is not a JSON object: {payload[:120]!r}")
        if "error" in obj:
            raise EngineError(f"the server reported an error in the stream: {obj['error']}")
        yield t, obj


def _text(obj: dict[str, Any]) -> str:
    out = ""
    for ch in obj.get("choices") or ():
        if not isinstance(ch, dict):
            continue
        delta = ch.get("delta")
        piece = delta.get("content") if isinstance(delta, dict) else ch.get("text")
        if isinstance(piece, str):
            out += piece
    return out


def measure(sent: float, lines: Iterable[tuple[float, bytes]]) -> Measurement:
    """One stream's figures (pure: times in seconds as read, ``sent`` when the request went out)."""
    first = last = None
    chunks = 0
    text = ""
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] = {}
    for t, obj in sse_events(lines):
        piece = _text(obj)
        if piece:
            chunks += 1
            text += piece
            first = t if first is None else first
            last = t
        if isinstance(obj.get("usage"), dict):
            usage = obj["usage"]
        if isinstance(obj.get("timings"), dict):
            timings = obj["timings"]
    if first is None or last is None:
        raise EngineError("the stream ended without any text (no content chunk)")
    if usage is not None and isinstance(usage.get("completion_tokens"), int):
        tokens, source = int(usage["completion_tokens"]), "usage"
    elif isinstance(timings.get("predicted_n"), int):
        tokens, source = int(timings["predicted_n"]), "timings"
    else:
        tokens, source = chunks, "chunks"
    details = (usage or {}).get("prompt_tokens_details")
    cached = timings.get("cache_n")
    if not isinstance(cached, int):
        cached = details.get("cached_tokens") if isinstance(details, dict) else 0
    tpot = (last - first) * 1000 / (tokens - 1) if tokens > 1 else 0.0
    prompt = (usage or {}).get("prompt_tokens")
    return Measurement(ttft_ms=(first - sent) * 1000, tpot_ms=tpot, tokens=tokens, tokens_from=source,
                       cached=int(cached or 0), text=text, chunks=chunks, timings=timings,
                       prompt_tokens=int(prompt) if isinstance(prompt, int) else 0)


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


class Client:
    """One keep-alive connection to the server (the benchmark's only network seam)."""

    def __init__(self, host: str, port: int, timeout: float = 600.0) -> None:
        self.conn = http.client.HTTPConnection(host, port, timeout=timeout)
        self.url = f"http://{host}:{port}"

    def close(self) -> None:
        self.conn.close()

    def get(self, path: str) -> tuple[int, Any]:
        self.conn.request("GET", path)
        resp = self.conn.getresponse()
        body = resp.read()
        try:
            return resp.status, json.loads(body) if body else None
        except ValueError:
            return resp.status, body.decode("utf-8", "replace")

    def counters(self) -> dict[str, float]:
        status, text = self.get("/metrics")
        if status != 200 or not isinstance(text, str):
            raise EngineError(f"{self.url}/metrics answered HTTP {status}: start the server with --metrics")
        return spec_counters(text)

    def stream(self, path: str, body: dict[str, Any]) -> Measurement:
        data = json.dumps(body).encode()
        sent = time.perf_counter()
        self.conn.request("POST", path, body=data, headers={"Content-Type": "application/json",
                                                            "Accept": "text/event-stream"})
        resp = self.conn.getresponse()
        if resp.status != 200:
            detail = resp.read().decode("utf-8", "replace").strip()
            raise EngineError(f"POST {path} answered HTTP {resp.status}: {detail[:300]}")

        def lines() -> Iterator[tuple[float, bytes]]:
            while True:
                raw = resp.readline()
                if not raw:
                    return
                yield time.perf_counter(), raw

        try:
            return measure(sent, lines())
        finally:
            # llama-server closes the connection after a streamed answer, though its headers say keep-alive:
            # the next request opens a new one (inside its measured time, as the agent's probe counts it)
            resp.read()
            self.conn.close()


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


def words(tag: int, n: int, vocab: int) -> str:
    """A prompt of exactly ``n`` tokens for this release's word-level tokenizer (``w<i>`` words)."""
    return " ".join(f"w{(tag * 7919 + i * 31) % vocab}" for i in range(n))


def fmt(value: float, decimals: int = 3) -> str:
    text = f"{value:.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def median(values: list[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


class Bench(NamedTuple):
    key: str
    kc: dict[str, Any]
    cfg: dict[str, Any]
    model: dict[str, Any]
    model_id: str
    vocab: int
    profiles: list[tuple[int, int]]  # (new tokens, input tokens)
    output_len: int
    repeats: int
    log: Any

    def table(self, kind: str) -> dict[str, Any]:
        return next(t for t in self.kc["tables"] if t["kind"] == kind)

    def completion(self, prompt: str, max_tokens: int, cache: bool) -> dict[str, Any]:
        return {"model": self.model_id, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}, "ignore_eos": True, "cache_prompt": cache}

    def chat(self, text: str, images: int, max_tokens: int, cache: bool) -> dict[str, Any]:
        side = int(self.cfg["vision"].get("image", 256))
        url = "data:image/png;base64," + base64.b64encode(png(side, side)).decode()
        parts: list[dict[str, Any]] = [{"type": "text", "text": text}]
        parts += [{"type": "image_url", "image_url": {"url": url}} for _ in range(images)]
        return {"model": self.model_id, "messages": [{"role": "user", "content": parts}], "max_tokens": max_tokens,
                "temperature": 0, "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True,
                "cache_prompt": cache}

    def say(self, text: str) -> None:
        print(f"[bench] {self.key} {text}", file=self.log, flush=True)

    # -- sweep
    def run_sweep(self, client: Client) -> list[dict[str, str]]:
        t = self.table("sweep")
        rows = []
        for n, (new, inp) in enumerate(self.profiles):
            prefix = words(10_000 + n, inp - new, self.vocab) if inp > new else ""
            # one request of this shape first, not reported: a GPU server's first prompt of a new length is slow
            client.stream("/v1/completions", self.completion(words(50_000 + n, new, self.vocab), 4, False))
            if prefix:
                client.stream("/v1/completions", self.completion(prefix, 1, True))  # warm the shared prefix
            ms = []
            for r in range(self.repeats):
                body = words(100 * n + r + 1, new, self.vocab)
                prompt = f"{prefix} {body}" if prefix else body
                try:
                    ms.append(client.stream("/v1/completions", self.completion(prompt, self.output_len, bool(prefix))))
                except (EngineError, OSError, http.client.HTTPException) as exc:
                    raise EngineError(f"profile {new}:{inp}: {exc}") from None
            ttft = median([m.ttft_ms for m in ms])
            tpot = median([m.tpot_ms for m in ms])
            last = ms[-1]
            self.say(f"{new}:{inp}: TTFT {ttft:.2f} ms, TPOT {tpot:.3f} ms, {last.tokens} tokens (from "
                     f"{last.tokens_from}) in {last.chunks} text chunk(s), prompt {last.prompt_tokens} tokens of which "
                     f"{last.cached} reused, median of {len(ms)}")
            rows.append({
                "Model": t["model"], "Size": t["size"], "PrefillLen(tokens)": str(new),
                "Ctx(K)": str(self.cfg["ctx_k"]), "Batch": "1", "NChip": "1", "Input(tokens)": str(inp),
                "Output(tokens)": str(self.output_len), "Prefill(tps)": fmt(new / ttft * 1000),
                "TTFT(ms)": fmt(ttft), "Decode(tps)": fmt(1000 / tpot if tpot else 0.0), "TPOT(ms)": fmt(tpot),
                "Profile": f"{new}:{inp}", "Prefix(tokens)": str(last.cached),
                "MeasuredOutput(tokens)": str(last.tokens),
            })
        return rows

    # -- MTP (GSM8K-style prompts, accept rates from the server's draft counts)
    def run_mtp(self, client: Client) -> list[dict[str, str]]:
        t = self.table("mtp")
        m = self.cfg["mtp"]
        rows = []
        first = self.cfg["gsm8k"][0]
        warm = words(60_000, int(m.get("input") or first["input"]), self.vocab)
        client.stream("/v1/completions", self.completion(warm, 8, False))  # not reported (first-shape cost)
        for p in self.cfg["gsm8k"][: int(m["prompts"])]:
            n_in = int(m.get("input") or p["input"])
            prompt = words(p["index"], n_in, self.vocab)
            before = client.counters()
            res = client.stream("/v1/completions", self.completion(prompt, int(m["output"]), False))
            acclen, acc, acc_len = accept_rates(res.timings, before, client.counters())
            found = _ANSWER.findall(res.text)
            pred = found[-1].replace(",", "") if found else "[invalid]"
            truth = str(p["truth"])
            self.say(f"gsm8k:{p['index']}: {res.tokens} tokens, drafted {res.timings.get('draft_n')}, accepted "
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

    # -- vision (one image per request; the projector's time from the server's log)
    def run_vision(self, client: Client, log: ServerLog) -> list[dict[str, str]]:
        t = self.table("vision")
        v = self.cfg["vision"]
        new, out_len = int(self.cfg["profiles"]["prefix_new"]), int(v["output"])
        rows = []
        client.stream("/v1/chat/completions", self.chat(words(70_000, 8, self.vocab), 1, 2, False))  # not reported
        for n, inp in enumerate(int(i) for i in v["inputs"]):
            new_here = min(new, inp)
            prefix = words(20_000 + n, inp - new_here, self.vocab) if inp > new_here else ""
            if prefix:
                client.stream("/v1/chat/completions", self.chat(prefix, 0, 1, True))
            ms, enc = [], []
            for r in range(self.repeats):
                text = words(300 * n + r + 1, new_here, self.vocab)
                log.mark()
                res = client.stream("/v1/chat/completions", self.chat(f"{prefix} {text}" if prefix else text, 1,
                                                                      out_len, bool(prefix)))
                got = log.wait_encodes(1)
                if not got:
                    raise EngineError(f"vision {new_here}:{inp}: no image encoding in the server's log {log.path} "
                                      "(is the server running with its vision projector, at log level 4?)")
                ms.append(res)
                enc.append(sum(got))
            ttft, tpot, e_ms = median([m.ttft_ms for m in ms]), median([m.tpot_ms for m in ms]), median(enc)
            text_ms = ttft - e_ms
            self.say(f"vision {new_here}:{inp}: image encoded in {e_ms:.3f} ms (server log), TTFT {ttft:.2f} ms, "
                     f"TPOT {tpot:.3f} ms, prompt {ms[-1].prompt_tokens} tokens of which {ms[-1].cached} reused")
            rows.append({
                "Model": t["model"], "Size": t["size"], "PrefillLen(k)": fmt(new_here / 1000),
                "Ctx(k)": str(self.cfg["ctx_k"]), "Batch": "1", "NChip": "1", "Input(k)": fmt(inp / 1000),
                "Output(k)": fmt(out_len / 1000), "Prefill(tps)": fmt(new_here / text_ms * 1000 if text_ms > 0 else 0),
                "Decode(tps)": fmt(1000 / tpot if tpot else 0.0), "Vision(fps)": fmt(1000 / e_ms if e_ms > 0 else 0),
                "Precision": self.model.get("dtype") or t.get("precision", ""),
            })
        return rows

    def render(self, kind: str, rows: list[dict[str, str]], note: str = "") -> str:
        t = self.table(kind)
        cols = t["columns"]
        lines = ["\t".join(cols)] + ["\t".join(r[c] for c in cols) for r in rows]
        head = f"{note}\n\n" if note else ""
        title = f"{t['title']}\n\n" if t["title"] else ""  # the VL vision table has none in the seed either
        return f"{head}{title}" + "\n".join(lines) + "\n\n"


def _profiles(cfg: dict[str, Any], env: Any) -> list[tuple[int, int]]:
    pr = cfg["profiles"]
    runs = [(i, i) for i in pr["no_prefix"]] + [(pr["prefix_new"], i) for i in pr["shared_prefix"]]
    only = [p.strip() for p in (env.get("BENCH_PROFILES") or "").split(",") if p.strip()]
    if not only:
        return runs
    out = []
    for p in only:
        parts = p.split(":")
        if len(parts) == 2 and all(x.isdigit() and int(x) > 0 for x in parts) and int(parts[0]) <= int(parts[1]):
            out.append((int(parts[0]), int(parts[1])))
        else:
            raise EngineError(f"BENCH_PROFILES: {p!r} is not NEW:INPUT")
    return out


def main(env: Any = None, out: Any = None) -> int:
    env = os.environ if env is None else env
    out = sys.stdout if out is None else out
    key = (env.get("MODEL_KEY") or "").strip()
    try:
        cfg = read_json(release_file("bench_config.json"))
        if key not in cfg["keys"]:
            return fail(PROG, f"unknown MODEL_KEY {key!r} (known: {', '.join(cfg['keys'])})", 2)
        kc = cfg["keys"][key]
        model = find_model(env, kc["model_dir"])
        if not model["supported"]:
            return fail(PROG, f"MODEL_KEY={key}: {model['why']}")
        host = env.get("SERVER_HOST") or "127.0.0.1"
        port = int(env.get("SERVER_PORT") or "30000")
        output_len = int(env.get("BENCH_OUTPUT_LEN") or cfg["profiles"]["output"])
        repeats = int(env.get("BENCH_REPEATS") or cfg.get("repeats", 2))
        if output_len < 2 or repeats < 1:
            raise EngineError("BENCH_OUTPUT_LEN must be at least 2 and BENCH_REPEATS at least 1")
        profiles = _profiles(cfg, env)
        kinds = [t["kind"] for t in kc["tables"]]
        if "vision" in kinds and not model["mmproj"]:
            raise EngineError(f"{model['name']} has no vision projector ({model['path']}/mmproj.gguf): "
                              "no vision figures")
    except (EngineError, ValueError, KeyError) as exc:
        return fail(PROG, f"MODEL_KEY={key}: {exc}")
    client = Client(host, port)
    text = ""
    try:
        status, models = client.get("/v1/models")
        ids = [m.get("id") for m in (models or {}).get("data", [])] if isinstance(models, dict) else []
        if status != 200 or not ids:
            return fail(PROG, f"{client.url}/v1/models answered HTTP {status} with no model")
        vocab = min(int(model.get("vocab") or 32768) - 40, 30_000)
        bench = Bench(key=key, kc=kc, cfg=cfg, model=model, model_id=str(ids[0]), vocab=vocab, profiles=profiles,
                      output_len=output_len, repeats=repeats, log=sys.stderr)
        print(f"[bench] MODEL_KEY={key} server {client.url} ({ids[0]}), engine llama.cpp, tables {', '.join(kinds)}; "
              "random-weight models: MTP acceptance and answers are meaningless", file=sys.stderr, flush=True)
        client.stream("/v1/completions", bench.completion(words(0, 8, vocab), 4, False))  # warm-up, not reported
        if "mtp" in kinds:
            text += bench.render("mtp", bench.run_mtp(client), RANDOM_NOTE)
        if "sweep" in kinds:
            text += bench.render("sweep", bench.run_sweep(client))
        if "vision" in kinds:
            text += bench.render("vision", bench.run_vision(client, ServerLog(server_log(dict(env), model["name"]))))
    except (EngineError, OSError, http.client.HTTPException) as exc:
        return fail(PROG, f"MODEL_KEY={key}: {exc}")
    finally:
        client.close()
    out.write(text)
    out.flush()
    root = env.get("SGLANG_MUSA_RELEASE_DIR")
    if root:
        os.makedirs(os.path.join(root, "benchmark_results"), exist_ok=True)
        write_atomic(os.path.join(root, "benchmark_results", f"{key}.tsv"), text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
