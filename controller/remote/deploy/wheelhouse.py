"""The wheelhouse, built on the controller: the project wheel once, the locked dependencies per module platform.

A module installs offline from it (``--no-index --require-hashes``); the dependency wheels and pip are
downloaded once per platform and Python into a cache folder.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tempfile
import threading
import zipfile
from pathlib import Path

from controller.remote.deploy.model import DEFAULT_CACHE, ROOT, DeployError, ModuleFacts, Wheelhouse, sha


def wheel_content_digest(wheel: Path) -> str:
    """Digest of a wheel's members (names and bytes), independent of zip timestamps."""
    h = hashlib.sha256()
    with zipfile.ZipFile(wheel) as z:
        for name in sorted(z.namelist()):
            h.update(name.encode() + b"\0" + hashlib.sha256(z.read(name)).digest())
    return h.hexdigest()


# What the project wheel carries: the agent needs ``contract`` (records, KV layout, Celery app, broker settings).
PROJECT_PACKAGES = ("agent", "contract", "controller", "simulator")


def build_project_wheel(source_root: Path, out_dir: Path) -> Path:
    """Build the project's wheel from a copy of the source (the work tree stays untouched)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fleet-wheel-") as tmp:
        src = Path(tmp) / "src"
        src.mkdir()
        for name in ("pyproject.toml", "README.md"):
            if (source_root / name).exists():
                shutil.copy2(source_root / name, src / name)
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
        for pkg in PROJECT_PACKAGES:
            if (source_root / pkg).is_dir():
                shutil.copytree(source_root / pkg, src / pkg, ignore=ignore)
        dist = Path(tmp) / "dist"
        uv = shutil.which("uv") or str(Path(sys.executable).with_name("uv"))
        if Path(uv).exists():
            cmd = [uv, "build", "--wheel", "--quiet", "--out-dir", str(dist), str(src)]
        else:
            cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(src)]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        wheels = list(dist.glob("*.whl"))
        if p.returncode != 0 or len(wheels) != 1:
            raise DeployError(f"building the project wheel failed (exit {p.returncode}): {p.stderr.strip()[-300:]}")
        target = out_dir / wheels[0].name
        shutil.move(str(wheels[0]), target)
        return target


def pip_download_argv(facts: ModuleFacts, lock: Path, dest: Path) -> list[str]:
    """``pip download`` of the locked agent dependencies for the module's Python and platform."""
    major, minor = facts.version[:2]
    plats: list[str] = []
    if facts.glibc:
        gmaj, gmin = (int(x) for x in facts.glibc.split(".")[:2])
        plats += [f"manylinux_{gmaj}_{m}_{facts.machine}" for m in range(gmin, 16, -1)]
        plats += [f"manylinux2014_{facts.machine}"]
    plats += [f"linux_{facts.machine}"]
    argv = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--only-binary=:all:",
            "--python-version", f"{major}.{minor}", "--implementation", "cp", "--abi", f"cp{major}{minor}",
            "--abi", "abi3", "--abi", "none"]
    for p in plats:
        argv += ["--platform", p]
    return argv + ["-d", str(dest), "-r", str(lock)]


_locks: dict[str, threading.Lock] = {}
_locks_guard = threading.Lock()


def _lock_for(key: str) -> threading.Lock:
    with _locks_guard:
        return _locks.setdefault(key, threading.Lock())


def download_deps(facts: ModuleFacts, lock: Path, cache_dir: Path) -> tuple[tuple[Path, ...], Path]:
    """(dependency wheels, pip wheel) for the module's platform, from the cache or downloaded once."""
    key = f"{facts.platform_key}-{sha(lock.read_bytes())[:12]}"
    final = cache_dir / key
    with _lock_for(key):
        if not (final / ".complete").exists():
            cache_dir.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=cache_dir))
            try:
                for argv in (pip_download_argv(facts, lock, tmp / "deps"),
                             [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
                              "--only-binary=:all:", "--no-deps", "-d", str(tmp / "pip"), "pip"]):
                    p = subprocess.run(argv, capture_output=True, text=True, timeout=900)
                    if p.returncode != 0:
                        raise DeployError(f"downloading wheels for {facts.platform_key} failed: "
                                          f"{_last_error(p.stderr)}")
                (tmp / ".complete").write_text(key + "\n")
                shutil.rmtree(final, ignore_errors=True)
                tmp.rename(final)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    deps = tuple(sorted((final / "deps").glob("*.whl")))
    pips = sorted((final / "pip").glob("pip-*.whl"))
    if not deps or not pips:
        raise DeployError(f"wheel cache {final} is incomplete; remove it and deploy again")
    return deps, pips[-1]


def _last_error(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith("WARNING")]
    return (lines[-1] if lines else stderr.strip()[-300:])[:300]


class WheelhouseBuilder:
    """Builds the project wheel once and the per-platform wheelhouses on demand (thread safe)."""

    def __init__(self, source_root: Path = ROOT, cache_dir: Path = DEFAULT_CACHE, lock: Path | None = None,
                 project: Path | None = None) -> None:
        self.source_root = source_root
        self.cache_dir = cache_dir
        self.lock = lock or source_root / "requirements-agent.lock"
        if project is not None and not project.is_file():
            raise DeployError(f"{project}: wheel not found")
        self._project: Path | None = project  # a prebuilt wheel, else built from source_root once
        self._guard = threading.Lock()

    def project_wheel(self) -> Path:
        with self._guard:
            if self._project is None:
                out = Path(tempfile.mkdtemp(prefix="fleet-project-"))
                self._project = build_project_wheel(self.source_root, out)
            return self._project

    def __call__(self, facts: ModuleFacts) -> Wheelhouse:
        if not self.lock.is_file():
            raise DeployError(f"{self.lock}: agent lock file not found")
        deps, pip = download_deps(facts, self.lock, self.cache_dir)
        project = self.project_wheel()
        digest = sha("\n".join([wheel_content_digest(project), sha(self.lock.read_bytes()),
                                 *sorted(p.name for p in deps), pip.name]))
        return Wheelhouse(deps=deps, pip=pip, project=project, lock=self.lock, digest=digest)
