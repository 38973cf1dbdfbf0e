"""Build the simulated release tarball and stand-in model folders.

The tarball has the seed's layout (``<date>_M1000_<version>_sglang/scripts/ci/musa/...``);
its programs are the standard-library modules of :mod:`simulator.runtime`, copied as the
package ``scripts/ci/musa/m1000_sim`` next to the fitted model (``model.json``), the
benchmark's config (``bench_config.json``) and the baked knobs (``knobs.json``).
"""

from __future__ import annotations

import datetime as dt
import gzip
import hashlib
import io
import json
import os
import py_compile
import re
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from contract.records import MODEL_KEYS
from simulator.fit import fitted
from simulator.runtime.core import Knobs, SimError, parse_faults, parse_noise, parse_speed, parse_time_scale

PKG_DIR = Path(__file__).resolve().parent
TEMPLATE_DIR = PKG_DIR / "release"
RUNTIME_DIR = PKG_DIR / "runtime"
MUSA = "scripts/ci/musa"
RUNTIME_PKG = f"{MUSA}/m1000_sim"
_VERSION = re.compile(r"^[0-9A-Za-z][0-9A-Za-z._+-]{0,63}$")
DEFAULT_MODEL_ROOT = "/home/dev/models"


class BuildError(SimError, ValueError):
    pass


@dataclass(frozen=True)
class BuiltRelease:
    path: Path  # the .tar.gz
    sha256: str
    version: str
    top: str  # top folder inside: <date>_M1000_<version>_sglang


def tarball_name(version: str) -> str:
    return f"SGLang-MUSA-M1000-M1000_{version}_sglang.tar.gz"


def release_files(*, version: str, knobs: Knobs, date: str, template_dir: Path = TEMPLATE_DIR,
                  runtime_dir: Path = RUNTIME_DIR) -> dict[str, tuple[bytes, int]]:
    """Relative path inside the top folder -> (content, mode). Pure apart from reading templates.

    ``template_dir`` (the scripts) and ``runtime_dir`` (the programs): this tree's, or another version's
    (``bench/release_cpu.py`` builds an earlier commit's beside this one's).
    """
    model, bench = fitted()
    files: dict[str, tuple[bytes, int]] = {}
    for src in sorted(template_dir.rglob("*")):
        if src.is_file():
            rel = src.relative_to(template_dir).as_posix()
            text = src.read_text(encoding="utf-8").replace("@VERSION@", version).replace("@DATE@", date)
            mode = 0o755 if os.access(src, os.X_OK) else 0o644
            files[rel] = (text.encode(), mode)
    for src in sorted(runtime_dir.glob("*.py")):
        files[f"{RUNTIME_PKG}/{src.name}"] = (src.read_bytes(), 0o644)
    files.update(_bytecode(sorted(runtime_dir.glob("*.py"))))
    files[f"{RUNTIME_PKG}/model.json"] = (json.dumps(model, indent=1).encode(), 0o644)
    files[f"{RUNTIME_PKG}/bench_config.json"] = (json.dumps(bench, indent=1, ensure_ascii=False).encode(), 0o644)
    files[f"{RUNTIME_PKG}/knobs.json"] = (json.dumps(knobs.to_json(), indent=1).encode() + b"\n", 0o644)
    dirs = sorted({spec.model_dir for spec in MODEL_KEYS.values()})
    config = {"model_paths": [f"{DEFAULT_MODEL_ROOT}/{d}" for d in dirs]}
    files[f"{MUSA}/tilelang_workflow_config.json"] = (json.dumps(config, indent=2).encode() + b"\n", 0o644)
    files["VERSION"] = (f"SGLang-MUSA M1000 {version} ({date}) simulated release\n".encode(), 0o644)
    return files


def _bytecode(sources: list[Path]) -> dict[str, tuple[bytes, int]]:
    """Hash-checked ``__pycache__`` entries for the runtime package (this interpreter's tag).

    Every release script is a fresh interpreter: without them each one compiles the package
    again wherever bytecode is not written (``PYTHONDONTWRITEBYTECODE``, a read-only tree).
    Checked against the source's hash, never its time, so they stay valid after unpacking;
    another Python version simply ignores them.
    """
    tag = sys.implementation.cache_tag
    if tag is None:
        return {}
    out: dict[str, tuple[bytes, int]] = {}
    with tempfile.TemporaryDirectory(prefix="m1000-pyc-") as tmp:
        for src in sources:
            cfile = Path(tmp) / f"{src.stem}.pyc"
            py_compile.compile(str(src), cfile=str(cfile), dfile=f"{RUNTIME_PKG}/{src.name}", doraise=True,
                               invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
            out[f"{RUNTIME_PKG}/__pycache__/{src.stem}.{tag}.pyc"] = (cfile.read_bytes(), 0o644)
    return out


def _mtime(date: str) -> int:
    return int(dt.datetime.strptime(date, "%Y%m%d").replace(tzinfo=dt.timezone.utc).timestamp())


def _write_tar(dest: Path, top: str, files: dict[str, tuple[bytes, int]], mtime: int) -> None:
    """Deterministic tar.gz (sorted, fixed owner and times), written then renamed."""
    tmp = dest.with_name(f".{dest.name}.tmp.{os.getpid()}")
    dirs = {top}
    for rel in files:
        parts = rel.split("/")[:-1]
        dirs.update(f"{top}/{'/'.join(parts[:i + 1])}" for i in range(len(parts)))
    try:
        with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=mtime, filename="") as gz, \
                tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for d in sorted(dirs):
                info = tarfile.TarInfo(d)
                info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, mtime
                tar.addfile(info)
            for rel in sorted(files):
                data, mode = files[rel]
                info = tarfile.TarInfo(f"{top}/{rel}")
                info.size, info.mode, info.mtime = len(data), mode, mtime
                tar.addfile(info, io.BytesIO(data))
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            tmp.unlink()


def build_release(out_dir: str | os.PathLike[str], *, version: str = "1.4.1", noise: float | str = 0.0,
                  speed: str = "1.0", time_scale: float | str = 50.0, seed: int | str = 0, faults: str = "",
                  date: str = "20260803") -> BuiltRelease:
    """Write ``SGLang-MUSA-M1000-M1000_<version>_sglang.tar.gz`` into ``out_dir``."""
    mtime = release_mtime(version, date)
    try:
        seed_value = int(seed)
    except (TypeError, ValueError):
        raise BuildError(f"seed {seed!r} is not an integer") from None
    knobs = Knobs(speed=parse_speed(str(speed), "--speed"), noise=parse_noise(str(noise), "--noise"),
                  seed=seed_value, time_scale=parse_time_scale(str(time_scale), "--time-scale"),
                  faults=parse_faults(faults, "--fault"))
    return write_release(out_dir, version, date, mtime, release_files(version=version, knobs=knobs, date=date))


def release_mtime(version: str, date: str) -> int:
    """Check a release's version and date; the tarball's fixed mtime (``date`` at 00:00 UTC)."""
    if not _VERSION.match(version):
        raise BuildError(f"version {version!r}: use letters, digits, '.', '_', '+', '-' (at most 64)")
    if not re.fullmatch(r"\d{8}", date):
        raise BuildError(f"date {date!r}: expected YYYYMMDD")
    try:
        mtime = _mtime(date)
    except ValueError:
        raise BuildError(f"date {date!r} is not a calendar date") from None
    return mtime


def write_release(out_dir: str | os.PathLike[str], version: str, date: str, mtime: int,
                  files: dict[str, tuple[bytes, int]]) -> BuiltRelease:
    """Write ``files`` as the release tarball ``SGLang-MUSA-M1000-M1000_<version>_sglang.tar.gz``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    top = f"{date}_M1000_{version}_sglang"
    dest = out / tarball_name(version)
    _write_tar(dest, top, files, mtime)
    digest = hashlib.sha256(dest.read_bytes()).hexdigest()
    return BuiltRelease(path=dest, sha256=digest, version=version, top=top)


def _model_config(model_dir: str) -> dict[str, object]:
    vl = "VL" in model_dir
    return {
        "_name_or_path": model_dir,
        "architectures": ["Qwen3VLForConditionalGeneration" if vl else "Qwen3MoeForCausalLM"],
        "model_type": "qwen3_vl" if vl else "qwen3_moe",
        "quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128},
        "torch_dtype": "float16",
        "m1000_sim": {"stand_in": True},
    }


def make_models(root: str | os.PathLike[str], keys: list[str] | tuple[str, ...] | None = None) -> dict[str, Path]:
    """Stand-in model folders (``<root>/<model_dir>/config.json``) for ``keys`` (default: all)."""
    chosen = list(MODEL_KEYS) if keys is None else list(keys)
    unknown = [k for k in chosen if k not in MODEL_KEYS]
    if unknown:
        raise BuildError(f"unknown model key(s) {', '.join(unknown)} (known: {', '.join(MODEL_KEYS)})")
    base = Path(root)
    out: dict[str, Path] = {}
    for key in chosen:
        d = base / MODEL_KEYS[key].model_dir
        d.mkdir(parents=True, exist_ok=True)
        cfg = d / "config.json"
        if not cfg.exists():
            tmp = d / f".config.json.tmp.{os.getpid()}"
            tmp.write_text(json.dumps(_model_config(d.name), indent=2) + "\n", encoding="utf-8")
            os.replace(tmp, cfg)
        out[key] = d
    return out
