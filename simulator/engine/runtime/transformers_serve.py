"""The transformers engine of a release (``m1000_engine``): ``transformers serve`` (PyTorch) on Qwen3-MoE text models.

What the shared programs ask of it:

- workflow: a folder is served when its config.json says ``qwen3_moe`` and it has ``*.safetensors``
  weights; anything else is listed as not served, with the reason;
- precompile (run with ``$M1000_ENGINE_PYTHON``: torch + transformers): the fingerprint covers config.json
  and the weights; preparing loads the model onto ``$M1000_ENGINE_DEVICE`` and runs a warm-up generation
  (which exercises every layer's kernels on the device), recording load and warm-up times;
- serve: any extra server argument is refused, speculative decoding (``--speculative-*``) by name:
  transformers serve has no NEXTN/EAGLE drafting, and running without it would report figures that are
  not MTP figures;
- bench: MTP keys and the vision key are refused (exit 3); word ids stay below the vocabulary less two.
"""

from __future__ import annotations

import os
import time
from typing import Any

from .common import EngineError, read_json

NAME = "transformers"
LABEL = "transformers serve"
CACHE = "engine"  # $TILELANG_CACHE_DIR/engine/<model>.json
DEVICE_VAR = "M1000_ENGINE_DEVICE"
START_HINT = "set M1000_ENGINE_PYTHON to an interpreter with torch and transformers[serving]"
SUPPORTED_TYPES = ("qwen3_moe",)  # what transformers serve runs in this release (text generation)
RECONNECT = False  # one keep-alive connection
WARM_EACH_SHAPE = False
CHECK_SERVED_ID = True  # /v1/models names the model folder
BENCH_NOTE = ""


# ----- workflow

def describe(path: str, where: str) -> dict[str, Any]:
    cfg = read_json(os.path.join(path, "config.json"), f"{where}: {path}/config.json")
    if not isinstance(cfg, dict):
        raise EngineError(f"{where}: {path}/config.json is not a JSON object")
    mtype = str(cfg.get("model_type") or "")
    has_weights = any(n.endswith(".safetensors") for n in os.listdir(path))
    ok = mtype in SUPPORTED_TYPES and has_weights
    why = ""
    if mtype not in SUPPORTED_TYPES:
        why = f"architecture {mtype or '?'} is not served by this release (supported: {', '.join(SUPPORTED_TYPES)})"
    elif not has_weights:
        why = "no *.safetensors weights"
    return {"name": os.path.basename(os.path.normpath(path)), "path": os.path.abspath(path), "model_type": mtype,
            "supported": ok, "why": why}


def summary(m: dict[str, Any]) -> str:
    state = "supported" if m["supported"] else f"NOT supported: {m['why']}"
    return f"{m['name']} ({m['model_type']}): {state}"


# ----- precompile

def identity(env: Any, device: str) -> dict[str, Any]:
    return {}


def model_files(m: dict[str, Any]) -> list[str]:
    return [os.path.join(m["path"], n) for n in sorted(os.listdir(m["path"]))
            if n == "config.json" or n.endswith(".safetensors")]


def prepare(m: dict[str, Any], files: list[str], device: str, started: float) -> tuple[dict[str, Any], str]:
    """Load the model onto ``device`` and warm it up: what the cache entry records, and a line saying so."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.monotonic()
    tok = AutoTokenizer.from_pretrained(m["path"])
    lm = AutoModelForCausalLM.from_pretrained(m["path"], dtype="auto").to(device)
    loaded = time.monotonic() - t0
    ids = tok("w1 w2 w3 w4 w5 w6 w7 w8", return_tensors="pt").input_ids.to(device)
    t1 = time.monotonic()
    with torch.inference_mode():
        lm.generate(ids, max_new_tokens=4, do_sample=False)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    info = {"load_s": round(loaded, 3), "warmup_s": round(time.monotonic() - t1, 3),
            "dtype": str(next(lm.parameters()).dtype).removeprefix("torch."),
            "parameters": sum(p.numel() for p in lm.parameters()), "torch": torch.__version__}
    return info, (f"{info['parameters']} parameters ({info['dtype']}) on {device}: loaded in {info['load_s']:.2f} s, "
                  f"warm-up {info['warmup_s']:.2f} s")


# ----- serve

def extra_options(extra: list[str]) -> None:
    spec = [a for a in extra if a.startswith("--speculative")]
    if spec:
        raise EngineError(f"speculative decoding ({spec[0]} ...) is not supported by transformers serve: refused, "
                          "no MTP figures (running without it would report plain decoding as MTP)")
    if extra:
        raise EngineError(f"unsupported extra server arguments {' '.join(extra)}")


def server_argv(env: dict[str, str], m: dict[str, Any], host: str, port: str, ctx: str, options: None) -> list[str]:
    py = env.get("M1000_ENGINE_PYTHON") or "python3"
    device = env.get(DEVICE_VAR) or "cpu"
    return [py, "-m", "transformers.cli.transformers", "serve", "--device", device, "--host", host, "--port", port,
            "--log-level", "info", m["path"]]


def exec_env(env: dict[str, str], model: str) -> dict[str, str]:
    return {**env, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


# ----- bench

def refusal(kc: dict[str, Any]) -> str:
    if kc["mtp"]:
        return ("speculative decoding (MTP) is not supported by this release's engine (transformers serve): "
                "no MTP figures measured")
    if not kc["tables"] or any(t["kind"] != "sweep" for t in kc["tables"]):
        return "this release serves text models only (no vision benchmark)"
    return ""


def model_sizes(model: dict[str, Any], kc: dict[str, Any], cfg: dict[str, Any]) -> tuple[int, int]:
    """(word ids that are one token each, context in K) from the model's config.json."""
    mcfg = read_json(os.path.join(model["path"], "config.json"))
    return int(mcfg["vocab_size"]) - 2, round(int(mcfg.get("max_position_embeddings", 16384)) / 1024)


def request_fields(cache: bool) -> dict[str, Any]:
    return {}  # transformers serve answers 422 to fields the OpenAI API does not define (ignore_eos)


def run_table(bench: Any, client: Any, kind: str) -> str:
    raise EngineError(f"no {kind} table in this release")  # refused before: refusal()
