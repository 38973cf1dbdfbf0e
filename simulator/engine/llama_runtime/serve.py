"""``start_<x>_server.sh`` of the llama.cpp release: check the request, then exec ``llama-server`` on the model.

Standard library only up to the ``exec``. The reference document's variables are mapped honestly:

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

import argparse
import os
import sys

from .common import EngineError, cache_entry_path, fail, read_json, require_env
from .workflow import find_model

REFUSED = 3
SPEC_OPTIONS = ("--speculative-algorithm", "--speculative-num-steps", "--speculative-eagle-topk",
                "--speculative-num-draft-tokens")
MTP_ALGORITHMS = ("NEXTN", "MTP", "EAGLE")  # SGLang runs a model's own MTP head under these names


def server_log(env: dict[str, str], model: str) -> str:
    return os.path.join(env["SGLANG_MUSA_RELEASE_DIR"], "logs", f"{model}.server.log")


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


def plan(env: dict[str, str], model: str, host: str, port: str, extra: list[str], ctx: str = "16384") -> list[str]:
    """llama-server's argv for ``model`` (pure apart from reading the workflow and cache files)."""
    spec = speculative_args(extra)
    require_env(env)
    m = find_model(env, model)
    if not m["supported"]:
        raise EngineError(f"{model}: {m['why']}")
    entry = cache_entry_path(env["TILELANG_CACHE_DIR"], model)
    if not os.path.exists(entry):
        raise EngineError(f"{model}: not prepared in {env['TILELANG_CACHE_DIR']}: run "
                          "scripts/ci/musa/precompile_tilelang_kernels.sh first")
    prepared = read_json(entry)
    if prepared.get("path") != m["path"]:
        raise EngineError(f"{model}: the precompile cache is for {prepared.get('path')}, not {m['path']}: "
                          "run precompile_tilelang_kernels.sh again")
    server = env.get("M1000_LLAMA_SERVER") or "llama-server"
    device = env.get("M1000_LLAMA_DEVICE") or "cpu"
    argv = [server, "-m", m["model"], "--host", host, "--port", port, "-c", ctx, "-np", "1", "--cache-ram", "0",
            "--metrics", "--log-timestamps", "--log-file", server_log(env, model),
            "-ngl", "999" if device == "cuda" else "0"]
    if env.get("M1000_LLAMA_THREADS"):
        argv += ["-t", env["M1000_LLAMA_THREADS"]]
    if m["mmproj"]:
        # trace level: the server logs when the projector starts encoding an image, and the next line when it
        # is done (the benchmark's vision figures); about 25 lines a request
        argv += ["--mmproj", m["mmproj"], "-lv", "4"]
        if device != "cuda":
            argv.append("--no-mmproj-offload")
    if spec:
        argv += mtp_options(spec, int(m.get("mtp_layers") or 0), model)
    return argv


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="start server")
    p.add_argument("--workflow-model", required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", default="30000")
    p.add_argument("--max-total-tokens", default="16384")
    p.add_argument("extra", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    prog = f"start server {args.workflow_model}"
    extra = [a for a in args.extra if a != "--"]
    env = dict(os.environ)
    try:
        argv_ = plan(env, args.workflow_model, args.host, args.port, extra, args.max_total_tokens)
        os.makedirs(os.path.dirname(server_log(env, args.workflow_model)), exist_ok=True)
    except EngineError as exc:
        return fail(prog, str(exc), REFUSED)
    gemm = env.get("SGLANG_USE_TL_MOE_GROUPED_GEMM")
    if gemm is not None:
        print(f"[engine] SGLANG_USE_TL_MOE_GROUPED_GEMM={gemm} recorded: no effect (llama.cpp has no TileLang "
              "grouped-GEMM MoE kernel)", file=sys.stderr, flush=True)
    print(f"[engine] exec {' '.join(argv_)}", file=sys.stderr, flush=True)
    try:
        os.execvpe(argv_[0], argv_, env)
    except OSError as exc:
        return fail(prog, f"cannot start the engine {argv_[0]}: {exc.strerror or exc} (set M1000_LLAMA_SERVER to "
                    "the llama-server that `make engine` built)", 127)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
