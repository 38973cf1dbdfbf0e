"""The llama.cpp engine of a release (``m1000_llama``): ``llama-server`` on GGUF models, all seven keys.

- workflow: for each folder it reads ``model.gguf``'s header (:mod:`.gguf`): the architecture, the
  weights' type, whether the model carries an MTP head (``<arch>.nextn_predict_layers``, what
  ``--spec-type draft-mtp`` drafts with) and whether a vision projector ``mmproj.gguf`` lies beside it.
  A folder without ``model.gguf`` is listed as not served, with the reason.
- precompile: llama.cpp compiles no kernels ahead of a run (the CPU build is native code; the CUDA build
  ships its kernels), so "prepared" means: ``llama-server`` (``$M1000_LLAMA_SERVER``) runs and says its
  version, and each model's files (``model.gguf``, ``mmproj.gguf``) are fingerprinted with that version
  and the device.
- bench: the sweep of :mod:`.bench`, the MTP and vision tables of :mod:`.llama_bench`.

The start scripts map the reference document's variables honestly:

- ``QWEN35_EXTRA_SERVER_ARGS`` / ``QWEN35_FQ_EXTRA_SERVER_ARGS`` with SGLang's NEXTN options
  (``--speculative-algorithm NEXTN --speculative-num-steps 3 --speculative-eagle-topk 1
  --speculative-num-draft-tokens 4``) become llama.cpp's MTP drafting: ``--spec-type draft-mtp
  --spec-draft-n-max 3`` (the model's own MTP head drafts a chain of ``num-steps`` tokens, verified
  with the next one: ``num-draft-tokens`` = steps + 1). What llama.cpp cannot do is refused, exit 3,
  with one line: tree drafting (``eagle-topk`` > 1), a draft count that is not steps + 1, another
  algorithm, a model with no MTP head, any other extra argument.
- ``SGLANG_USE_TL_MOE_GROUPED_GEMM`` (a TileLang MoE kernel switch of SGLang-MUSA) is recorded in the
  server's log and has no effect: llama.cpp has no such kernel.

The server: one slot (batch 1, as the reference tables), context ``--max-total-tokens`` (16384), the
host-memory prompt cache off (``--cache-ram 0``; the benchmark decides per request whether the slot's
prefix may be reused), ``/metrics`` on (the benchmark reads the speculative-decoding counters), timestamps
in its log, which it also writes to ``$SGLANG_MUSA_RELEASE_DIR/logs/<model>.server.log`` (the benchmark
reads the vision encoder's time there). ``M1000_LLAMA_DEVICE=cuda`` offloads every layer (``-ngl 999``);
``M1000_LLAMA_THREADS`` sets ``-t``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any

from .common import EngineError, read_json
from .gguf import FILE_TYPES, gguf_metadata
from .llama_bench import run_table as run_table  # the bench's hook for the MTP and vision tables
from .llama_bench import server_log

NAME = "llama.cpp"
LABEL = "llama.cpp (llama-server)"
CACHE = "llama.cpp"  # $TILELANG_CACHE_DIR/llama.cpp/<model>.json
DEVICE_VAR = "M1000_LLAMA_DEVICE"
START_HINT = "set M1000_LLAMA_SERVER to the llama-server that `make engine` built"
MODEL_FILE = "model.gguf"
MMPROJ_FILE = "mmproj.gguf"
SPEC_OPTIONS = ("--speculative-algorithm", "--speculative-num-steps", "--speculative-eagle-topk",
                "--speculative-num-draft-tokens")
MTP_ALGORITHMS = ("NEXTN", "MTP", "EAGLE")  # SGLang runs a model's own MTP head under these names
RECONNECT = True  # llama-server closes the connection after a streamed answer
WARM_EACH_SHAPE = True  # a GPU server's first prompt of a new length is slow; the shared prefix is warmed
CHECK_SERVED_ID = False  # /v1/models names the .gguf file
BENCH_NOTE = "; random-weight models: MTP acceptance and answers are meaningless"


# ----- workflow

def describe(path: str, where: str) -> dict[str, Any]:
    name = os.path.basename(os.path.normpath(path))
    out: dict[str, Any] = {"name": name, "path": os.path.abspath(path), "supported": False, "why": "",
                           "architecture": "", "mtp_layers": 0, "mmproj": "", "dtype": ""}
    cfg_path = os.path.join(path, "config.json")
    if os.path.exists(cfg_path):
        cfg = read_json(cfg_path, f"{where}: {cfg_path}")
        out["model_type"] = str(cfg.get("model_type") or "") if isinstance(cfg, dict) else ""
    gguf = os.path.join(path, MODEL_FILE)
    if not os.path.exists(gguf):
        out["why"] = f"no {MODEL_FILE} in {path} (this release serves GGUF models with llama-server)"
        return out
    meta = gguf_metadata(gguf)
    arch = str(meta.get("general.architecture") or "")
    out.update(architecture=arch, supported=True, model=os.path.abspath(gguf),
               mtp_layers=int(meta.get(f"{arch}.nextn_predict_layers") or 0),
               dtype=FILE_TYPES.get(int(meta.get("general.file_type", -1)), str(meta.get("general.file_type", "?"))),
               context=int(meta.get(f"{arch}.context_length") or 0), vocab=int(meta.get("tokenizer.ggml.tokens") or 0))
    proj = os.path.join(path, MMPROJ_FILE)
    if os.path.exists(proj):
        gguf_metadata(proj)  # a broken projector is refused here, not when the server loads it
        out["mmproj"] = os.path.abspath(proj)
    return out


def summary(m: dict[str, Any]) -> str:
    if not m["supported"]:
        return f"{m['name']}: NOT supported: {m['why']}"
    extra = (", MTP head" if m["mtp_layers"] else "") + (", vision projector" if m["mmproj"] else "")
    return f"{m['name']} ({m['architecture']}, {m['dtype']}{extra}): supported"


# ----- precompile

def server_version(server: str) -> str:
    try:
        res = subprocess.run([server, "--version"], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise EngineError(f"llama-server not found: {server} (set M1000_LLAMA_SERVER to the binary `make engine` "
                          "built)") from None
    except OSError as exc:
        raise EngineError(f"cannot run {server}: {exc.strerror or exc}") from None
    text = (res.stdout + res.stderr).strip()
    if res.returncode != 0:
        raise EngineError(f"{server} --version exited {res.returncode}: {text[-200:]}")
    return next((ln.strip() for ln in text.splitlines() if ln.startswith("version:")), text[:120])


def identity(env: Any, device: str) -> dict[str, Any]:
    """The server's version: a cache entry of another llama-server is prepared again."""
    server = env.get("M1000_LLAMA_SERVER") or "llama-server"
    version = server_version(server)
    print(f"[precompile] {server}: {version} ({device})", flush=True)
    return {"server": version}


def model_files(m: dict[str, Any]) -> list[str]:
    return [m["model"]] + ([m["mmproj"]] if m["mmproj"] else [])


def prepare(m: dict[str, Any], files: list[str], device: str, started: float) -> tuple[dict[str, Any], str]:
    info = {"architecture": m["architecture"], "bytes": sum(os.path.getsize(f) for f in files)}
    return info, f"{m['architecture']} ({m['dtype']}), fingerprinted in {time.monotonic() - started:.2f} s"


# ----- serve

def speculative_args(extra: list[str]) -> dict[str, str]:
    """SGLang's speculative options as a dict (``--opt value`` or ``--opt=value``); anything else refused."""
    out: dict[str, str] = {}
    i = 0
    while i < len(extra):
        arg = extra[i]
        name, eq, value = arg.partition("=")
        if name not in SPEC_OPTIONS:
            raise EngineError(f"unsupported extra server argument {arg!r} (this release maps only "
                              f"{', '.join(SPEC_OPTIONS)})")
        if not eq:
            if i + 1 >= len(extra):
                raise EngineError(f"{name} needs a value")
            value = extra[i + 1]
            i += 1
        out[name] = value
        i += 1
    return out


def mtp_options(spec: dict[str, str], mtp_layers: int, model: str) -> list[str]:
    """llama-server's MTP options for SGLang's NEXTN settings (pure)."""
    algo = spec.get("--speculative-algorithm", "").upper()
    if algo not in MTP_ALGORITHMS:
        raise EngineError(f"--speculative-algorithm {algo or '(missing)'}: llama.cpp drafts with the model's MTP "
                          f"head only ({', '.join(MTP_ALGORITHMS)}): refused")
    try:
        steps = int(spec.get("--speculative-num-steps", "3"))
        topk = int(spec.get("--speculative-eagle-topk", "1"))
        drafts = int(spec.get("--speculative-num-draft-tokens", str(steps + 1)))
    except ValueError:
        raise EngineError(f"speculative settings must be integers: {spec}") from None
    if topk != 1:
        raise EngineError(f"--speculative-eagle-topk {topk}: llama.cpp drafts one chain (top-1), not a tree: refused")
    if steps < 1 or drafts != steps + 1:
        raise EngineError(f"--speculative-num-draft-tokens {drafts} with --speculative-num-steps {steps}: llama.cpp "
                          "verifies a chain of num-steps drafts plus one token (num-draft-tokens = steps + 1): refused")
    if mtp_layers < 1:
        raise EngineError(f"{model}: the model has no MTP head (no nextn layers in its GGUF): speculative decoding "
                          "refused, no MTP figures (plain decoding would be reported as MTP)")
    return ["--spec-type", "draft-mtp", "--spec-draft-n-max", str(steps)]


def extra_options(extra: list[str]) -> dict[str, str]:
    return speculative_args(extra)


def server_argv(env: dict[str, str], m: dict[str, Any], host: str, port: str, ctx: str,
                options: dict[str, str]) -> list[str]:
    """llama-server's argv for the workflow's model ``m`` (pure)."""
    server = env.get("M1000_LLAMA_SERVER") or "llama-server"
    device = env.get(DEVICE_VAR) or "cpu"
    argv = [server, "-m", m["model"], "--host", host, "--port", port, "-c", ctx, "-np", "1", "--cache-ram", "0",
            "--metrics", "--log-timestamps", "--log-file", server_log(env, m["name"]),
            "-ngl", "999" if device == "cuda" else "0"]
    if env.get("M1000_LLAMA_THREADS"):
        argv += ["-t", env["M1000_LLAMA_THREADS"]]
    if m["mmproj"]:
        # trace level: the server logs when the projector starts encoding an image, and the next line when it
        # is done (the benchmark's vision figures); about 25 lines a request
        argv += ["--mmproj", m["mmproj"], "-lv", "4"]
        if device != "cuda":
            argv.append("--no-mmproj-offload")
    if options:
        argv += mtp_options(options, int(m.get("mtp_layers") or 0), m["name"])
    return argv


def exec_env(env: dict[str, str], model: str) -> dict[str, str]:
    """The server's environment (its log folder made; the MoE kernel switch recorded, no effect)."""
    os.makedirs(os.path.dirname(server_log(env, model)), exist_ok=True)
    gemm = env.get("SGLANG_USE_TL_MOE_GROUPED_GEMM")
    if gemm is not None:
        print(f"[engine] SGLANG_USE_TL_MOE_GROUPED_GEMM={gemm} recorded: no effect (llama.cpp has no TileLang "
              "grouped-GEMM MoE kernel)", file=sys.stderr, flush=True)
    return env


# ----- bench

def refusal(kc: dict[str, Any]) -> str:
    return ""  # every key is served


def model_sizes(model: dict[str, Any], kc: dict[str, Any], cfg: dict[str, Any]) -> tuple[int, int]:
    """(word ids that are one token each, context in K); a model the key cannot be measured on is refused."""
    if not model["supported"]:
        raise EngineError(model["why"])
    if any(t["kind"] == "vision" for t in kc["tables"]) and not model["mmproj"]:
        raise EngineError(f"{model['name']} has no vision projector ({model['path']}/{MMPROJ_FILE}): "
                          "no vision figures")
    return min(int(model.get("vocab") or 32768) - 40, 30_000), int(cfg["ctx_k"])


def request_fields(cache: bool) -> dict[str, Any]:
    """Generate every token asked for; reuse the slot's cached prefix only where the profile shares one."""
    return {"ignore_eos": True, "cache_prompt": cache}
