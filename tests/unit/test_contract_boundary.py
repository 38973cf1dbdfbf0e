"""The shared contract lives in ``contract/``; the controller reaches into ``agent/`` only where it runs agent code.

Walks the sources with ``ast`` (nothing imported): a controller import of ``agent.<x>`` must be one of the
pairs listed here, each with the reason it is not contract; ``contract`` imports neither side nor a
controller-only dependency, and parses as Python 3.10 (the agent's floor).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# (controller file, agent module, name) the controller may import, and why it is not contract.
ALLOWED_AGENT_IMPORTS: dict[tuple[str, str, str], str] = {
    ("controller/remote/deploy/render.py", "agent.settings", "AgentSettings"): (
        "deploy writes/checks the agent's config"),
    ("controller/remote/deploy/render.py", "agent", "cli"): (
        "deploy asks the agent CLI of this source whether it has `worker`"),
    ("controller/service/releases.py", "agent.validate", "stage_local_release"): (
        "the embedded/local transport stages the tarball as the agent would"),
    ("controller/cli/demo.py", "agent.tables", "parse_seed"): "the demo's reference tables: the agent's parser",
    ("controller/cli/demo.py", "agent.procs", "MARK"): (
        "a demo finds what an earlier demo's agents left running in its folder by the agents' own mark"),
    ("controller/cli/report.py", "agent.tables", "TableError"): "`report --seed`: the agent's table parser",
    ("controller/cli/report.py", "agent.tables", "parse_seed"): "as TableError",
}
CONTRACT_MODULES = {"records", "kv", "celery_app", "safe_transport", "settings", "oneline", "digest", "eviction",
                    "vocab", "files", "redact", "version", "layout", "fingerprint", "energy", "kernel_store",
                    "priority",  # the broker order both sides keep (lower number first)
                    "attest", "cancel_token",  # the kernel cache's attestations, the pipeline's cancel token
                    "compat", "request_identity",  # the version policy (ADR 0051); what makes two requests one
                    "removed_settings"}  # the settings issue 50 removed, told in one line (ADR 0058)
# what contract/ may import besides the standard library: the agent's own dependencies
CONTRACT_THIRD_PARTY = {"pydantic", "pydantic_settings", "celery", "kombu", "redis"}


def _imports(path: Path) -> list[tuple[str, str, int]]:
    """(module, name, line) of every import in ``path``; ``import a.b`` gives (a.b, "", line)."""
    out: list[tuple[str, str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out += [(a.name, "", node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out += [(node.module, a.name, node.lineno) for a in node.names]
    return out


def _py(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def test_controller_imports_the_contract_from_contract_and_only_listed_agent_names() -> None:
    bad, used = [], set()
    for path in _py("controller"):
        rel = path.relative_to(ROOT).as_posix()
        for module, name, line in _imports(path):
            if module != "agent" and not module.startswith("agent."):
                continue
            key = (rel, module, name)
            if key in ALLOWED_AGENT_IMPORTS:
                used.add(key)
            else:
                where = "now contract." + module.split(".")[1] if module.split(".")[-1] in CONTRACT_MODULES else \
                    "not in ALLOWED_AGENT_IMPORTS"
                bad.append(f"{rel}:{line}: from {module} import {name or '*'} ({where})")
    assert not bad, "\n".join(bad)
    assert set(ALLOWED_AGENT_IMPORTS) == used, f"listed but no longer imported: {set(ALLOWED_AGENT_IMPORTS) - used}"


def test_the_contract_imports_neither_side_nor_controller_only_packages() -> None:
    stdlib = set(sys.stdlib_module_names)
    bad = []
    for path in _py("contract"):
        ast.parse(path.read_text(encoding="utf-8"), str(path), feature_version=(3, 10))
        for module, _, line in _imports(path):
            root = module.split(".")[0]
            if root not in stdlib | CONTRACT_THIRD_PARTY | {"contract", "__future__"}:
                bad.append(f"{path.relative_to(ROOT)}:{line}: imports {module}")
    assert not bad, "\n".join(bad)
    assert {p.stem for p in _py("contract")} == CONTRACT_MODULES | {"__init__"}
    for name in CONTRACT_MODULES:  # gone from agent/: no second copy, no shim
        assert not (ROOT / "agent" / f"{name}.py").exists() or name == "settings"


def test_importing_the_contract_loads_neither_side() -> None:
    code = ("import sys, contract.records, contract.kv, contract.celery_app, contract.safe_transport, "
            "contract.settings; print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('agent', 'controller', 'simulator', 'pandas', 'fastapi', 'paramiko')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_the_agent_wheel_carries_the_contract() -> None:
    import tomllib

    from controller.remote.deploy import PROJECT_PACKAGES

    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    assert "contract" in PROJECT_PACKAGES
    assert sorted(p.rstrip("*") for p in include) == sorted(PROJECT_PACKAGES)
