"""Drive an unpacked simulated release the way a module does: real scripts, real processes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import tarfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from contract.records import MODEL_KEYS
from simulator import BuiltRelease, build_release, make_models
from simulator.ports import free_port

MUSA = "scripts/ci/musa"
SYSTEM_PYTHON = "/usr/bin/python3"  # no venv: proves the release needs only the standard library


@dataclass
class Release:
    built: BuiltRelease
    root: Path  # unpacked top folder
    models: dict[str, Path]
    base_env: dict[str, str]

    @property
    def musa(self) -> Path:
        return self.root / MUSA

    def script(self, name: str) -> str:
        return str(self.musa / name)

    def run(self, name: str, env: dict[str, str] | None = None,
            timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.script(name)], cwd=self.root, env={**self.base_env, **(env or {})},
                              capture_output=True, text=True, timeout=timeout)

    def write_config(self, paths: list[str]) -> None:
        (self.musa / "tilelang_workflow_config.json").write_text(json.dumps({"model_paths": paths}))

    def setup_env(self) -> dict[str, str]:
        """Variables exported by ``source setup_env.sh`` (as the agent captures them)."""
        out = subprocess.run(["bash", "-c", f"source {MUSA}/setup_env.sh && env -0"], cwd=self.root,
                             env=self.base_env, capture_output=True, text=True, timeout=30, check=True)
        env = dict(item.split("=", 1) for item in out.stdout.split("\0") if "=" in item)
        return env


def unpack(tmp: Path, **build: Any) -> Release:
    built = build_release(tmp / "dist", **build)
    with tarfile.open(built.path) as tar:
        tar.extractall(tmp / "mod", filter="data")
    models = make_models(tmp / "models")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("M1000_SIM_", "TILELANG_", "SGLANG_", "QWEN"))}
    env.pop("MODEL_KEY", None)
    if Path(SYSTEM_PYTHON).exists():
        env["PYTHON"] = SYSTEM_PYTHON
    env.pop("PYTHONPATH", None)
    return Release(built=built, root=tmp / "mod" / built.top, models=models, base_env=env)


def prepared(tmp: Path, keys: tuple[str, ...] = tuple(MODEL_KEYS), **build: Any) -> tuple[Release, dict[str, str]]:
    """Unpacked, configured, generated, environment captured, kernels precompiled."""
    rel = unpack(tmp, **build)
    rel.write_config(sorted({str(rel.models[k]) for k in keys}))
    gen = rel.run("generate_tilelang_workflow.sh")
    assert gen.returncode == 0, gen.stderr
    env = rel.setup_env()
    pre = subprocess.run([rel.script("precompile_tilelang_kernels.sh")], cwd=rel.root, env=env,
                         capture_output=True, text=True, timeout=120)
    assert pre.returncode == 0, pre.stderr
    return rel, env


class Server:
    """A start script run in its own process group (stopped with the whole group)."""

    def __init__(self, rel: Release, key: str, env: dict[str, str], port: int | None = None,
                 extra_env: dict[str, str] | None = None) -> None:
        self.port = port or free_port()
        self.key = key
        spec = MODEL_KEYS[key]
        self.env = {**env, **spec.env, **(extra_env or {}), "SERVER_PORT": str(self.port)}
        self.stderr_text = ""
        self.proc = subprocess.Popen([rel.script(spec.start_script)], cwd=rel.root, env=self.env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def read_stderr(self) -> str:
        """What the server wrote on stderr, read to its end (once it has exited)."""
        assert self.proc.stderr is not None  # started with stderr=PIPE
        return self.proc.stderr.read()

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"server exited {self.proc.returncode}: {self.read_stderr()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)
        raise AssertionError("server not ready in time")

    def stop(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        if self.proc.stderr and not self.proc.stderr.closed:
            self.stderr_text = self.proc.stderr.read()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream:
                stream.close()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def bench(rel: Release, env: dict[str, str], key: str, port: int, extra: dict[str, str] | None = None,
          timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([rel.script("run_tilelang_benchmark.sh")], cwd=rel.root,
                          env={**env, "MODEL_KEY": key, "SERVER_PORT": str(port), **(extra or {})},
                          capture_output=True, text=True, timeout=timeout)


def processes_under(root: Path) -> list[psutil.Process]:
    """Live processes whose command line mentions the release folder (strays)."""
    found = []
    needle = str(root)
    for p in psutil.process_iter(["cmdline", "cwd"]):
        try:
            cmd = " ".join(p.info["cmdline"] or ())
            mine = needle in cmd or (p.info.get("cwd") or "").startswith(needle)
            if mine and p.pid != os.getpid() and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found
