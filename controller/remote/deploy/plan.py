"""Pure planning: the probe's answer as facts, and the actions that take a module to its desired state.

The probe (``scripts/probe.py``, read only) runs on the module and prints what it found as JSON.
"""

from __future__ import annotations

from typing import Any

from controller.remote.deploy.model import MIN_PYTHON, Action, DeployError, Desired, ModuleFacts, script

PROBE = script("probe.py")


def parse_probe(module: str, data: dict[str, Any]) -> ModuleFacts:
    """The probe's JSON answer as facts; one clear error when it is not what we expect."""
    try:
        v = tuple(int(x) for x in data["version"])
        facts = ModuleFacts(
            python=str(data["python"]), version=(v[0], v[1], v[2]), machine=str(data["machine"]),
            glibc=data.get("glibc"), home=str(data["home"]), workdir=str(data["workdir"]),
            free_bytes=int(data["free"]), systemd_user=bool(data["systemd_user"]), running=bool(data["running"]),
            venv_ok=bool(data["venv_ok"]), wheels={str(k): int(s) for k, s in dict(data.get("wheels", {})).items()},
            state={str(k): str(s) for k, s in dict(data.get("state", {})).items()},
        )
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise DeployError(f"{module}: probe answer not understood ({exc!r}): {str(data)[:200]}") from None
    if facts.version[:2] < MIN_PYTHON:
        raise DeployError(f"{module}: {facts.python} is Python {'.'.join(map(str, facts.version))}; "
                          f"the agent needs >= {'.'.join(map(str, MIN_PYTHON))}")
    return facts


def plan_module(facts: ModuleFacts, desired: Desired) -> tuple[Action, ...]:
    """What must change on a module to reach ``desired`` (empty: nothing)."""
    want = desired.digests()
    have = facts.state
    actions: list[Action] = []
    wh = desired.wheelhouse
    missing = [p.name for p in (*wh.deps, wh.pip) if facts.wheels.get(p.name) != p.stat().st_size]
    version = ".".join(map(str, facts.version))
    new_venv = not facts.venv_ok or have.get("python") != version
    install = new_venv or have.get("install") != want["install"]
    if missing:
        actions.append(Action("upload_wheels", f"{len(missing)} files"))
    if new_venv:
        actions.append(Action("create_venv", f"Python {version}"))
    if install:
        actions.append(Action("install", f"m1000-fleet {wh.project.name.split('-')[1]} + {len(wh.deps)} wheels"))
    if have.get("config") != want["config"]:
        actions.append(Action("write_config"))
    if have.get("service") != want["service"] or have.get("mode") != desired.service_mode:
        actions.append(Action("write_service", desired.service_mode))
    if actions:
        actions.append(Action("restart" if facts.running else "start", desired.service_mode))
    elif not facts.running:
        actions.append(Action("start", desired.service_mode))
    return tuple(actions)
