"""``MODEL_KEY=<key> run_tilelang_benchmark.sh``: measure the running server, print the seed's tables.

Standard library only (Python 3.10+): one ``http.client`` connection, streamed requests, server-sent
events read line by line. What a real server's stream looks like, and how it is measured (:func:`measure`):

- a chat stream's first chunk carries only the role; a chunk may carry several tokens;
- TTFT: send to the first chunk with non-empty text; TPOT: (last text chunk - first) / (tokens - 1);
- output tokens: ``usage.completion_tokens`` of the last chunk (transformers serve sends usage whether
  or not ``stream_options`` asks for it, and no ``[DONE]`` line), else llama-server's
  ``timings.predicted_n``, else the number of text chunks (the stderr log says which);
- prefix tokens: the server's own count of reused prompt tokens (llama-server's ``timings.cache_n``),
  else ``usage.prompt_tokens_details.cached_tokens`` (transformers serve has no prefix cache: 0, as
  measured).

The **sweep** table (:meth:`Bench.run_sweep`, every text key) sends word prompts (one word is one token
of these models) of each profile, ``max_tokens`` = the profile's output. What differs per engine comes
from the engine module: the request's extra fields (llama.cpp: ``ignore_eos`` and ``cache_prompt``,
false for a measured prompt, true after the shared prefix was warmed; transformers serve answers 422 to
``ignore_eos``, and its models have no end-of-sequence token), whether each shape is warmed up first,
the keys it refuses (exit 3) and its other tables (llama.cpp's MTP and vision: :mod:`.llama_bench`).
"""

from __future__ import annotations

import http.client
import json
import os
import sys
import time
from collections.abc import Iterable, Iterator
from types import ModuleType
from typing import Any, NamedTuple

from .common import CONFIG, REFUSED, EngineError, fail, find_model, load_engine, read_json, release_file, write_atomic

PROG = "run_tilelang_benchmark.sh"
TABLE_ORDER = ("mtp", "sweep", "vision")  # the order a key's tables are printed in


class Measurement(NamedTuple):
    ttft_ms: float
    tpot_ms: float
    tokens: int
    tokens_from: str  # "usage", "timings" or "chunks"
    cached: int  # the server's reused prompt tokens (timings.cache_n, else usage's cached_tokens)
    text: str
    chunks: int  # chunks with non-empty text
    timings: dict[str, Any]  # llama-server's own figures of the request (last event that carried them)
    prompt_tokens: int


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


class Client:
    """One connection to the server (the benchmark's network seam). ``reconnect``: close it after each
    streamed answer (llama-server closes it anyway, though its headers say keep-alive: the next request
    opens a new one, inside its measured time, as the agent's probe counts it)."""

    def __init__(self, host: str, port: int, timeout: float = 600.0, reconnect: bool = False) -> None:
        self.conn = http.client.HTTPConnection(host, port, timeout=timeout)
        self.url = f"http://{host}:{port}"
        self.reconnect = reconnect

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
            resp.read()  # drain: the connection may be reused
            if self.reconnect:
                self.conn.close()


def words(tag: int, n: int, vocab: int) -> str:
    """A prompt of exactly ``n`` tokens for this release's word-level tokenizer (``w<i>`` words, i < vocab)."""
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
    kc: dict[str, Any]  # the key's entry of bench_config.json
    cfg: dict[str, Any]  # bench_config.json
    model: dict[str, Any]  # the key's model in the workflow
    model_id: str
    vocab: int  # word ids below this are one token each
    ctx_k: int
    profiles: list[tuple[int, int]]  # (new tokens, input tokens)
    output_len: int
    repeats: int
    log: Any
    engine: ModuleType
    env: Any

    def table(self, kind: str) -> dict[str, Any]:
        return next(t for t in self.kc["tables"] if t["kind"] == kind)

    def completion(self, prompt: str, max_tokens: int, cache: bool) -> dict[str, Any]:
        return {"model": self.model_id, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}, **self.engine.request_fields(cache)}

    def say(self, text: str) -> None:
        print(f"[bench] {self.key} {text}", file=self.log, flush=True)

    def run_sweep(self, client: Client) -> list[dict[str, str]]:
        t = self.table("sweep")
        rows = []
        for n, (new, inp) in enumerate(self.profiles):
            prefix = words(10_000 + n, inp - new, self.vocab) if inp > new else ""
            if self.engine.WARM_EACH_SHAPE:
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
                "Ctx(K)": str(self.ctx_k), "Batch": "1", "NChip": "1", "Input(tokens)": str(inp),
                "Output(tokens)": str(self.output_len), "Prefill(tps)": fmt(new / ttft * 1000),
                "TTFT(ms)": fmt(ttft), "Decode(tps)": fmt(1000 / tpot if tpot else 0.0), "TPOT(ms)": fmt(tpot),
                "Profile": f"{new}:{inp}", "Prefix(tokens)": str(last.cached),
                "MeasuredOutput(tokens)": str(last.tokens),
            })
        return rows

    def render(self, kind: str, rows: list[dict[str, str]], note: str = "") -> str:
        t = self.table(kind)
        cols = t["columns"]
        lines = ["\t".join(cols)] + ["\t".join(r[c] for c in cols) for r in rows]
        head = f"{note}\n\n" if note else ""
        title = f"{t['title']}\n\n" if t["title"] else ""  # the VL vision table has none in the seed either
        return f"{head}{title}" + "\n".join(lines) + "\n\n"

    def run(self, client: Client) -> str:
        """Every table of the key, in the seed's order (the sweep here, the others the engine's)."""
        text = ""
        kinds = [t["kind"] for t in self.kc["tables"]]
        for kind in (k for k in TABLE_ORDER if k in kinds):
            if kind == "sweep":
                text += self.render("sweep", self.run_sweep(client))
            else:
                text += self.engine.run_table(self, client, kind)
        return text


def profiles(cfg: dict[str, Any], env: Any) -> list[tuple[int, int]]:
    """The configured profiles, or those ``BENCH_PROFILES`` names (``NEW:INPUT,...``)."""
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
            raise EngineError(f"BENCH_PROFILES: {p!r} is not NEW:INPUT (configured: "
                              f"{', '.join(f'{a}:{b}' for a, b in runs)})")
    return out


def main(env: Any = None, out: Any = None) -> int:
    env = os.environ if env is None else env
    out = sys.stdout if out is None else out
    key = (env.get("MODEL_KEY") or "").strip()
    try:
        engine = load_engine()
        cfg = read_json(release_file(CONFIG))
        if key not in cfg["keys"]:
            return fail(PROG, f"unknown MODEL_KEY {key!r} (known: {', '.join(cfg['keys'])})", 2)
        kc = cfg["keys"][key]
        refusal = engine.refusal(kc)
        if refusal:
            return fail(PROG, f"MODEL_KEY={key}: {refusal}", REFUSED)
        model = find_model(env, kc["model_dir"])
        vocab, ctx_k = engine.model_sizes(model, kc, cfg)
        host = env.get("SERVER_HOST") or "127.0.0.1"
        port = int(env.get("SERVER_PORT") or "30000")
        output_len = int(env.get("BENCH_OUTPUT_LEN") or cfg["profiles"]["output"])
        repeats = int(env.get("BENCH_REPEATS") or cfg.get("repeats", 2))
        if output_len < 2 or repeats < 1:
            raise EngineError("BENCH_OUTPUT_LEN must be at least 2 and BENCH_REPEATS at least 1")
        runs = profiles(cfg, env)
    except (EngineError, ValueError, KeyError) as exc:
        return fail(PROG, f"MODEL_KEY={key}: {exc}")
    client = Client(host, port, reconnect=engine.RECONNECT)
    try:
        status, models = client.get("/v1/models")
        ids = [m.get("id") for m in (models or {}).get("data", [])] if isinstance(models, dict) else []
        if status != 200 or not ids:
            return fail(PROG, f"{client.url}/v1/models answered HTTP {status} with no model")
        if engine.CHECK_SERVED_ID and os.path.basename(str(ids[0]).rstrip("/")) != kc["model_dir"]:
            return fail(PROG, f"the server at {client.url} serves {ids[0]}, not {kc['model_dir']} (MODEL_KEY={key})")
        bench = Bench(key=key, kc=kc, cfg=cfg, model=model, model_id=str(ids[0]), vocab=vocab, ctx_k=ctx_k,
                      profiles=runs, output_len=output_len, repeats=repeats, log=sys.stderr, engine=engine,
                      env=env)
        print(f"[bench] MODEL_KEY={key} server {client.url} ({ids[0]}), engine {engine.LABEL}, tables "
              f"{', '.join(t['kind'] for t in kc['tables'])}, {len(runs)} profile(s), output {output_len}, "
              f"{repeats} request(s) each{engine.BENCH_NOTE}", file=sys.stderr, flush=True)
        client.stream("/v1/completions", bench.completion(words(0, 8, vocab), 4, False))  # warm-up, not reported
        text = bench.run(client)
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
