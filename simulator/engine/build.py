"""Build the transformers release tarball (standard library only): ``transformers serve`` (PyTorch).

The seed's layout (:mod:`simulator.engine.release`, the steps both builders share); its programs are
the runtime's shared modules and :mod:`simulator.engine.runtime.transformers_serve`, copied as the
package ``scripts/ci/musa/m1000_engine``, next to ``bench_config.json`` (the seed's table titles and
columns, with small profiles). The start scripts exec ``transformers serve`` with
``$M1000_ENGINE_PYTHON`` on ``$M1000_ENGINE_DEVICE`` (default ``python3`` on ``cpu``).
"""

from __future__ import annotations

from pathlib import Path

from contract.records import MODEL_KEYS
from simulator.build import BuiltRelease
from simulator.engine.release import DEFAULT_PROFILES, EngineRelease, release_files, write
from simulator.fit import fitted

SUPPORTED_KEYS = ("qwen3", "qwen35", "qwen35_fq", "qwen36_fq")  # MTP keys and qwen3vl are refused, and say why
ENGINE = EngineRelease(
    engine="transformers", package="m1000_engine", modules=("transformers_serve.py",),
    build="real-engine build: transformers serve",
    exports=('export M1000_ENGINE_PYTHON="${M1000_ENGINE_PYTHON:-python3}"\n'
             'export M1000_ENGINE_DEVICE="${M1000_ENGINE_DEVICE:-cpu}"\n'
             "export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1\n"),
    server="transformers serve", precompile_what="load, warm-up, fingerprint",
    precompile_python='"${M1000_ENGINE_PYTHON:-python3}"')


def bench_config(profiles: dict[str, object]) -> dict[str, object]:
    """The benchmark's configuration: the seed's tables (titles, columns, names), the profiles."""
    _, bench = fitted()
    config = {**bench, "profiles": profiles, "repeats": 2, "engine": ENGINE.engine,
              "supported_keys": list(SUPPORTED_KEYS)}
    config.pop("gsm8k", None)
    return config


def build_engine_release(out_dir: str | Path, *, version: str = "1.4.1-engine", date: str = "20260803",
                         profiles: dict[str, object] | None = None) -> BuiltRelease:
    """Write ``SGLang-MUSA-M1000-M1000_<version>_sglang.tar.gz`` (transformers serve) into ``out_dir``."""
    chosen = dict(DEFAULT_PROFILES if profiles is None else profiles)
    files = release_files(ENGINE, version=version, bench_config=bench_config(chosen),
                          model_dirs=sorted({MODEL_KEYS[k].model_dir for k in SUPPORTED_KEYS}),
                          version_text=f"SGLang-MUSA M1000 {version} ({date}) real-engine release: transformers "
                          "serve\n")
    return write(out_dir, version, date, files)
