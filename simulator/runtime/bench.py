"""The release's benchmark (``MODEL_KEY=<key> scripts/ci/musa/run_tilelang_benchmark.sh``).

Measures the running server over HTTP streaming with the seed's profiles and prints the
seed's tables (tab-separated, same titles, headers, column order and number format) to
stdout and to ``benchmark_results/<MODEL_KEY>.tsv`` in the release folder. Every figure
is measured from the stream: TTFT from send to the first token, TPOT from the first to
the last token, accept rates from token and chunk counts, vision fps from the TTFT
difference between two frame counts. Wall times are multiplied by the server's time
scale (module time). Standard library only.
"""

from __future__ import annotations

import os
import sys
import time

from . import core, jsonc, net
from .common import fail, load_knobs, raise_priority, read_json, release_file, write_atomic

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~3 ms of each interpreter's start)
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any, NamedTuple
else:
    from .record import NamedTuple

PROG = "run_tilelang_benchmark.sh"
SPREAD = 0.01  # two TTFT measurements this close (relative) are taken as undisturbed
VISION_SPREAD = 0.004  # fps comes from a difference of two TTFTs: agree more closely
_ANSWER = r"####\s*(-?[\d,]*\.?\d+)"  # a GSM8K answer in a completion (compiled by the MTP keys only)


class BenchError(core.SimError):
    """The benchmark cannot go on; ``rows`` measured so far survive."""


class Measurement(NamedTuple):
    """One streamed request, times in module milliseconds.

    ``arrivals`` are ``(tokens so far, ms after the first token)`` of every token-bearing
    chunk after the first (one chunk per verify step under speculative decoding).
    """

    ttft_ms: float
    tokens: int
    arrivals: tuple[tuple[int, float], ...]
    cached: int
    text: str

    @property
    def chunks(self) -> int:
        return len(self.arrivals)

    @property
    def tpot_ms(self) -> float:
        """Time per output token: slope of arrival time over token count (Theil-Sen).

        Equal to (t_last - t_first) / (n - 1) when the stream is undisturbed, but one late
        wake-up of either process on a busy machine does not move it.
        """
        pts = ((1, 0.0),) + self.arrivals
        return theil_sen(pts) if len(pts) > 1 else 0.0

    @property
    def step_ms(self) -> float:
        """Time per verify step (speculative decoding): slope of arrival time over chunk index."""
        pts = [(0, 0.0)] + [(i + 1, t) for i, (_, t) in enumerate(self.arrivals)]
        return theil_sen(pts) if len(pts) > 1 else 0.0


def theil_sen(points: tuple[tuple[int, float], ...] | list[tuple[int, float]]) -> float:
    """Median of the pairwise slopes dy/dx (robust to a minority of disturbed points)."""
    slopes = []
    for i, (x0, y0) in enumerate(points):
        for x1, y1 in points[i + 1:]:
            if x1 != x0:
                slopes.append((y1 - y0) / (x1 - x0))
    return median_of(slopes) if slopes else 0.0


def agreeing_pair(values: list[float], spread: float = SPREAD) -> tuple[float, float] | None:
    """The closest two values if they agree within ``spread`` (relative), else None."""
    ordered = sorted(values)
    best = min(zip(ordered, ordered[1:], strict=False), key=lambda p: p[1] - p[0], default=None)
    if best is None or best[1] - best[0] > spread * best[0]:
        return None
    return best


def median_of(values: list[float]) -> float:
    """The median (mean of the middle two for an even count), as ``statistics.median``; cheaper to import."""
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


class Target(NamedTuple):
    host: str
    port: int

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


class ProtocolError(ValueError):
    """The server's answer is not the HTTP/1.1 this client speaks."""


class Client:
    """One keep-alive HTTP/1.1 connection to the server (the benchmark's only I/O seam to it).

    Just what the benchmark needs (requests with a body, ``Content-Length`` and chunked
    answers, server-sent events read line by line), on a plain socket: ``http.client``
    costs more to import than a sweep of short keys spends streaming, once per benchmark
    process on every simulated module.
    """

    def __init__(self, target: Target, scale: float) -> None:
        self.target = target
        self.scale = scale
        self.sock: net.Socket | None = None
        self.rfile: Any = None

    def _connect(self, timeout: float | None) -> net.Socket:
        if self.sock is None:
            self.sock = net.connect(self.target.host, self.target.port, timeout)
            self.rfile = net.reader(self.sock)
        self.sock.settimeout(timeout)
        return self.sock

    def close(self) -> None:
        if self.sock is not None:
            self.rfile.close()
            self.sock.close()
            self.sock, self.rfile = None, None

    def _send(self, method: str, path: str, body: bytes, timeout: float | None,
              headers: dict[str, str] | None = None) -> tuple[int, dict[str, str]]:
        """Send one request and read the status line and headers of its answer."""
        sock = self._connect(timeout)
        head = [f"{method} {path} HTTP/1.1", f"Host: {self.target.host}:{self.target.port}",
                f"Content-Length: {len(body)}"]
        head += [f"{k}: {v}" for k, v in (headers or {}).items()]
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
        status_line = self.rfile.readline(65537)
        if not status_line:
            raise ConnectionResetError("the server closed the connection without answering")
        parts = status_line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise ProtocolError(f"bad status line {status_line[:80]!r}")
        fields: dict[str, str] = {}
        while True:
            line = self.rfile.readline(65537)
            if line in (b"\r\n", b"\n"):
                break
            if not line:
                raise ConnectionResetError("the server closed the connection in the middle of the headers")
            name, _, value = line.decode("latin-1").partition(":")
            fields[name.strip().lower()] = value.strip()
        return int(parts[1]), fields

    def _read_line(self) -> bytes:
        line = self.rfile.readline(65537)
        if not line:
            raise ConnectionResetError("the server closed the stream before its end")
        return line

    def _chunks(self, fields: dict[str, str]) -> Iterator[bytes]:
        """The body of an answer, piece by piece as it arrives."""
        if fields.get("transfer-encoding", "").lower() != "chunked":
            n = int(fields.get("content-length") or 0)
            data = self.rfile.read(n) if n else b""
            if len(data) < n:
                raise ConnectionResetError("the server closed the connection in the middle of an answer")
            yield data
            return
        while True:
            size_line = self._read_line().split(b";", 1)[0].strip()
            try:
                size = int(size_line, 16)
            except ValueError:
                raise ProtocolError(f"bad chunk size {size_line[:20]!r}") from None
            if size == 0:
                while self._read_line() not in (b"\r\n", b"\n"):  # trailers
                    pass
                return
            data = self.rfile.read(size)
            if len(data) < size or self.rfile.read(2) != b"\r\n":
                raise ConnectionResetError("the server closed the stream in the middle of a chunk")
            yield data

    def _finish(self, fields: dict[str, str]) -> None:
        if fields.get("connection", "").lower() == "close":
            self.close()

    def get(self, path: str, timeout: float) -> tuple[int, Any]:
        status, fields = self._send("GET", path, b"", timeout)
        raw = b"".join(self._chunks(fields))
        self._finish(fields)
        try:
            return status, jsonc.loads(raw or b"null")
        except ValueError:
            return status, raw.decode("utf-8", "replace")

    def post(self, path: str) -> None:
        status, fields = self._send("POST", path, b"", None)
        for _ in self._chunks(fields):
            pass
        self._finish(fields)
        if status != 200:
            raise BenchError(f"POST {path} answered HTTP {status}")

    def stream(self, path: str, body: dict[str, Any]) -> Measurement:
        """POST a streaming request and time its tokens (blocks as long as the server does)."""
        t_start = time.monotonic_ns()
        data = jsonc.dumps(body, separators=(",", ":")).encode()
        status, fields = self._send("POST", path, data, None,
                                    {"Content-Type": "application/json"})
        if status != 200:
            raw = b"".join(self._chunks(fields)).decode("utf-8", "replace")
            self._finish(fields)
            try:
                msg = jsonc.loads(raw)["error"]["message"]
            except (ValueError, KeyError, TypeError):
                msg = raw.strip()[:200]
            raise BenchError(f"server rejected the request (HTTP {status}): {msg}")
        t_first = 0
        seen = 0
        arrivals: list[tuple[int, int]] = []
        cached = 0
        text: list[str] = []
        pending = b""
        done = False
        for piece in self._chunks(fields):
            now = time.monotonic_ns()
            pending += piece
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if done or not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    done = True
                    continue
                obj = jsonc.loads(payload)
                usage = obj.get("usage") or {}
                for ch in obj.get("choices") or ():
                    text.append(ch.get("text") or (ch.get("delta") or {}).get("content") or "")
                total = usage.get("completion_tokens")
                if total is None:
                    continue
                cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", cached) or 0
                if total > seen and obj.get("choices"):
                    if seen == 0:
                        t_first = now
                    else:
                        arrivals.append((total, now))
                seen = max(seen, total)
        self._finish(fields)
        if not done:
            raise ConnectionResetError("the stream ended without [DONE]")
        if seen == 0:
            raise BenchError("server streamed no tokens (no usage in the stream)")
        k = self.scale / 1e6
        return Measurement(ttft_ms=(t_first - t_start) * k, tokens=seen,
                           arrivals=tuple((n, (t - t_first) * k) for n, t in arrivals), cached=int(cached),
                           text="".join(text))


# ---------------------------------------------------------------------------- plan


class Row(NamedTuple):
    kind: str  # sweep | mtp | vision
    cells: dict[str, str]
    order: int = 0  # rows of one table are printed sorted by this (stable)


class Result:
    """Rows measured so far (they survive a failed benchmark)."""

    def __init__(self) -> None:
        self.rows: list[Row] = []


def shared_prefix(inp: int, prefix: int) -> str:
    """The shared-prefix text of profile ``input`` (one token per word), "" without prefix."""
    return core.words(f"sp{inp}_", prefix) if prefix else ""


def completion(prompt: str | list[int], max_tokens: int) -> dict[str, Any]:
    return {"model": "default", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}


def chat(text: str, frames: int, max_tokens: int) -> dict[str, Any]:
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}]
    parts += [{"type": "image_url", "image_url": {"url": f"data:image/png;base64,ZnJhbWU{i}"}} for i in range(frames)]
    return {"model": "default", "messages": [{"role": "user", "content": parts}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}


def _f3(v: float) -> str:
    return core.fmt_num(v, 3)


def _f2(v: float) -> str:
    return core.fmt_num(v, 2)


class Bench(NamedTuple):
    key: str
    cfg: dict[str, Any]  # bench_config.json
    ctx_k: int
    draft: int
    output_len: int
    only: frozenset[str] = frozenset()
    repeats: int = 4  # at most this many requests per TTFT figure
    skew: float = 1.0  # fault bench-skew: measured times are reported times this (the server is unchanged)

    @property
    def kc(self) -> dict[str, Any]:
        return self.cfg["keys"][self.key]

    def table(self, kind: str) -> dict[str, Any]:
        return next(t for t in self.kc["tables"] if t["kind"] == kind)

    def wanted(self, profile: str) -> bool:
        return not self.only or profile in self.only

    def profiles(self) -> list[str]:
        """Every profile name this key runs (for BENCH_PROFILES validation)."""
        if self.kc["mtp"]:
            return [f"gsm8k:{p['index']}" for p in self.cfg["gsm8k"]]
        pr = self.cfg["profiles"]
        names = [f"{i}:{i}" for i in pr["no_prefix"]] + [f"{pr['prefix_new']}:{i}" for i in pr["shared_prefix"]]
        if any(t["kind"] == "vision" for t in self.kc["tables"]):
            v = self.cfg["vision"]
            names += [f"vision:{v['new']}:{i}" for i in v["inputs"]]
        return names

    def scale_set(self) -> frozenset[str]:
        """``BENCH_PROFILE_SET=scale``: one profile per table of the key (cheap modules for scale runs)."""
        names = self.profiles()
        vision = [n for n in names if n.startswith("vision:")]
        return frozenset(names[:1] + vision[:1])

    def ttft(self, first: Measurement, again: Callable[[int], Measurement], spread: float = SPREAD) -> float:
        """TTFT agreed on by two requests (within ``spread``), else the median of up to ``repeats``.

        A late wake-up of the server or the benchmark only ever delays a token; two
        measurements that agree were both undisturbed.
        """
        vals = [first.ttft_ms]
        for r in range(1, self.repeats):
            vals.append(again(r).ttft_ms)
            pair = agreeing_pair(vals, spread)
            if pair is not None:
                return (pair[0] + pair[1]) / 2
        return median_of(vals)

    # -- sweep
    def run_sweep(self, client: Client, out: Result, after: Callable[[int], None] | None = None) -> None:
        """The no-prefix and shared-prefix profiles; ``after(input)`` runs once a shared prefix is cached."""
        pr = self.cfg["profiles"]
        t = self.table("sweep")
        runs = [(i, 0) for i in pr["no_prefix"]] + [(i, i - pr["prefix_new"]) for i in pr["shared_prefix"]]
        for inp, prefix in runs:
            new = inp - prefix
            name = f"{new}:{inp}"
            if not self.wanted(name):
                continue
            pre = shared_prefix(inp, prefix)
            with _profile(name):
                if prefix:
                    client.stream("/v1/completions", completion(pre, 1))  # warm the shared prefix

                def request(r: int, max_tokens: int, inp: int = inp, pre: str = pre, new: int = new
                            ) -> Measurement:
                    if pre:  # shared prefix: text, so the VL vision rows can share it
                        prompt: str | list[int] = f"{pre} {core.words(f'sn{inp}_{r}_', new)}"
                    else:
                        prompt = core.random_ids(f"np:{inp}:{r}", new)
                    return client.stream("/v1/completions", completion(prompt, max_tokens))

                m = request(0, self.output_len)
                ttft = self.ttft(m, lambda r: request(r, 1)) * self.skew
            tpot = m.tpot_ms * self.skew
            out.rows.append(Row("sweep", {
                "Model": t["model"], "Size": t["size"], "PrefillLen(tokens)": str(new), "Ctx(K)": str(self.ctx_k),
                "Batch": "1", "NChip": "1", "Input(tokens)": str(inp), "Output(tokens)": str(self.output_len),
                "Prefill(tps)": _f3(new / ttft * 1000), "TTFT(ms)": _f3(ttft),
                "Decode(tps)": _f3(1000 / tpot if tpot else 0.0), "TPOT(ms)": _f3(tpot),
                "Profile": name, "Prefix(tokens)": str(m.cached if prefix else 0),
                "MeasuredOutput(tokens)": str(m.tokens),
            }))
            if prefix and after is not None:
                after(inp)

    # -- MTP (GSM8K-style prompts)
    def run_mtp(self, client: Client, out: Result) -> None:
        t = self.table("mtp")
        d = self.draft
        for p in self.cfg["gsm8k"]:
            name = f"gsm8k:{p['index']}"
            if not self.wanted(name):
                continue
            ids = core.gsm8k_prompt_ids(p["index"], p["input"])

            def again(r: int, ids: list[int] = ids) -> Measurement:
                client.post("/flush_cache")  # the same prompt again, not from the prefix cache
                return client.stream("/v1/completions", completion(ids, 1))

            with _profile(name):
                client.post("/flush_cache")
                m = client.stream("/v1/completions", {**completion(ids, self.cfg["mtp_max_tokens"]),
                                                      "ignore_eos": False})
                ttft = self.ttft(m, again) * self.skew
            n, steps = m.tokens, max(m.chunks, 1)
            tpot = m.step_ms * self.skew * steps / (n - 1) if n > 1 else 0.0
            import re  # only here: with enum and functools ~5 ms of every benchmark's start

            found = re.findall(_ANSWER, m.text)
            pred = found[-1].replace(",", "") if found else "[invalid]"
            truth = str(p["truth"])
            out.rows.append(Row("mtp", {
                "Model": t["model"], "Size": t["size"], "PrefillLen(tokens)": str(p["input"]), "Batch": "1",
                "NChip": "1", "Input(tokens)": str(p["input"]), "Output(tokens)": str(n),
                "Prefill(tps)": _f2(p["input"] / ttft * 1000), "TTFT(ms)": _f2(ttft),
                "Decode(tps)": _f2(1000 / tpot if tpot else 0.0), "TPOT(ms)": _f2(tpot),
                "Prefix(tokens)": str(m.cached), "Prompt Index": str(p["index"]),
                "accept rate((acclen-1)/(4-1))": core.fmt_num((n - 1 - steps) / ((d - 1) * steps), 4),
                "accept rate(acclen/4)": core.fmt_num(n / (d * steps), 4),
                "Prediction": pred, "Ground Truth": truth, "Correct": "TRUE" if pred == truth else "FALSE",
            }))

    # -- VL vision (frames per second from two frame counts)
    def vision_inputs(self) -> list[int]:
        v = self.cfg["vision"]
        return [i for i in v["inputs"] if self.wanted(f"vision:{v['new']}:{i}")]

    def run_vision(self, client: Client, out: Result, inp: int, warmed: bool) -> None:
        """One VL vision row; ``warmed``: its shared prefix was cached by the sweep just now."""
        v = self.cfg["vision"]
        t = self.table("vision")
        lo, hi, new = v["frames_lo"], v["frames_hi"], v["new"]
        prefix = inp - new
        pre = shared_prefix(inp, prefix)

        def request(tag: str, r: int, frames: int, max_tokens: int) -> Measurement:
            text = f"{pre} {core.words(f'v{tag}{inp}_{r}_', new)}" if pre else core.words(f"v{tag}{inp}_{r}_", new)
            return client.stream("/v1/chat/completions", chat(text, frames, max_tokens))

        with _profile(f"vision:{new}:{inp}"):
            if prefix and not warmed:
                client.stream("/v1/chat/completions", chat(pre, 0, 1))
            b = request("b", 0, hi, v["output"])
            hi_ttft = self.ttft(b, lambda r: request("b", r, hi, 1), VISION_SPREAD) * self.skew
            lo_ttft = self.ttft(request("a", 0, lo, 1), lambda r: request("a", r, lo, 1), VISION_SPREAD) * self.skew
        frame_ms = (hi_ttft - lo_ttft) / (hi - lo)
        fps = 1000 / frame_ms if frame_ms > 0 else 0.0
        prefill_ms = lo_ttft - lo * frame_ms
        tpot = b.tpot_ms * self.skew
        out.rows.append(Row("vision", {
            "Model": t["model"], "Size": t["size"], "PrefillLen(k)": _f3(new / 1000), "Ctx(k)": str(self.ctx_k),
            "Batch": "1", "NChip": "1", "Input(k)": _f3(inp / 1000), "Output(k)": _f3(v["output"] / 1000),
            "Prefill(tps)": _f3(new / prefill_ms * 1000 if prefill_ms > 0 else 0.0),
            "Decode(tps)": _f3(1000 / tpot if tpot else 0.0), "Vision(fps)": _f3(fps),
            "Precision": t.get("precision", ""),
        }, order=inp))

    def run(self, client: Client, out: Result) -> None:
        kinds = [t["kind"] for t in self.kc["tables"]]
        if "mtp" in kinds:
            self.run_mtp(client, out)
            return
        if "vision" not in kinds:
            self.run_sweep(client, out)
            return
        pending = self.vision_inputs()

        def after(inp: int) -> None:  # a vision row right after the sweep row of the same shared prefix
            if inp in pending:
                pending.remove(inp)
                self.run_vision(client, out, inp, warmed=True)

        self.run_sweep(client, out, after)
        for inp in list(pending):
            self.run_vision(client, out, inp, warmed=False)

    def render(self, rows: list[Row], faults: frozenset[str]) -> str:
        """The seed's table text for ``rows``; ``bad-table`` breaks one row on purpose, ``no-decode`` leaves the
        Decode(tps) column out (a release whose benchmark dropped a metric)."""
        parts: list[str] = []
        broken = "bad-table" not in faults
        for t in self.kc["tables"]:
            mine = sorted((r for r in rows if r.kind == t["kind"]), key=lambda r: r.order)
            if not mine:
                continue
            title = t["title"] or ("" if parts else self.kc["tables"][0]["title"])  # alone: say whose it is
            if title:
                parts.append(title + "\n\n")
            columns = [c for c in t["columns"] if c != "Decode(tps)" or "no-decode" not in faults]
            lines = ["\t".join(columns)]
            for r in mine:
                cells = [r.cells[c] for c in columns]
                if not broken and len(lines) == 3:
                    cells = cells[:-2]
                    broken = True
                lines.append("\t".join(cells))
            if not broken:  # fewer than 3 rows: break the last one
                lines[-1] = "\t".join(lines[-1].split("\t")[:-2])
                broken = True
            parts.append("\n".join(lines) + "\n\n")
        return "".join(parts)


class _profile:
    """Adds the profile name to an error raised inside (and translates connection errors)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        return None

    def __exit__(self, et: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if exc is None:
            return
        if isinstance(exc, BenchError):
            raise BenchError(f"profile {self.name}: {exc}") from exc
        if isinstance(exc, (OSError, ValueError)):
            what = type(exc).__name__
            detail = f"{what}: {exc}" if str(exc) else what
            raise BenchError(f"profile {self.name}: lost the server connection ({detail})") from exc


# ---------------------------------------------------------------------------- main


def _target(env: dict[str, str] | Any) -> Target:
    host = env.get("SERVER_HOST") or "127.0.0.1"
    raw = env.get("SERVER_PORT") or "30000"
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise BenchError(f"SERVER_PORT {raw!r} is not a port number")
    return Target(host, int(raw))


def _check_server(key: str, cfg: dict[str, Any], target: Target) -> dict[str, Any]:
    start = cfg["keys"][key]["start_script"]
    probe = Client(target, 1.0)
    try:
        status, _ = probe.get("/health", timeout=10)
        if status != 200:
            raise BenchError(f"the server at {target.url} is not ready (/health answered HTTP {status})")
        _, info = probe.get("/get_server_info", timeout=10)
    except ConnectionRefusedError:
        raise BenchError(f"no server is listening on {target.url}: start scripts/ci/musa/{start} first") from None
    except TimeoutError:
        raise BenchError(f"the server at {target.url} does not answer /health") from None
    except (OSError, ProtocolError) as exc:
        raise BenchError(f"cannot reach the server at {target.url}: {exc}") from None
    finally:
        probe.close()
    sim = info.get("m1000_sim") if isinstance(info, dict) else None
    if not isinstance(sim, dict):
        raise BenchError(f"the server at {target.url} is not this release's server (no m1000_sim server info)")
    if sim.get("model_key") != key:
        raise BenchError(f"the server at {target.url} serves {sim.get('model_key')} "
                         f"({info.get('model_path')}), not MODEL_KEY={key}: start scripts/ci/musa/{start}"
                         + (" with the MTP variables" if cfg["keys"][key]["mtp"] else ""))
    return info


def _results_dir(env: dict[str, str] | Any) -> str:
    root = env.get("SGLANG_MUSA_RELEASE_DIR") or os.path.normpath(os.path.join(release_file(""), "..", "..", ".."))
    path = os.path.join(root, "benchmark_results")
    os.makedirs(path, exist_ok=True)
    return path


def main(env: dict[str, str] | Any = None, out: Any = None) -> int:
    env = os.environ if env is None else env
    out = sys.stdout if out is None else out
    key = (env.get("MODEL_KEY") or "").strip()
    if not key:
        return fail(PROG, f"MODEL_KEY is not set (one of: {', '.join(core.MODEL_KEYS)})", 2)
    try:
        cfg = read_json(release_file("bench_config.json"))
        if key not in cfg["keys"]:
            return fail(PROG, f"unknown MODEL_KEY {key!r} (known: {', '.join(cfg['keys'])})", 2)
        missing = [n for n in ("SGLANG_MUSA_RELEASE_DIR", "TILELANG_WORKFLOW_FILE") if not env.get(n)]
        if missing:
            raise BenchError(f"{', '.join(missing)} not set: run 'source scripts/ci/musa/setup_env.sh' first")
        faults = core.faults_for(load_knobs(env).faults, key)
        target = _target(env)
        info = _check_server(key, cfg, target)
        output_len = int(env.get("BENCH_OUTPUT_LEN") or cfg["profiles"]["output"])
        only = frozenset(p.strip() for p in (env.get("BENCH_PROFILES") or "").split(",") if p.strip())
        repeats = int(env.get("BENCH_REPEATS") or 4)
        if output_len < 2 or repeats < 1:
            raise BenchError("BENCH_OUTPUT_LEN must be at least 2 and BENCH_REPEATS at least 1")
        bench = Bench(key=key, cfg=cfg, ctx_k=round(int(info["max_total_tokens"]) / 1024),
                      draft=int(info.get("speculative_num_draft_tokens") or 4), output_len=output_len, only=only,
                      repeats=repeats, skew=core.bench_skew(faults, env))
        profile_set = (env.get("BENCH_PROFILE_SET") or "all").strip()
        if profile_set not in ("all", "scale"):
            raise BenchError(f"BENCH_PROFILE_SET: {profile_set!r} is not 'all' or 'scale'")
        if profile_set == "scale" and not only:
            bench = bench._replace(only=bench.scale_set())
        unknown = sorted(only - set(bench.profiles()))
        if unknown:
            raise BenchError(f"BENCH_PROFILES: unknown profile(s) {', '.join(unknown)} for {key} "
                             f"(known: {', '.join(bench.profiles())})")
        results = _results_dir(env)
    except (core.SimError, ValueError) as exc:
        return fail(PROG, str(exc))
    raise_priority(env)
    client = Client(target, float(info["m1000_sim"]["time_scale"]))
    result = Result()
    print(f"[bench] MODEL_KEY={key} server {target.url} ({info['model_path']}), "
          f"time scale {client.scale:g}", file=sys.stderr, flush=True)
    try:
        bench.run(client, result)
    except BenchError as exc:
        if result.rows:
            text = bench.render(result.rows, frozenset())
            out.write(text)
            out.flush()
            write_atomic(os.path.join(results, f"{key}.partial.tsv"), text)
        return fail(PROG, f"MODEL_KEY={key}: {exc} ({len(result.rows)} row(s) measured before)")
    finally:
        client.close()
    if "no-table" in faults:
        print(f"[bench] MODEL_KEY={key}: finished", file=out, flush=True)
        return 0
    text = bench.render(result.rows, faults)
    out.write(text)
    out.flush()
    write_atomic(os.path.join(results, f"{key}.tsv"), text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
