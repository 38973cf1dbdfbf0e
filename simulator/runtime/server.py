"""The simulated SGLang-MUSA inference server (OpenAI-compatible HTTP, streaming).

Started in the foreground by ``start_*_server.sh`` (``exec``), standard library only.
Endpoints: ``/health``, ``/v1/models``, ``/get_server_info``, ``/v1/completions`` and
``/v1/chat/completions`` (``stream`` with server-sent events, ``usage`` token counts,
``stream_options.continuous_usage_stats``). Tokens are paced by the fitted model
(:mod:`.core`) at ``1 / time_scale`` of module time, on absolute deadlines. Its HTTP/1.1 handler
(:class:`HTTPHandler`, not ``http.server``): decision record docs/adr/0005-simulator-stand-ins.md.
"""

from __future__ import annotations

import _thread
import os
import sys
import time
from _struct import pack

from . import core, device, jsonc, net
from .common import console_line, fail, load_knobs, model_identity, raise_priority, release_file

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~3 ms of each interpreter's start)
if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from typing import Any, NamedTuple
else:
    from .record import NamedTuple

PROG = "sglang server"
ANCHOR_WINDOW_NS = 2_000_000_000  # a kernel receive time older than this is not believed (a clock step)
ANCHOR_SLACK_NS = 1_000_000  # nor one later than the read by more (the two clocks' offset is read, not exact)


class PrefixCache:
    """Token-id prefix cache (radix-cache stand-in): longest cached prefix, LRU, bounded in tokens.

    Entries are the ids packed into bytes, so that a common prefix is found by comparing
    bytes (a binary search of C-level compares) rather than token by token; a dict in
    least-recently-used order (no OrderedDict, no array: collections is ~2.5 ms of a start).
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.entries: dict[bytes, None] = {}
        self.size = 0

    @staticmethod
    def _pack(ids: Sequence[int]) -> bytes:
        return pack(f"={len(ids)}I", *ids)  # array("I", ids).tobytes()

    @staticmethod
    def _common(a: bytes, b: bytes) -> int:
        """Length in tokens of the common prefix of two packed id sequences."""
        lo, hi = 0, min(len(a), len(b)) // _ID_BYTES
        if hi == 0 or a[:_ID_BYTES] != b[:_ID_BYTES]:
            return 0
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if a[:mid * _ID_BYTES] == b[:mid * _ID_BYTES]:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def match(self, ids: Sequence[int]) -> int:
        packed = self._pack(ids)
        best, best_key = 0, None
        for key in self.entries:
            n = self._common(key, packed)
            if n > best:
                best, best_key = n, key
        if best_key is not None:  # most recently used: last
            del self.entries[best_key]
            self.entries[best_key] = None
        return min(best, max(len(ids) - 1, 0))  # at least one token is always computed

    def insert(self, ids: Sequence[int]) -> None:
        packed = self._pack(ids)
        if not ids or len(ids) > self.capacity or packed in self.entries:
            return
        self.entries[packed] = None
        self.size += len(ids)
        while self.size > self.capacity:
            old = next(iter(self.entries))  # least recently used
            del self.entries[old]
            self.size -= len(old) // _ID_BYTES


_ID_BYTES = 4  # a packed id ("=I")


class Config(NamedTuple):
    host: str
    port: int
    model_path: str
    served_name: str
    key: str
    max_total_tokens: int
    draft_tokens: int | None
    spec_args: dict[str, Any]
    knobs: core.Knobs


class DevicePhase:
    """What the simulated device is doing, for the module's simulated ``mthreads-gmi`` (``simulator/device/``).

    ``<phase> <pid>`` (idle, prefill, decode) in ``$M1000_SIM_DEVICE_DIR/phase``, replaced whole on
    each change (write, rename; no fsync: a lost update only mis-states one sample). Nothing is
    written without the variable.
    """

    def __init__(self, folder: str | None) -> None:
        self.path = os.path.join(folder, "phase") if folder else None
        self.pid = os.getpid()
        self.current = ""

    def set(self, phase: str) -> None:
        if self.path is None or phase == self.current:
            return
        self.current = phase
        tmp = f"{self.path}.{self.pid}.tmp"
        try:
            with open(tmp, "w", encoding="ascii") as fh:
                fh.write(f"{phase} {self.pid}\n")
            os.replace(tmp, self.path)
        except OSError:
            pass


class Flag:
    """Set once, read by every connection's thread: ``threading.Event`` without threading (with the functools and
    collections it imports, ~4 ms of every server's start; the server's threads are ``_thread``'s)."""

    __slots__ = ("_set",)

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


def block_forever() -> None:
    """This thread stops here for good (the hang fault)."""
    lock = _thread.allocate_lock()
    lock.acquire()
    lock.acquire()


class State:
    """Mutable server state: readiness, request counter, prefix cache, fault state."""

    def __init__(self, cfg: Config, setup: core.Setup, faults: frozenset[str],
                 device: DevicePhase | None = None) -> None:
        self.cfg = cfg
        self.setup = setup
        self.faults = faults
        self.ready = Flag()
        self.hung = Flag()
        self.lock = _thread.allocate_lock()
        self.requests = 0
        self.cache = PrefixCache(cfg.max_total_tokens)
        self.device = device or DevicePhase(None)
        self.sched = core_device(cfg, setup)
        self.jit_dir = ""  # fault lazy-jit: where this server's kernels compiled on demand go ("": precompiled)
        self.jit_done: set[int] = set()

    def next_request(self) -> int:
        with self.lock:
            self.requests += 1
            return self.requests


def core_device(cfg: Config, setup: core.Setup) -> device.Device:
    """The shared device of this server: KV capacity ``max-total-tokens``; batching several prefills saves what
    the fitted cold curve says one prompt of their summed new tokens saves (never less than nothing)."""
    pts = setup.data.get("prefill_np") if setup.mtp is None else None
    if not pts:
        return device.Device(cfg.max_total_tokens)

    def cold(n: int) -> float:
        return max(core.interp(pts, n, extrapolate=True), 1.0)

    def saving(jobs: list[device.Job]) -> float:
        return max(sum(cold(j.new) for j in jobs) - cold(sum(j.new for j in jobs)), 0.0)

    return device.Device(cfg.max_total_tokens, saving)


class BadRequest(Exception):
    pass


def _prompt_ids(body: dict[str, Any], chat: bool) -> tuple[list[int], int]:
    """(token ids, video frames / images) of a request body."""
    if not chat:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            return core.word_ids(prompt), 0
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            return core.word_ids(prompt[0]), 0
        if isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            if any(t < 0 or t >= core.VOCAB_SIZE for t in prompt):
                raise BadRequest(f"prompt token ids must be in [0, {core.VOCAB_SIZE})")
            return list(prompt), 0
        raise BadRequest("'prompt' must be a string or a list of token ids")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list")
    texts: list[str] = []
    frames = 0
    for i, msg in enumerate(messages):
        content = msg.get("content") if isinstance(msg, dict) else None
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind == "text":
                    texts.append(str(part.get("text", "")))
                elif kind in ("image_url", "image", "video_frame"):
                    frames += 1
                else:
                    raise BadRequest(f"messages[{i}]: unsupported content part type {kind!r}")
        else:
            raise BadRequest(f"messages[{i}]: 'content' must be a string or a list of parts")
    return core.word_ids(" ".join(texts)), frames


def _max_tokens(body: dict[str, Any]) -> int:
    v = body.get("max_tokens", body.get("max_completion_tokens", 16))
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise BadRequest("'max_tokens' must be a positive integer")
    return v


class Headers(dict[str, str]):
    """Request header fields by lower-case name."""

    def get(self, name: str, default: Any = None) -> Any:
        return super().get(name.lower(), default)


class HTTPHandler:
    """HTTP/1.1 with keep-alive: request line, headers, a ``Content-Length`` body.

    The little of ``http.server`` this server uses, without importing it (it pulls in
    ``http.client`` and ``email``: more CPU per start than a short key spends serving,
    on every simulated module). Subclasses define ``do_GET`` and ``do_POST``. One instance
    serves one connection, on its thread (:class:`.net.Listener`), as ``socketserver``'s
    ``StreamRequestHandler`` does.
    """

    server_version = "sglang-musa-sim"
    max_line = 65536
    max_headers = 100

    def __init__(self, conn: net.Socket, client_address: tuple[str, int]) -> None:
        self.connection = conn
        self.client_address = client_address
        net.no_delay(conn)
        self.rfile = net.reader(conn)
        self.wfile = net.Writer(conn)
        try:
            self.handle()
        finally:
            self.rfile.close()

    def handle(self) -> None:
        self.close_connection = False
        while not self.close_connection:
            if not self._read_request():
                return
            handler = getattr(self, f"do_{self.command}", None)
            if handler is None:
                self.send_error(501, f"unsupported method {self.command!r}")
                return
            handler()
            self.wfile.flush()

    def _read_request(self) -> bool:
        line = self.rfile.readline(self.max_line + 1)
        if not line:
            return False
        if len(line) > self.max_line:
            self.send_error(414, "request line too long")
            return False
        parts = line.decode("latin-1").split()
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            self.send_error(400, f"bad request line {line[:80]!r}")
            return False
        self.command, self.path, version = parts
        self.arrived_ns = self.rfile.raw.stamp_ns  # type: ignore[attr-defined]  # the request line's, by the kernel
        self.headers = Headers()
        for _ in range(self.max_headers + 1):
            field = self.rfile.readline(self.max_line + 1)
            if field in (b"\r\n", b"\n"):
                break
            name, sep, value = field.decode("latin-1").partition(":")
            if not sep or not name.strip():
                self.send_error(400, "bad header line")
                return False
            self.headers[name.strip().lower()] = value.strip()
        else:
            self.send_error(431, "too many header fields")
            return False
        conn = self.headers.get("Connection", "").lower()
        self.close_connection = conn == "close" or (version == "HTTP/1.0" and conn != "keep-alive")
        self._head: list[str] = []
        return True

    def send_response(self, code: int) -> None:
        self._head = [f"HTTP/1.1 {code} {_REASONS.get(code, 'Unknown')}", f"Server: {self.server_version}"]
        if self.close_connection:
            self._head.append("Connection: close")

    def send_header(self, name: str, value: str) -> None:
        self._head.append(f"{name}: {value}")

    def end_headers(self) -> None:
        self.wfile.write(("\r\n".join(self._head) + "\r\n\r\n").encode("latin-1"))
        self._head = []

    def send_error(self, code: int, message: str) -> None:
        self.close_connection = True
        data = jsonc.dumps({"error": {"message": message, "code": code}}).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 414: "URI Too Long",
            431: "Request Header Fields Too Large", 500: "Internal Server Error", 501: "Not Implemented",
            503: "Service Unavailable"}


class Handler(HTTPHandler):
    state: State  # set on the subclass made per server

    # -- plumbing
    def _json(self, status: int, payload: dict[str, Any]) -> None:
        data = jsonc.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str) -> None:
        kind = "invalid_request_error" if status == 400 else "server_error"
        self._json(status, {"error": {"message": message, "type": kind, "code": status}, "object": "error"})

    def _hang_if_hung(self) -> None:
        if self.state.hung.is_set():
            block_forever()  # stop answering for good

    # -- routes
    def do_GET(self) -> None:  # http.server's naming
        self._hang_if_hung()
        st = self.state
        path = self.path.split("?", 1)[0]
        if path in ("/health", "/health_generate"):
            if st.ready.is_set():
                self._json(200, {"status": "ok"})
            else:
                self._json(503, {"status": "loading"})
        elif path == "/v1/models":
            self._json(200, {"object": "list", "data": [{
                "id": st.cfg.served_name, "object": "model", "owned_by": "sglang", "root": st.cfg.model_path,
                "max_model_len": st.cfg.max_total_tokens}]})
        elif path == "/get_server_info":
            self._json(200, self._server_info())
        else:
            self._error(404, f"no route {path}")

    def _server_info(self) -> dict[str, Any]:
        cfg = self.state.cfg
        return {
            "model_path": cfg.model_path,
            "served_model_name": cfg.served_name,
            "max_total_tokens": cfg.max_total_tokens,
            "host": cfg.host,
            "port": cfg.port,
            **cfg.spec_args,
            "sglang_use_tl_moe_grouped_gemm": os.environ.get("SGLANG_USE_TL_MOE_GROUPED_GEMM", "1"),
            "m1000_sim": {"model_key": cfg.key, "time_scale": cfg.knobs.time_scale, "noise": cfg.knobs.noise,
                          "speed": str(cfg.knobs.speed), "ready": self.state.ready.is_set()},
        }

    def do_POST(self) -> None:
        received = time.monotonic_ns()
        self._hang_if_hung()
        path = self.path.split("?", 1)[0]
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if path == "/flush_cache":
            with self.state.lock:
                self.state.cache = PrefixCache(self.state.cfg.max_total_tokens)
            self._json(200, {"message": "Cache flushed."})
            return
        if path not in ("/v1/completions", "/v1/chat/completions"):
            self._error(404, f"no route {path}")
            return
        if not self.state.ready.is_set():
            self._error(503, "server is still loading")
            return
        try:
            try:
                body = jsonc.loads(raw or b"null")
            except ValueError as exc:  # json.JSONDecodeError, or a body that is not UTF-8
                raise BadRequest(str(exc)) from None
            if not isinstance(body, dict):
                raise BadRequest("request body must be a JSON object")
            self._generate(body, chat=path == "/v1/chat/completions", t0=self._anchor(received))
        except (BadRequest, core.PlanError) as exc:
            self._error(400, str(exc))
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    def _anchor(self, received: int) -> float:
        """Start of the module-time clock (monotonic seconds): when the request's first bytes reached this
        machine's kernel, when it says and plausibly; else when this thread had read the request's head.

        At time scale N every wall millisecond between the client's send and this thread's reading it (the
        accept, a thread started, the header lines parsed, a wake-up late on a busy machine) would cost N module
        milliseconds of TTFT; the kernel's receive time has none of them, for any client (docs/adr/0038).
        """
        if self.arrived_ns:
            arrived = self.arrived_ns - (time.time_ns() - time.monotonic_ns())  # CLOCK_REALTIME to monotonic
            if -ANCHOR_SLACK_NS <= received - arrived <= ANCHOR_WINDOW_NS:
                return min(arrived, received) / 1e9
        return received / 1e9

    def _generate(self, body: dict[str, Any], chat: bool, t0: float) -> None:
        st = self.state
        ids, frames = _prompt_ids(body, chat)
        max_tokens = _max_tokens(body)
        total = len(ids) + max_tokens
        if not ids:
            raise BadRequest("empty prompt")
        if total > st.cfg.max_total_tokens:
            raise BadRequest(
                f"requested {len(ids)} prompt tokens + {max_tokens} max_tokens = {total} tokens, "
                f"more than max-total-tokens={st.cfg.max_total_tokens}")
        with st.lock:
            cached = st.cache.match(ids)
            st.cache.insert(ids)
        req_no = st.next_request()
        knobs = st.cfg.knobs
        npf, ndf, nvf = core.noise_factors(knobs.noise, knobs.seed, req_no)
        k = st.cfg.key
        factors = core.Factors(
            prefill=knobs.speed.factor(k, "prefill") * npf,
            decode=knobs.speed.factor(k, "decode") * ndf,
            accept=knobs.speed.factor(k, "accept"),
            vision=knobs.speed.factor(k, "vision") * nvf,
        )
        known = core.prompt_hash(ids) if st.cfg.draft_tokens else ""  # only speculative setups know prompts
        plan = st.setup.plan(prompt_len=len(ids), cached=cached, max_tokens=max_tokens, frames=frames,
                             prompt_hash=known, factors=factors, draft_tokens=st.cfg.draft_tokens)
        stream = bool(body.get("stream", False))
        opts = body.get("stream_options") or {}
        ctx = _Stream(self, chat=chat, model=st.cfg.served_name, prompt_tokens=len(ids), cached=cached,
                      include_usage=bool(opts.get("include_usage")),
                      continuous=bool(opts.get("continuous_usage_stats")))
        fault = None
        if req_no == core.FAULT_AT_REQUEST:
            fault = "crash" if "crash" in st.faults else "hang" if "hang" in st.faults else None
        steps, prev = [], 0.0
        for offset, count in plan.emits:
            steps.append((offset - prev, count))
            prev = offset
        ttft_ms = plan.ttft_ms + _jit_compile(st, len(ids) - cached)  # fault lazy-jit: a compile first
        job = device.Job(t0 * 1000.0 * knobs.time_scale, ttft_ms, steps, new=max(len(ids) - cached, 1),
                         kv=total)
        with st.lock:
            st.sched.submit(job)
        st.device.set("prefill")
        try:
            if stream:
                self._stream(plan, ctx, job, fault)
            else:
                self._whole(plan, ctx, job, fault)
        finally:
            with st.lock:
                st.sched.cancel(job)
            st.device.set("idle")

    def _strike(self, fault: str) -> None:
        if fault == "crash":
            print(f"{PROG}: fault crash: the server process dies in the middle of a request", file=sys.stderr,
                  flush=True)
            import signal  # only here: its import builds enums (~1 ms of every server's start)

            os.kill(os.getpid(), signal.SIGKILL)
        self.state.hung.set()
        print(f"{PROG}: fault hang: the server stops answering", file=sys.stderr, flush=True)
        block_forever()

    def _chunks(self, job: device.Job) -> Iterator[tuple[int, int]]:
        """(index, tokens) of each chunk of ``job``, each when the device has it due (this thread sleeps until
        then, on absolute times: a late wake-up does not delay the next chunk)."""
        st = self.state
        ms = 1000.0 * st.cfg.knobs.time_scale  # module ms per wall second
        total = len(job.steps) + 1
        i = 0
        while i < total:
            with st.lock:
                now = time.monotonic() * ms
                st.sched.advance(now)
                due = job.chunks[i][0] if i < len(job.chunks) else None
                wake = due if due is not None else st.sched.free_at
            if due is None and wake <= now:
                time.sleep(0.0005)  # nothing decided yet (the device waits for room): look again soon
                continue
            _sleep_until(wake / ms)
            if due is not None:
                yield i, job.chunks[i][1]
                i += 1

    def _whole(self, plan: core.Plan, ctx: _Stream, job: device.Job, fault: str | None) -> None:
        for i, _ in self._chunks(job):
            if i == 0:
                if fault:
                    self._strike(fault)
                self.state.device.set("decode")
        text = "".join(core.completion_pieces(plan.n, plan.answer))
        self._json(200, ctx.whole(text, plan))

    def _stream(self, plan: core.Plan, ctx: _Stream, job: device.Job, fault: str | None) -> None:
        """One chunk per device step: one token per chunk in plain decoding (as sglang's default stream interval),
        the accepted tokens of a verify step in speculative decoding."""
        pieces = core.completion_pieces(plan.n, plan.answer)
        ctx.begin()
        strike_at = len(plan.emits) // 2 if fault else -1
        sent = 0
        for i, count in self._chunks(job):
            done = sent + count >= plan.n
            ctx.send(pieces[sent:sent + count], sent + count, plan.finish if done else None)
            sent += count
            if i == 0:
                ctx.ttft_ms = time.monotonic() * 1000.0 * self.state.cfg.knobs.time_scale - job.arrival
                self.state.device.set("decode")
                if fault and not plan.emits:
                    self._strike(fault)
            elif fault and i - 1 >= strike_at:
                self._strike(fault)
        ctx.end(sent)


def jit_bucket(new_tokens: int) -> int:
    """The prefill shape bucket a kernel is compiled for: the next power of two, at least LAZY_JIT_MIN_BUCKET."""
    return max(core.LAZY_JIT_MIN_BUCKET, 1 << (max(new_tokens, 1) - 1).bit_length())


def _jit_compile(st: State, new_tokens: int) -> float:
    """Fault lazy-jit: module ms this request spends compiling its bucket's kernel (0: compiled already, or no
    fault); the kernel file is written to the cache as the compile starts."""
    if not st.jit_dir:
        return 0.0
    bucket = jit_bucket(new_tokens)
    with st.lock:
        if bucket in st.jit_done:
            return 0.0
        st.jit_done.add(bucket)
    path = os.path.join(st.jit_dir, f"prefill_n{bucket}.cubin.json")
    if os.path.exists(path):  # compiled by an earlier server of this release: cached
        return 0.0
    os.makedirs(st.jit_dir, exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(jsonc.dumps({"kernel": "prefill", "bucket": bucket, "model": st.setup.data["model_dir"]}) + "\n")
    os.replace(tmp, path)
    print(f"{PROG}: compiling TileLang kernel prefill_n{bucket} (not precompiled)", file=sys.stderr, flush=True)
    return core.LAZY_JIT_MS


def _sleep_until(deadline: float) -> None:
    delay = deadline - time.monotonic()
    if delay > 0:
        time.sleep(delay)


class _Stream:
    """Formats OpenAI response objects and writes server-sent events as HTTP chunks."""

    def __init__(self, h: Handler, *, chat: bool, model: str, prompt_tokens: int, cached: int,
                 include_usage: bool, continuous: bool) -> None:
        self.h = h
        self.chat = chat
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.cached = cached
        self.include_usage = include_usage
        self.continuous = continuous
        self.id = ("chatcmpl-" if chat else "cmpl-") + os.urandom(12).hex()  # uuid's import is ~13 ms of CPU
        self.created = int(time.time())
        self.object = "chat.completion.chunk" if chat else "text_completion"
        self.first = True
        self.ttft_ms: float | None = None  # module ms from the request's arrival to its first chunk written

    def usage(self, n: int) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": n, "total_tokens": self.prompt_tokens + n,
                "prompt_tokens_details": {"cached_tokens": self.cached}}

    def _chunk(self, payload: bytes) -> None:
        self.h.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))

    def begin(self) -> None:
        h = self.h
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Cache-Control", "no-cache")
        h.send_header("Transfer-Encoding", "chunked")
        h.end_headers()

    def send(self, pieces: list[str], n: int, finish: str | None) -> None:
        text = "".join(pieces)
        if self.chat:
            delta: dict[str, Any] = {"content": text}
            if self.first:
                delta["role"] = "assistant"
            choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        self.first = False
        obj: dict[str, Any] = {"id": self.id, "object": self.object, "created": self.created, "model": self.model,
                               "choices": [choice]}
        if self.continuous:
            obj["usage"] = self.usage(n)
        self._chunk(b"data: " + jsonc.dumps(obj, separators=(",", ":")).encode() + b"\n\n")

    def end(self, n: int) -> None:
        if self.include_usage:
            obj = {"id": self.id, "object": self.object, "created": self.created, "model": self.model,
                   "choices": [], "usage": self.usage(n)}
            if self.ttft_ms is not None:  # what this server did, for a client that wants to know where time went
                obj["m1000_sim"] = {"ttft_ms": round(self.ttft_ms, 3)}
            self._chunk(b"data: " + jsonc.dumps(obj, separators=(",", ":")).encode() + b"\n\n")
        self._chunk(b"data: [DONE]\n\n")
        self.h.wfile.write(b"0\r\n\r\n")

    def whole(self, text: str, plan: core.Plan) -> dict[str, Any]:
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                      "finish_reason": plan.finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": plan.finish}
        return {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model, "choices": [choice], "usage": self.usage(plan.n)}


# ---------------------------------------------------------------------------- start-up


class Args(NamedTuple):
    """The server's command line (the options of ``python -m sglang.launch_server`` the release's scripts pass)."""

    model_path: str | None = None
    workflow_model: str | None = None
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: str = "30000"
    max_total_tokens: int = 16384
    tp_size: int = 1
    trust_remote_code: bool = False
    speculative_algorithm: str | None = None
    speculative_num_steps: int | None = None
    speculative_eagle_topk: int | None = None
    speculative_num_draft_tokens: int | None = None


_OPTIONS = {"--model-path": "model_path", "--workflow-model": "workflow_model",
            "--served-model-name": "served_model_name", "--host": "host", "--port": "port",
            "--max-total-tokens": "max_total_tokens", "--tp-size": "tp_size", "--tp": "tp_size",
            "--speculative-algorithm": "speculative_algorithm", "--speculative-num-steps": "speculative_num_steps",
            "--speculative-eagle-topk": "speculative_eagle_topk",
            "--speculative-num-draft-tokens": "speculative_num_draft_tokens"}
_INT_OPTIONS = frozenset({"max_total_tokens", "tp_size", "speculative_num_steps", "speculative_eagle_topk",
                          "speculative_num_draft_tokens"})
USAGE = ("usage: sglang server (--model-path PATH | --workflow-model NAME) [--served-model-name NAME] [--host HOST] "
         "[--port PORT] [--max-total-tokens N] [--tp-size N] [--trust-remote-code] [--speculative-algorithm NAME] "
         "[--speculative-num-steps N] [--speculative-eagle-topk N] [--speculative-num-draft-tokens N]")


class UsageError(core.SimError):
    """A malformed command line (exit status 2, as argparse's)."""


def parse_args(argv: list[str]) -> tuple[Args, list[str]]:
    """(options, arguments it does not know), without argparse (~3 ms of every server's start, with ``re``):
    ``--opt VALUE`` or ``--opt=VALUE``; UsageError naming the option when a value is missing or not an integer,
    or when not exactly one of --model-path and --workflow-model is given."""
    values: dict[str, str | int | bool] = {}
    unknown: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--trust-remote-code":
            values["trust_remote_code"] = True
            continue
        flag, eq, value = arg.partition("=")
        name = _OPTIONS.get(flag)
        if name is None:
            unknown.append(arg)
            continue
        if not eq:
            if i == len(argv) or argv[i].startswith("--"):
                raise UsageError(f"argument {flag}: expected one argument")
            value = argv[i]
            i += 1
        if name in _INT_OPTIONS:
            try:
                values[name] = int(value)
            except ValueError:
                raise UsageError(f"argument {flag}: invalid int value: {value!r}") from None
        else:
            values[name] = value
    if ("model_path" in values) == ("workflow_model" in values):
        raise UsageError("exactly one of the arguments --model-path --workflow-model is required")
    return Args(**values), unknown  # type: ignore[arg-type]


def configure(argv: list[str], env: dict[str, str] | Any, model: core.Model, knobs: core.Knobs) -> Config:
    """Validate the command line and environment; raises SimError with one clear line."""
    args, unknown = parse_args(argv)
    if unknown:
        raise core.SimError(f"unknown server argument(s): {' '.join(unknown)}")
    try:
        port = int(args.port)
    except ValueError:
        raise core.SimError(f"--port {args.port!r} is not a port number") from None
    if not 0 < port < 65536:
        raise core.SimError(f"--port {port} is out of range")
    if args.workflow_model is not None:
        from .workflow import model_path  # the start scripts' lookup, in this process (no extra interpreter)

        path = model_path(env, args.workflow_model)
    else:
        path = str(args.model_path)  # parse_args: one of the two
    identity = model_identity(path)
    entry = model.identify(identity)
    if entry is None:
        raise core.SimError(f"model at {path} ({identity}) is not a model this release supports")
    spec: dict[str, Any] = {"speculative_algorithm": args.speculative_algorithm}
    draft = None
    key = entry["key"]
    if args.speculative_algorithm:
        if args.speculative_algorithm.upper() not in ("NEXTN", "EAGLE", "EAGLE3"):
            raise core.SimError(f"--speculative-algorithm {args.speculative_algorithm!r} is not supported")
        if entry.get("mtp_key") is None:
            raise core.SimError(f"model {identity} has no MTP (NEXTN) draft layers for speculative decoding")
        if env.get("SGLANG_USE_TL_MOE_GROUPED_GEMM", "1") != "0":
            raise core.SimError("speculative decoding needs SGLANG_USE_TL_MOE_GROUPED_GEMM=0 "
                                "(the TileLang grouped MoE GEMM does not support draft verification)")
        draft = args.speculative_num_draft_tokens or 4
        steps = args.speculative_num_steps or draft - 1
        if steps + 1 != draft:
            raise core.SimError(f"--speculative-num-draft-tokens {draft} must be --speculative-num-steps + 1 "
                                f"({steps + 1}) with --speculative-eagle-topk 1")
        key = entry["mtp_key"]
        spec.update(speculative_num_steps=steps, speculative_eagle_topk=args.speculative_eagle_topk or 1,
                    speculative_num_draft_tokens=draft)
    if args.max_total_tokens > model.max_total_tokens:
        raise core.SimError(f"--max-total-tokens {args.max_total_tokens} does not fit in device memory "
                            f"(at most {model.max_total_tokens} on an M1000 with this model)")
    return Config(host=args.host, port=port, model_path=path,
                  served_name=args.served_model_name or path, key=key,
                  max_total_tokens=args.max_total_tokens, draft_tokens=draft, spec_args=spec, knobs=knobs)


def _bind(cfg: Config, state: State) -> net.Listener:
    handler = type("BoundHandler", (Handler,), {"state": state})
    try:
        server = net.Listener((cfg.host, cfg.port), handler)
    except OSError as exc:
        if exc.errno == 98:  # EADDRINUSE
            raise core.SimError(f"port {cfg.port} on {cfg.host} is already in use") from None
        raise core.SimError(f"cannot listen on {cfg.host}:{cfg.port}: {exc.strerror or exc}") from None
    return server


def _load(state: State, env: dict[str, str] | Any, model: core.Model) -> None:
    """Model load (and JIT kernel compilation when the kernel cache lacks this model)."""
    cfg = state.cfg
    scale = cfg.knobs.time_scale
    timings = model.data["timings_ms"]
    if "start-fail" in state.faults:
        time.sleep(timings["server_load"] / 4 / 1000 / scale)
        raise core.SimError("fault start-fail: failed to initialise the model on the device "
                            "(MUSA error: out of memory)")
    delay = timings["server_load"] / cfg.knobs.speed.factor(cfg.key, "load")  # speed load=F: 1/F as long
    cache_dir = env.get("TILELANG_CACHE_DIR", "")
    dir_name = state.setup.data["model_dir"]
    marker = os.path.join(cache_dir, dir_name, "kernels.json") if cache_dir else ""
    if not marker or not os.path.exists(marker):
        print(f"{PROG}: warning: no precompiled TileLang kernels for {dir_name} in {cache_dir or '(unset)'}; "
              "compiling at start-up (slow)", file=sys.stderr, flush=True)
        delay += timings["jit_compile_per_model"]
    time.sleep(delay / 1000 / scale)


def main(argv: list[str] | None = None) -> int:
    env = os.environ
    args = list(sys.argv[1:] if argv is None else argv)
    if "-h" in args or "--help" in args:
        print(USAGE)
        return 0
    try:
        knobs = load_knobs(env)
        model = core.Model.load(release_file("model.json"))
        cfg = configure(args, env, model, knobs)
        setup = model.setup(cfg.key)
        state = State(cfg, setup, core.faults_for(knobs.faults, cfg.key), DevicePhase(env.get(core.ENV_DEVICE_DIR)))
        if "lazy-jit" in state.faults:
            cache = env.get("TILELANG_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".tilelang", "cache")
            state.jit_dir = os.path.join(cache, setup.data["model_dir"], "jit")
        server = _bind(cfg, state)
    except UsageError as exc:
        print(USAGE, file=sys.stderr)
        return fail(PROG, str(exc), 2)
    except core.SimError as exc:
        return fail(PROG, str(exc))
    raise_priority(env)
    print(f"{PROG}: {cfg.key} ({cfg.model_path}) listening on http://{cfg.host}:{cfg.port} "
          f"(time scale {knobs.time_scale:g}, max-total-tokens {cfg.max_total_tokens})", file=sys.stderr, flush=True)
    server.start()
    state.device.set("idle")  # the model is being loaded into device memory
    console_line(env, f"{cfg.key}: loading {os.path.basename(cfg.model_path)} into device memory")
    try:
        _load(state, env, model)
        state.ready.set()
        console_line(env, f"{cfg.key}: model loaded, serving on port {cfg.port}")
        print(f"{PROG}: The server is fired up and ready to roll!", file=sys.stderr, flush=True)
        server.wait()
    except core.SimError as exc:
        return fail(PROG, str(exc))
    except KeyboardInterrupt:
        pass
    finally:
        server.shutdown()
        server.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
