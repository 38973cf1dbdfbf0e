"""The release's workflow steps: generate the TileLang workflow, precompile kernels, find a model.

``python -m m1000_sim.workflow generate|precompile|model-path``; the scripts in ``scripts/ci/musa/`` call
:func:`main` the same way through ``python3 -S -c`` (``run_program`` in ``_common.sh``). Standard library only.
"""

from __future__ import annotations

import os
import sys
import time

from . import core, jsonc
from .common import fail, load_knobs, model_identity, read_json, release_file, require_env, write_atomic

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (~3 ms of each interpreter's start)
if TYPE_CHECKING:
    from typing import Any

KERNELS = ("moe_grouped_gemm_w4a16", "gptq_gemm_w4a16", "flash_attn_prefill", "flash_attn_decode",
           "rmsnorm", "rope", "silu_and_mul", "topk_softmax")


def check_model_path(path: Any, where: str) -> dict[str, Any]:
    """One ``model_paths`` entry -> {"path", "identity"}, or SimError naming the entry."""
    if not isinstance(path, str) or not path.strip():
        raise core.SimError(f"{where}: must be a folder path (a non-empty string), got {path!r}")
    if not os.path.exists(path):
        raise core.SimError(f"{where}: model path {path} does not exist")
    if not os.path.isdir(path):
        raise core.SimError(f"{where}: model path {path} is not a folder")
    if not os.access(path, os.R_OK | os.X_OK):
        raise core.SimError(f"{where}: model path {path} is not readable")
    cfg = os.path.join(path, "config.json")
    if not os.path.lexists(cfg):
        raise core.SimError(f"{where}: {path} is not a model folder (no config.json)")
    data = read_json(cfg, f"{where}: {cfg}")
    if not isinstance(data, dict):
        raise core.SimError(f"{where}: {cfg} is not a JSON object")
    return {"path": os.path.abspath(path), "identity": model_identity(path)}


def generate(config_path: str, out_path: str, model: core.Model) -> dict[str, Any]:
    cfg = read_json(config_path)
    where = config_path
    if not isinstance(cfg, dict) or "model_paths" not in cfg:
        raise core.SimError(f"{where}: no 'model_paths' list")
    paths = cfg["model_paths"]
    if not isinstance(paths, list) or not paths:
        raise core.SimError(f"{where}: 'model_paths' must be a non-empty list of model folders")
    models = []
    for i, p in enumerate(paths):
        entry = check_model_path(p, f"{where}: model_paths[{i}]")
        if model.identify(entry["identity"]) is None:
            known = ", ".join(sorted(model.data["models"]))
            raise core.SimError(f"{where}: model_paths[{i}]: {entry['identity']} is not a model this release "
                                f"supports (known: {known})")
        models.append(entry)
    workflow = {"schema": 1, "config": os.path.abspath(config_path), "models": models,
                "kernels": list(KERNELS)}
    write_atomic(out_path, jsonc.dumps(workflow, indent=2) + "\n")
    return workflow


def load_workflow(env: dict[str, str] | Any) -> dict[str, Any]:
    require_env(env)
    wf = read_json(env["TILELANG_WORKFLOW_FILE"])
    if not isinstance(wf, dict) or not isinstance(wf.get("models"), list):
        raise core.SimError(f"{env['TILELANG_WORKFLOW_FILE']}: not a TileLang workflow; run "
                            "scripts/ci/musa/generate_tilelang_workflow.sh again")
    return wf


def cached_kernels(target: str) -> bool:
    """Every kernel of a model, and its ``kernels.json``, is in the cache folder ``target`` already."""
    return all(os.path.isfile(os.path.join(target, f"{k}.cubin.json")) for k in KERNELS) and \
        os.path.isfile(os.path.join(target, "kernels.json"))


def precompile(env: dict[str, str] | Any, model: core.Model, out: Any = sys.stdout) -> list[str]:
    """Compile each model's kernels into ``$TILELANG_CACHE_DIR/<model dir>/``; the models compiled.

    As TileLang does, a kernel whose cache entry exists is not compiled again: a model whose kernels are all
    cached costs only the start-up (``precompile_base``). What is written depends only on the model's identity
    and the kernels (no path, no time): two modules compiling the same release write byte-identical caches."""
    wf = load_workflow(env)
    knobs = load_knobs(env)
    cache = env["TILELANG_CACHE_DIR"]
    t = model.data["timings_ms"]
    scale = knobs.time_scale
    try:
        os.makedirs(cache, exist_ok=True)
    except OSError as exc:
        raise core.SimError(f"TILELANG_CACHE_DIR {cache}: cannot create: {exc.strerror or exc}") from None
    time.sleep(t["precompile_base"] / 1000 / scale)
    done = []
    for m in wf["models"]:
        ident = m["identity"]
        entry = model.identify(ident)
        if entry is None:
            raise core.SimError(f"{env['TILELANG_WORKFLOW_FILE']}: {ident} is not a model this release supports")
        target = os.path.join(cache, model.setup(entry["key"] or entry["mtp_key"]).data["model_dir"])
        if cached_kernels(target):
            print(f"[precompile] {ident}: {len(KERNELS)} TileLang kernels cached in {target}", file=out, flush=True)
            continue
        print(f"[precompile] {ident}: compiling {len(KERNELS)} TileLang kernels", file=out, flush=True)
        time.sleep(t["precompile_per_model"] / 1000 / scale)
        os.makedirs(target, exist_ok=True)
        for k in KERNELS:
            digest = core.hash_new("sha256", f"{ident}:{k}".encode()).hexdigest()
            write_atomic(os.path.join(target, f"{k}.cubin.json"), jsonc.dumps({"kernel": k, "digest": digest}) + "\n")
        write_atomic(os.path.join(target, "kernels.json"),
                     jsonc.dumps({"model": ident, "kernels": list(KERNELS)}, indent=2) + "\n")
        done.append(ident)
    print(f"[precompile] done: {len(done)} model(s) compiled in {cache}", file=out, flush=True)
    return done


def model_path(env: dict[str, str] | Any, wanted: str) -> str:
    wf = load_workflow(env)
    for m in wf["models"]:
        if wanted in (m.get("identity"), os.path.basename(str(m.get("path", "")).rstrip("/"))):
            path = str(m["path"])
            check_model_path(path, f"{env['TILELANG_WORKFLOW_FILE']}: {wanted}")
            return path
    raise core.SimError(f"model {wanted} is not in the TileLang workflow ({env['TILELANG_WORKFLOW_FILE']}): add its "
                        "folder to model_paths in scripts/ci/musa/tilelang_workflow_config.json and run "
                        "generate_tilelang_workflow.sh")


USAGE = "usage: tilelang workflow {generate --config FILE --out FILE | precompile | model-path [--prog NAME] NAME}"


def parse_args(argv: list[str]) -> dict[str, str]:
    """The scripts' fixed command lines, without argparse (~7 ms of each interpreter's start):
    ``generate --config F --out F``, ``precompile``, ``model-path [--prog P] NAME``. SimError when malformed."""
    if not argv or argv[0] not in ("generate", "precompile", "model-path"):
        raise core.SimError(USAGE)
    cmd, rest = argv[0], list(argv[1:])
    opts = {"generate": ("--config", "--out"), "precompile": (), "model-path": ("--prog",)}[cmd]
    args: dict[str, str] = {"cmd": cmd}
    names: list[str] = []
    while rest:
        a = rest.pop(0)
        flag, eq, val = a.partition("=")
        if flag in opts:
            if not eq:
                if not rest:
                    raise core.SimError(f"{cmd}: {flag} needs a value\n{USAGE}")
                val = rest.pop(0)
            args[flag[2:]] = val
        elif a.startswith("-") or cmd != "model-path" or names:
            raise core.SimError(f"{cmd}: unexpected argument {a!r}\n{USAGE}")
        else:
            names.append(a)
    missing = [f for f in opts if f != "--prog" and f[2:] not in args] + (["NAME"] if cmd == "model-path" and not names
                                                                        else [])
    if missing:
        raise core.SimError(f"{cmd}: {', '.join(missing)} required\n{USAGE}")
    if names:
        args["name"] = names[0]
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except core.SimError as exc:
        print(f"tilelang workflow: error: {exc}", file=sys.stderr)
        return 2
    cmd = args["cmd"]
    prog = {"generate": "generate_tilelang_workflow.sh", "precompile": "precompile_tilelang_kernels.sh",
            "model-path": args.get("prog", "start server")}[cmd]
    try:
        model = core.Model.load(release_file("model.json"))
        if cmd == "generate":
            wf = generate(args["config"], args["out"], model)
            print(f"generated {args['out']} for {len(wf['models'])} model(s): "
                  f"{', '.join(m['identity'] for m in wf['models'])}")
        elif cmd == "precompile":
            precompile(os.environ, model)
        else:
            print(model_path(os.environ, args["name"]))
    except core.SimError as exc:
        return fail(prog, str(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
