"""Pure core of the simulated release: knob specs, the performance model, prompts, tokens.

Standard library only, Python 3.10+: this file ships inside the release tarball
(``scripts/ci/musa/m1000_sim/``) and must not import ``agent``, ``controller`` or
``simulator``. Nothing here sleeps, reads the clock or opens a socket: the server and the
benchmark are the I/O seams.
"""

from __future__ import annotations

import math

from . import jsonc

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see .record)
if TYPE_CHECKING:
    from typing import Any, NamedTuple
else:
    from .record import NamedTuple

MODEL_KEYS = ("qwen3", "qwen35", "qwen35_mtp", "qwen35_fq", "qwen35_fq_mtp", "qwen36_fq", "qwen3vl")
SPEED_METRICS = ("prefill", "decode", "accept", "vision", "load", "all")
# "all" is every throughput metric; accept rates, and "load" (the server's model load: its start until ready takes
# 1 / factor as long), change only when named explicitly.
_ALL_METRICS = ("prefill", "decode", "vision")
FAULT_NAMES = ("start-fail", "crash", "hang", "bad-table", "no-table", "bench-skew", "lazy-jit", "no-decode")
VOCAB_SIZE = 151936
# the generation request (1-based, warm-ups included) during which crash / hang strike
FAULT_AT_REQUEST = 3

ENV_SPEED = "M1000_SIM_SPEED"
ENV_NOISE = "M1000_SIM_NOISE"
ENV_SEED = "M1000_SIM_SEED"
# a module's own seed, mixed with the release's (not overriding it): each release's run on the module draws
# noise of its own, while the modules of one run still differ (a fleet kept running across many releases)
ENV_MODULE_SEED = "M1000_SIM_MODULE_SEED"
MODULE_SEED_MIX = 1_000_003  # seed = release seed * this + module seed
ENV_TIME_SCALE = "M1000_SIM_TIME_SCALE"
ENV_FAULT = "M1000_SIM_FAULT"
# the simulated module's device (simulator/device/mthreads-gmi): its condition, and the folder where the
# server says what the device is doing
ENV_DEVICE = "M1000_SIM_DEVICE"
ENV_DEVICE_DIR = "M1000_SIM_DEVICE_DIR"
# condition -> default factor on the module's speed (and its SM clock); None: the speed is unchanged
DEVICE_CONDITIONS: dict[str, float | None] = {"throttle": 0.82, "lowclock": 0.85, "hot": None, "noquery": None,
                                              "nojson": None, "hang": None, "fail": None}
# the driver version the simulated device tool reports (default 3.0.0-sim): one module's can differ
ENV_DRIVER = "M1000_SIM_DRIVER"
ENV_BENCH_SKEW = "M1000_SIM_BENCH_SKEW"
# fault bench-skew: the benchmark reports every measured time (TTFT, TPOT, step and frame times)
# times this factor, the throughputs from those times; the server is unchanged
BENCH_SKEW = 0.8
# fault lazy-jit: the key's server compiles a TileLang kernel on the first request of each prefill shape bucket (the
# next power of two of its new tokens, at least LAZY_JIT_MIN_BUCKET) that its cache lacks, written under
# $TILELANG_CACHE_DIR/<model dir>/jit/, this much module time added to that request's TTFT (~11 s seen elsewhere)
LAZY_JIT_MS = 11000.0
LAZY_JIT_MIN_BUCKET = 32


class SimError(Exception):
    """Root of the simulator's errors; ``str()`` is one line naming what was wrong and where."""


class SpecError(SimError, ValueError):
    """A speed, fault or knob specification that cannot be read."""


# ---------------------------------------------------------------------------- specs


class Speed(NamedTuple):
    """Throughput multipliers: entries ``(key or "", metric, factor)`` multiply together."""

    entries: tuple[tuple[str, str, float], ...] = ()

    def factor(self, key: str, metric: str) -> float:
        f = 1.0
        for k, m, v in self.entries:
            if k not in ("", key):
                continue
            if m == metric or (m == "all" and metric in _ALL_METRICS):
                f *= v
        return f

    def compose(self, other: Speed) -> Speed:
        return Speed(self.entries + other.entries)

    def __str__(self) -> str:
        if not self.entries:
            return "1.0"
        return ",".join(f"{k + ':' if k else ''}{m}={v!r}" for k, m, v in self.entries)  # exact: repr round-trips


def _factor(text: str, where: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise SpecError(f"{where}: factor {text!r} is not a number") from None
    if not math.isfinite(v) or v <= 0:
        raise SpecError(f"{where}: factor {text!r} must be a positive number")
    return v


def parse_speed(text: str | None, where: str = "speed") -> Speed:
    """``"0.9"`` or ``"[KEY:]METRIC=FACTOR,..."`` (``KEY=FACTOR`` means every metric of KEY)."""
    entries: list[tuple[str, str, float]] = []
    for raw in (text or "").split(","):
        item = raw.strip()
        if not item:
            continue
        if "=" not in item:
            entries.append(("", "all", _factor(item, f"{where} {item!r}")))
            continue
        lhs, rhs = (s.strip() for s in item.split("=", 1))
        key, _, metric = lhs.rpartition(":")
        if not key and metric in MODEL_KEYS:
            key, metric = metric, "all"
        if key and key not in MODEL_KEYS:
            raise SpecError(f"{where} {item!r}: unknown model key {key!r} (known: {', '.join(MODEL_KEYS)})")
        if metric not in SPEED_METRICS:
            raise SpecError(f"{where} {item!r}: unknown metric {metric!r} (known: {', '.join(SPEED_METRICS)})")
        entries.append((key, metric, _factor(rhs, f"{where} {item!r}")))
    return Speed(tuple(entries))


class Fault(NamedTuple):
    name: str
    key: str = ""  # "" = every model key

    def __str__(self) -> str:
        return f"{self.name}:{self.key}" if self.key else self.name


def parse_faults(text: str | None, where: str = "fault") -> tuple[Fault, ...]:
    """``"crash:qwen3,no-table"`` -> faults; without ``:KEY`` a fault applies to every key."""
    out: list[Fault] = []
    for raw in (text or "").split(","):
        item = raw.strip()
        if not item:
            continue
        name, _, key = (s.strip() for s in item.partition(":"))
        if name not in FAULT_NAMES:
            raise SpecError(f"{where} {item!r}: unknown fault {name!r} (known: {', '.join(FAULT_NAMES)})")
        if key and key not in MODEL_KEYS:
            raise SpecError(f"{where} {item!r}: unknown model key {key!r} (known: {', '.join(MODEL_KEYS)})")
        f = Fault(name, key)
        if f not in out:
            out.append(f)
    return tuple(out)


def faults_for(faults: tuple[Fault, ...], key: str) -> frozenset[str]:
    return frozenset(f.name for f in faults if f.key in ("", key))


def bench_skew(faults: frozenset[str], env: dict[str, str] | Any) -> float:
    """The factor the benchmark's times are reported with: 1 without fault ``bench-skew``."""
    if "bench-skew" not in faults:
        return 1.0
    raw = (env.get(ENV_BENCH_SKEW) or "").strip()
    return _factor(raw, ENV_BENCH_SKEW) if raw else BENCH_SKEW


class Knobs(NamedTuple):
    """The simulation knobs: baked into a release at build time, composed with the env at run time."""

    speed: Speed = Speed()
    noise: float = 0.0
    seed: int = 0
    time_scale: float = 50.0
    faults: tuple[Fault, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "speed": str(self.speed),
            "noise": self.noise,
            "seed": self.seed,
            "time_scale": self.time_scale,
            "faults": ",".join(str(f) for f in self.faults),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str = "knobs") -> Knobs:
        return cls(
            speed=parse_speed(str(data.get("speed", "1.0")), f"{where}: speed"),
            noise=parse_noise(str(data.get("noise", 0.0)), f"{where}: noise"),
            seed=parse_seed_value(str(data.get("seed", 0)), f"{where}: seed"),
            time_scale=parse_time_scale(str(data.get("time_scale", 50.0)), f"{where}: time_scale"),
            faults=parse_faults(str(data.get("faults", "")), f"{where}: faults"),
        )

    def with_env(self, env: dict[str, str] | Any) -> Knobs:
        """Module knobs: speed multiplies, faults add up, noise / seed / time scale override; a module seed
        (``M1000_SIM_MODULE_SEED``) mixes with the seed."""
        speed, noise, seed, scale, faults = self.speed, self.noise, self.seed, self.time_scale, self.faults
        if env.get(ENV_SPEED, "").strip():
            speed = speed.compose(parse_speed(env[ENV_SPEED], ENV_SPEED))
        if env.get(ENV_NOISE, "").strip():
            noise = parse_noise(env[ENV_NOISE], ENV_NOISE)
        if env.get(ENV_SEED, "").strip():
            seed = parse_seed_value(env[ENV_SEED], ENV_SEED)
        if env.get(ENV_MODULE_SEED, "").strip():
            seed = seed * MODULE_SEED_MIX + parse_seed_value(env[ENV_MODULE_SEED], ENV_MODULE_SEED)
        if env.get(ENV_TIME_SCALE, "").strip():
            scale = parse_time_scale(env[ENV_TIME_SCALE], ENV_TIME_SCALE)
        if env.get(ENV_FAULT, "").strip():
            extra = parse_faults(env[ENV_FAULT], ENV_FAULT)
            faults = faults + tuple(f for f in extra if f not in faults)
        _, slowed = parse_device(env.get(ENV_DEVICE))
        if slowed is not None:  # a throttling or low-clock card: its module is that much slower, every metric
            speed = speed.compose(Speed((("", "all", slowed),)))
        return Knobs(speed=speed, noise=noise, seed=seed, time_scale=scale, faults=faults)


def parse_device(text: str | None, where: str = ENV_DEVICE) -> tuple[str, float | None]:
    """``"throttle[:F]"``, ``"lowclock[:F]"``, ``"hot"``, ... -> (condition, speed factor or None); "" -> ("", None)."""
    item = (text or "").strip()
    if not item:
        return "", None
    name, _, arg = (x.strip() for x in item.partition(":"))
    if name not in DEVICE_CONDITIONS:
        raise SpecError(f"{where} {item!r}: unknown device condition {name!r} (known: {', '.join(DEVICE_CONDITIONS)})")
    default = DEVICE_CONDITIONS[name]
    if arg and default is None:
        raise SpecError(f"{where} {item!r}: {name} takes no factor")
    factor = _factor(arg, f"{where} {item!r}") if arg else default
    if factor is not None and factor > 1.0:
        raise SpecError(f"{where} {item!r}: factor must be at most 1")
    return name, factor


def parse_noise(text: str, where: str = "noise") -> float:
    try:
        v = float(text)
    except ValueError:
        raise SpecError(f"{where}: {text!r} is not a number") from None
    if not math.isfinite(v) or not 0.0 <= v < 1.0:
        raise SpecError(f"{where}: {text!r} must be a relative noise in [0, 1)")
    return v


def parse_seed_value(text: str, where: str = "seed") -> int:
    try:
        return int(text)
    except ValueError:
        raise SpecError(f"{where}: {text!r} is not an integer") from None


def parse_time_scale(text: str, where: str = "time scale") -> float:
    try:
        v = float(text)
    except ValueError:
        raise SpecError(f"{where}: {text!r} is not a number") from None
    if not math.isfinite(v) or not 0.01 <= v <= 10000:
        raise SpecError(f"{where}: {text!r} must be between 0.01 and 10000")
    return v


# ---------------------------------------------------------------------------- interpolation


def interp(points: list[list[float]] | tuple[tuple[float, float], ...], x: float, *, log: bool = False,
           extrapolate: bool = False) -> float:
    """Piecewise-linear through ``points`` (sorted by x), in log(x) when ``log``.

    Outside the points: the end value (``extrapolate=False``) or the end segment's line.
    """
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    if len(xs) == 1:
        return ys[0]
    tx = (lambda v: math.log(max(v, 1e-9))) if log else (lambda v: v)
    if not extrapolate:
        if x <= xs[0]:
            return ys[0]
        if x >= xs[-1]:
            return ys[-1]
    from bisect import bisect_right  # the server's: generate, precompile and the benchmark start without it

    i = bisect_right(xs, x) - 1
    i = min(max(i, 0), len(xs) - 2)
    x0, x1 = tx(xs[i]), tx(xs[i + 1])
    t = (tx(x) - x0) / (x1 - x0)
    return ys[i] + t * (ys[i + 1] - ys[i])


# ---------------------------------------------------------------------------- performance model


class Factors(NamedTuple):
    """Per-request throughput multipliers (speed knobs times noise)."""

    prefill: float = 1.0
    decode: float = 1.0
    accept: float = 1.0
    vision: float = 1.0


class Plan(NamedTuple):
    """When the server emits what, in module milliseconds, at batch 1 (the device batches: .device).

    ``ttft_ms`` is the first token's delay after the request arrived; ``emits`` are
    ``(offset after the first token, tokens)`` of the remaining chunks: one token each in plain
    decoding, the accepted tokens of one verify step in speculative decoding.
    """

    ttft_ms: float
    emits: tuple[tuple[float, int], ...]
    n: int
    finish: str
    answer: str | None = None


class PlanError(SimError, ValueError):
    """A request the model refuses (HTTP 400)."""


def noise_factors(noise: float, seed: int, request_no: int) -> tuple[float, float, float]:
    """Lognormal relative noise for (prefill, decode, vision), seeded by (seed, request number)."""
    if noise <= 0:
        return (1.0, 1.0, 1.0)
    import random  # only where noise is asked for: an interpreter of the release's scripts starts without it

    rng = random.Random(f"{seed}:{request_no}")
    return tuple(math.exp(rng.gauss(0.0, noise)) for _ in range(3))  # type: ignore[return-value]


class Setup(NamedTuple):
    """The fitted model of one model key (see ``simulator.fit`` for how it is built)."""

    key: str
    data: dict[str, Any]

    @property
    def mtp(self) -> dict[str, Any] | None:
        return self.data.get("mtp")

    @property
    def vision(self) -> dict[str, Any] | None:
        return self.data.get("vision")

    def prefill_ms(self, new: int, total: int, cached: int) -> float:
        """TTFT (ms) of a text request: ``new`` uncached tokens out of ``total`` (``cached`` = total - new).

        Cold (nothing cached): the no-prefix rows over ``new``. With ``cached`` tokens of the prompt in the
        prefix cache the request costs the prefill of its ``new`` tokens at a context of ``total``: the cold
        cost of ``new`` tokens plus a context cost ``D(total)``, weighted by ``cached / (total - S)`` (at most
        1), where S is the shared-prefix rows' PrefillLen (250) and ``D`` how much longer those S new tokens
        take at context ``total`` than alone (the shared-prefix rows, log scale; linear from 0 at S to the
        first row). So the shared-prefix rows come out exactly (weight 1), a small hit costs about the cold
        prompt less the tokens it saves (smooth in ``cached``), and no hit is slower than no cache.
        """
        if self.mtp is not None:
            pts = self.mtp["prefill"]
            if pts[0][0] <= new <= pts[-1][0]:
                return interp(pts, new)
            return new * self.mtp["ms_per_token"]
        np_pts = self.data["prefill_np"]
        base = max(interp(np_pts, new, extrapolate=True), 1.0)
        s = self.data["sp_new"]
        if cached <= 0 or total <= s:
            return base
        cold = max(interp(np_pts, total, extrapolate=True), 1.0)
        weight = min(1.0, cached / (total - s))
        return max(min(base + weight * self._context_ms(total), cold), 1.0)

    def _context_ms(self, total: int) -> float:
        """D(total): the extra time of the shared-prefix rows' S new tokens at context ``total`` over S alone."""
        sp, s = self.data["prefill_sp"], self.data["sp_new"]
        alone = interp(self.data["prefill_np"], s, extrapolate=True)
        first_x, first_y = sp[0]
        if total >= first_x:
            return interp(sp, total, log=True) - alone
        return (first_y - alone) * max(total - s, 0) / (first_x - s)

    def tpot_ms(self, total: int, cached: int) -> float:
        """TPOT (ms) at a context of ``total``: the no-prefix rows (the shared-prefix rows past their end);
        with a cached prefix, moved toward the shared-prefix rows by the weight of :meth:`prefill_ms`."""
        np_pts, sp = self.data["decode_np"], self.data["decode_sp"]
        cold = interp(np_pts, total, log=True) if total <= np_pts[-1][0] else interp(sp, total, log=True)
        s = self.data["sp_new"]
        if cached <= 0 or total <= s:
            return cold
        weight = min(1.0, cached / (total - s))
        return cold + weight * (interp(sp, total, log=True) - cold)

    def plan(self, *, prompt_len: int, cached: int, max_tokens: int, frames: int, prompt_hash: str,
             factors: Factors, draft_tokens: int | None) -> Plan:
        new = max(prompt_len - cached, 1)
        if frames > 0:
            return self._plan_vision(prompt_len, new, max_tokens, frames, factors)
        ttft = self.prefill_ms(new, prompt_len, cached) / factors.prefill
        if draft_tokens and self.mtp is not None:
            return self._plan_mtp(ttft, max_tokens, prompt_hash, factors, draft_tokens)
        tpot = self.tpot_ms(prompt_len, cached) / factors.decode
        emits = tuple((k * tpot, 1) for k in range(1, max_tokens))
        return Plan(ttft_ms=ttft, emits=emits, n=max_tokens, finish="length")

    def _plan_vision(self, total: int, new: int, max_tokens: int, frames: int, f: Factors) -> Plan:
        vis = self.vision
        if vis is None:
            raise PlanError(f"model {self.data['model_dir']} does not take images or video frames")
        prefill = new / interp(vis["prefill_tps"], total, log=True) * 1000.0 / f.prefill
        frames_ms = frames / vis["fps"] * 1000.0 / f.vision
        tpot = 1000.0 / interp(vis["decode_tps"], total, log=True) / f.decode
        emits = tuple((k * tpot, 1) for k in range(1, max_tokens))
        return Plan(ttft_ms=prefill + frames_ms, emits=emits, n=max_tokens, finish="length")

    def _plan_mtp(self, ttft: float, max_tokens: int, prompt_hash: str, f: Factors, draft: int) -> Plan:
        mtp = self.mtp
        assert mtp is not None
        known = mtp["prompts"].get(prompt_hash)
        if known:
            n, acc_len, step, answer = known["n"], known["accept_len"], known["step_ms"], known["answer"]
        else:
            n, acc_len, step, answer = max_tokens, mtp["accept_len"], mtp["step_ms"], None
        finish = "stop"
        if n >= max_tokens:  # max_tokens reached: "length", as sglang checks the length before the stop token
            if n > max_tokens:
                answer = None  # cut before its answer
            n, finish = max_tokens, "length"
        acc_len = min(acc_len * f.accept, 1.0)
        steps = spec_steps(n, acc_len, draft)
        counts = spread(n - 1, steps)
        step_ms = step / f.decode
        emits = tuple(((i + 1) * step_ms, c) for i, c in enumerate(counts))
        return Plan(ttft_ms=ttft, emits=emits, n=n, finish=finish, answer=answer)


def spec_steps(n: int, accept_len: float, draft: int) -> int:
    """Verify steps that emit n - 1 tokens at acceptance ``accept_len`` = n / (draft * steps)."""
    if n <= 1:
        return 0
    steps = round(n / (draft * max(accept_len, 1e-6)))
    return min(max(steps, math.ceil((n - 1) / draft)), n - 1)


def spread(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` near-equal positive counts (Bresenham)."""
    if parts <= 0:
        return []
    return [(i + 1) * total // parts - i * total // parts for i in range(parts)]


class Model(NamedTuple):
    """The whole fitted model file (``model.json`` in the release)."""

    data: dict[str, Any]

    @classmethod
    def load(cls, path: str) -> Model:
        with open(path, encoding="utf-8") as fh:
            return cls(jsonc.loads(fh.read()))

    @property
    def max_total_tokens(self) -> int:
        return int(self.data["max_total_tokens"])

    def setup(self, key: str) -> Setup:
        return Setup(key, self.data["setups"][key])

    def identify(self, identity: str) -> dict[str, Any] | None:
        """Model folder name (or config ``_name_or_path``) -> {"key", "mtp_key", ...} or None."""
        return self.data["models"].get(identity)


# ---------------------------------------------------------------------------- prompts and tokens

_WORDS = ("the", "model", "token", "step", "so", "we", "have", "then", "total", "is", "each", "and",
          "of", "to", "a", "in", "that", "for", "it", "with", "as", "on", "be", "this", "are", "by")


# hashlib's algorithms the release uses -> the interpreter's built-in modules that have them (CPython 3.10-3.11,
# 3.12+): importing hashlib loads OpenSSL's libcrypto, ~2.5 ms of CPU of a start; the digests are the same
_BUILTIN_HASHES = {"sha256": ("_sha256", "_sha2"), "shake_128": ("_sha3",)}


def hash_new(name: str, data: bytes) -> Any:
    """``hashlib.<name>(data)`` (``sha256``, ``shake_128``) from the built-in module when there is one."""
    for module in _BUILTIN_HASHES[name]:
        try:
            return getattr(__import__(module), name)(data)
        except (ImportError, AttributeError):
            continue
    import hashlib

    return getattr(hashlib, name)(data)


def random_ids(tag: str, length: int) -> list[int]:
    """``length`` pseudo-random token ids determined by ``tag`` (cheap: one hash stream)."""
    from _struct import unpack  # not array: its import loads collections (~2.5 ms of the benchmark's start)

    raw = unpack(f"={length}I", hash_new("shake_128", tag.encode()).digest(4 * length))  # array("I", digest)
    span = VOCAB_SIZE - 1000
    return [1000 + v % span for v in raw]


def gsm8k_prompt_ids(index: int, length: int) -> list[int]:
    """The benchmark's synthetic GSM8K-style prompt ``index`` (token ids, the seed's length)."""
    return random_ids(f"gsm8k:{index}", length)


def prompt_hash(ids: list[int]) -> str:
    return hash_new("sha256", ",".join(map(str, ids)).encode()).hexdigest()[:20]


def word_ids(text: str) -> list[int]:
    """The simulated tokenizer for text: one token per whitespace-separated word."""
    from zlib import crc32  # the server's: generate, precompile and the benchmark start without it

    if text.isascii() and not any(c in text for c in _STR_ONLY_SPACE):  # same split, on bytes: faster
        return [crc32(w) % VOCAB_SIZE for w in text.encode("ascii").split()]
    return [crc32(w.encode("utf-8")) % VOCAB_SIZE for w in text.split()]


_STR_ONLY_SPACE = "\x1c\x1d\x1e\x1f"  # ASCII characters str.split() splits on and bytes.split() does not


def words(tag: str, length: int) -> str:
    return " ".join(f"{tag}{i}" for i in range(length))


def piece(position: int) -> str:
    return " " + _WORDS[(position * 7 + 3) % len(_WORDS)]


def completion_pieces(n: int, answer: str | None) -> list[str]:
    """Text pieces of n generated tokens; an answered GSM8K prompt ends with ``#### <answer>``."""
    if answer is None or n < 3:
        return [piece(i) for i in range(n)]
    return [piece(i) for i in range(n - 2)] + [" ####", f" {answer}"]


def fmt_num(value: float, decimals: int) -> str:
    """Fixed decimals with trailing zeros stripped, as the seed prints numbers."""
    text = f"{value:.{decimals}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text
