"""``MODEL_KEY=<key> run_tilelang_benchmark.sh``: measure the running ``transformers serve`` over HTTP.

Standard library only (Python 3.10+): one keep-alive ``http.client`` connection, streamed
``/v1/completions`` requests with only the fields the OpenAI API defines (transformers serve
answers 422 to ``ignore_eos``; the models this release serves have no end-of-sequence token,
so every request generates ``max_tokens``), server-sent events read line by line.

What a real server's stream looks like, and how it is measured (:func:`measure`):
- a chat stream's first chunk carries only the role; a chunk may carry several tokens;
- TTFT: send to the first chunk with non-empty text;
- output tokens: ``usage.completion_tokens`` of the last chunk (transformers sends usage
  whether or not ``stream_options`` asks for it, and no ``[DONE]`` line); without usage,
  the number of text chunks (the table says which in the stderr log);
- TPOT: (last text chunk - first text chunk) / (tokens - 1);
- prefix tokens: ``usage.prompt_tokens_details.cached_tokens`` (transformers serve has no
  prefix cache: 0, reported as measured).

Prints the seed's tables (same titles, columns, number format) for the key's sweep; MTP keys
are refused (exit 3): this engine has no speculative decoding.
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from .common import EngineError, fail, read_json, release_file, write_atomic
from .workflow import find_model

PROG = "run_tilelang_benchmark.sh"
REFUSED = 3


class Measurement(NamedTuple):
    ttft_ms: float
    tpot_ms: float
    tokens: int
    tokens_from: str  # "usage" or "chunks"
    cached: int
    text: str
    chunks: int  # chunks with non-empty text


def sse_events(lines: Iterable[tuple[float, bytes]]) -> Iterator[tuple[float, dict[str, Any]]]:
    """``(time, data object)`` of every ``data:`` line; ``[DONE]`` ends the stream if the server sends it."""
    for t, raw in lines:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue  # blank separators, comments, event names
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
    for t, obj in sse_events(lines):
        piece = _text(obj)
        if piece:
            chunks += 1
            text += piece
            first = t if first is None else first
            last = t
        if isinstance(obj.get("usage"), dict):
            usage = obj["usage"]
    if first is None or last is None:
        raise EngineError("the stream ended without any text (no content chunk)")
    if usage is not None and isinstance(usage.get("completion_tokens"), int):
        tokens, source = int(usage["completion_tokens"]), "usage"
    else:
        tokens, source = chunks, "chunks"
    details = (usage or {}).get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else 0
    tpot = (last - first) * 1000 / (tokens - 1) if tokens > 1 else 0.0
    return Measurement(ttft_ms=(first - sent) * 1000, tpot_ms=tpot, tokens=tokens, tokens_from=source,
                       cached=int(cached or 0), text=text, chunks=chunks)


class Client:
    """One keep-alive connection to the server (the benchmark's only I/O seam)."""

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
            resp.read()  # drain: the connection is reused


def words(tag: int, n: int, vocab: int) -> str:
    """A prompt of exactly ``n`` tokens for this release's word-level tokenizer (``w<i>`` words)."""
    return " ".join(f"w{(tag * 7919 + i * 31) % (vocab - 2)}" for i in range(n))


def fmt(value: float, decimals: int = 3) -> str:
    text = f"{value:.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def median(values: list[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


class Sweep(NamedTuple):
    key: str
    table: dict[str, Any]
    model_id: str
    vocab: int
    ctx_k: int
    profiles: list[tuple[int, int]]  # (new tokens, input tokens)
    output_len: int
    repeats: int

    def request(self, prompt: str, max_tokens: int) -> dict[str, Any]:
        return {"model": self.model_id, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                "stream": True, "stream_options": {"include_usage": True}}

    def run(self, client: Client, log: Any) -> list[dict[str, str]]:
        client.stream("/v1/completions", self.request(words(0, 8, self.vocab), 4))  # warm-up, not reported
        rows = []
        for n, (new, inp) in enumerate(self.profiles):
            prefix = words(10_000 + n, inp - new, self.vocab) if inp > new else ""
            ms = []
            for r in range(self.repeats):
                body = words(100 * n + r + 1, new, self.vocab)
                prompt = f"{prefix} {body}" if prefix else body
                try:
                    ms.append(client.stream("/v1/completions", self.request(prompt, self.output_len)))
                except (EngineError, OSError, http.client.HTTPException) as exc:
                    raise EngineError(f"profile {new}:{inp}: {exc}") from None
            ttft = median([m.ttft_ms for m in ms])
            tpot = median([m.tpot_ms for m in ms])
            last = ms[-1]
            print(f"[bench] {self.key} {new}:{inp}: TTFT {ttft:.2f} ms, TPOT {tpot:.3f} ms, {last.tokens} tokens "
                  f"(from {last.tokens_from}) in {last.chunks} text chunk(s), median of {len(ms)}",
                  file=log, flush=True)
            rows.append({
                "Model": self.table["model"], "Size": self.table["size"], "PrefillLen(tokens)": str(new),
                "Ctx(K)": str(self.ctx_k), "Batch": "1", "NChip": "1", "Input(tokens)": str(inp),
                "Output(tokens)": str(self.output_len), "Prefill(tps)": fmt(new / ttft * 1000),
                "TTFT(ms)": fmt(ttft), "Decode(tps)": fmt(1000 / tpot if tpot else 0.0), "TPOT(ms)": fmt(tpot),
                "Profile": f"{new}:{inp}", "Prefix(tokens)": str(last.cached),
                "MeasuredOutput(tokens)": str(last.tokens),
            })
        return rows

    def render(self, rows: list[dict[str, str]]) -> str:
        cols = self.table["columns"]
        lines = ["\t".join(cols)] + ["\t".join(r[c] for c in cols) for r in rows]
        return f"{self.table['title']}\n\n" + "\n".join(lines) + "\n\n"


def _profiles(cfg: dict[str, Any], env: Any) -> list[tuple[int, int]]:
    pr = cfg["profiles"]
    runs = [(i, i) for i in pr["no_prefix"]] + [(pr["prefix_new"], i) for i in pr["shared_prefix"]]
    only = [p.strip() for p in (env.get("BENCH_PROFILES") or "").split(",") if p.strip()]
    if not only:
        return runs
    known = {f"{a}:{b}": (a, b) for a, b in runs}
    out = []
    for p in only:
        parts = p.split(":")
        if p in known:
            out.append(known[p])
        elif len(parts) == 2 and all(x.isdigit() and int(x) > 0 for x in parts) and int(parts[0]) <= int(parts[1]):
            out.append((int(parts[0]), int(parts[1])))
        else:
            raise EngineError(f"BENCH_PROFILES: {p!r} is not NEW:INPUT (known: {', '.join(known)})")
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
        if kc["mtp"]:
            return fail(PROG, f"MODEL_KEY={key}: speculative decoding (MTP) is not supported by this release's engine "
                        "(transformers serve): no MTP figures measured", REFUSED)
        sweep_tables = [t for t in kc["tables"] if t["kind"] == "sweep"]
        if not sweep_tables or any(t["kind"] != "sweep" for t in kc["tables"]):
            return fail(PROG, f"MODEL_KEY={key}: this release serves text models only (no vision benchmark)", REFUSED)
        model = find_model(env, kc["model_dir"])
        mcfg = read_json(os.path.join(model["path"], "config.json"))
        host = env.get("SERVER_HOST") or "127.0.0.1"
        port = int(env.get("SERVER_PORT") or "30000")
        output_len = int(env.get("BENCH_OUTPUT_LEN") or cfg["profiles"]["output"])
        repeats = int(env.get("BENCH_REPEATS") or cfg.get("repeats", 2))
        if output_len < 2 or repeats < 1:
            raise EngineError("BENCH_OUTPUT_LEN must be at least 2 and BENCH_REPEATS at least 1")
        profiles = _profiles(cfg, env)
    except (EngineError, ValueError, KeyError) as exc:
        return fail(PROG, f"MODEL_KEY={key}: {exc}")
    client = Client(host, port)
    try:
        status, models = client.get("/v1/models")
        ids = [m.get("id") for m in (models or {}).get("data", [])] if isinstance(models, dict) else []
        if status != 200 or not ids:
            return fail(PROG, f"{client.url}/v1/models answered HTTP {status} with no model")
        if os.path.basename(str(ids[0]).rstrip("/")) != kc["model_dir"]:
            return fail(PROG, f"the server at {client.url} serves {ids[0]}, not {kc['model_dir']} (MODEL_KEY={key})")
        sweep = Sweep(key=key, table=sweep_tables[0], model_id=str(ids[0]), vocab=int(mcfg["vocab_size"]),
                      ctx_k=round(int(mcfg.get("max_position_embeddings", 16384)) / 1024), profiles=profiles,
                      output_len=output_len, repeats=repeats)
        print(f"[bench] MODEL_KEY={key} server {client.url} ({ids[0]}), engine transformers serve, "
              f"{len(profiles)} profile(s), output {output_len}, {repeats} request(s) each",
              file=sys.stderr, flush=True)
        rows = sweep.run(client, sys.stderr)
    except (EngineError, OSError, http.client.HTTPException) as exc:
        return fail(PROG, f"MODEL_KEY={key}: {exc}")
    finally:
        client.close()
    text = sweep.render(rows)
    out.write(text)
    out.flush()
    root = env.get("SGLANG_MUSA_RELEASE_DIR")
    if root:
        os.makedirs(os.path.join(root, "benchmark_results"), exist_ok=True)
        write_atomic(os.path.join(root, "benchmark_results", f"{key}.tsv"), text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
