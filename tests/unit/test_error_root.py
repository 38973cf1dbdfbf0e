"""The controller's one error root (``controller.errors``): every exception class the controller defines is a
``FleetctlError`` (a user can cause it: it carries the CLI's exit code and the API's HTTP status), or one of the
internal signals listed here with the reason none can reach a user. The CLI and the API take exit code and status
from the error itself, and the few errors of other packages a user can cause from one table."""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import controller
from controller.errors import FleetctlError, exit_code_of, http_status_of

ROOT = Path(__file__).resolve().parents[2]

# Exception classes of the controller that no user ever sees, and why.
INTERNAL: dict[str, str] = {
    "controller.service.release_url.Refused": (
        "an OSError by design: the guarded connect of a release download raises it inside urllib, which wraps it "
        "in URLError; fetch_release turns that into ReleaseUrlError (a FleetctlError) with the reason kept out"),
    "controller.cli.demo.DemoStopped": (
        "a stop signal's way out of the demo, as KeyboardInterrupt (a BaseException): run_demo catches it, stops the "
        "simulated fleet and returns 128 + the signal's number"),
    "controller.serve.pages.view.PageError": (
        "the run browser's way to answer a status as a page (its own exception handler renders it); the user errors "
        "it stands for are FleetctlErrors raised first (a filter: FilterError) or the API's refusals"),
    "controller.serve.pages.auth.LoginNeeded": (
        "the run browser's redirect to its login page (its own exception handler answers it), not an error"),
    "controller.service.webhooks.Retryable": (
        "tenacity's retry signal inside Webhooks._deliver, which catches everything when it gives up (a webhook "
        "that fails is logged, the service goes on)"),
}

# Every user error with (CLI exit code, HTTP status): what tests/cli and tests/api assert, pinned in one place.
EXPECTED: dict[str, tuple[int, int]] = {
    "controller.errors.FleetctlError": (2, 400),
    "controller.fleet.errors.FleetError": (2, 400),
    "controller.fleet.errors.BrokerUnavailable": (2, 503),
    "controller.fleet.errors.BadRelease": (2, 400),
    "controller.fleet.errors.RunIdInUse": (2, 400),
    "controller.fleet.errors.EvictingBroker": (2, 503),
    "controller.history.records.HistoryError": (2, 404),
    "controller.serve.pages.data.FilterError": (2, 400),
    "controller.history.records.HistoryFull": (2, 503),
    "controller.history.records.HistoryStopped": (2, 503),
    "controller.history.records.HistoryUnavailable": (2, 503),
    "controller.inventory.InventoryError": (2, 400),
    "controller.remote.acl.AclError": (2, 400),
    "controller.remote.deploy.model.DeployError": (2, 400),
    "controller.remote.pdu.PowerError": (2, 502),
    "controller.remote.push.PushError": (2, 400),
    "controller.remote.ssh.SshError": (2, 400),
    "controller.remote.ssh.HostKeyError": (2, 400),
    "controller.remote.ssh.UnreachableError": (2, 400),
    "controller.remote.ssh.AuthError": (2, 400),
    "controller.remote.ssh.RemoteCommandError": (2, 400),
    "controller.report.model.ReportError": (2, 400),
    "controller.report.analysis.changepoints.SeriesError": (2, 400),
    "controller.report.environment.EnvironmentRefused": (2, 400),
    "controller.report.trend.TrendError": (2, 400),
    "controller.serve.links.LinkError": (2, 403),
    "controller.serve.links.LinkSecretError": (2, 400),
    "controller.serve.tokens.TokenError": (2, 400),
    "controller.service.session.ServiceError": (2, 400),
    "controller.service.session.BadRequest": (2, 400),
    "controller.service.bisect_plan.BisectPlanError": (2, 400),
    "controller.service.session.NotFound": (2, 404),
    "controller.service.session.Conflict": (2, 409),
    "controller.service.session.Forbidden": (2, 403),
    "controller.service.session.UnusableRelease": (2, 422),
    "controller.service.release_url.ReleaseUrlError": (2, 400),
    "controller.settings.ConfigError": (2, 400),
}


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def controller_exceptions() -> dict[str, type[BaseException]]:
    """Every exception class defined in ``controller``: every module imported (``__main__`` runs the CLI), then
    the module-level names and every subclass of BaseException whose module is the controller's."""
    for info in pkgutil.walk_packages(controller.__path__, "controller."):
        if not info.name.endswith(".__main__"):
            importlib.import_module(info.name)
    found: dict[str, type[BaseException]] = {}

    def walk(cls: type[BaseException]) -> None:
        for sub in cls.__subclasses__():
            if sub.__module__.partition(".")[0] == "controller":
                found[_name(sub)] = sub
            walk(sub)

    walk(BaseException)
    for mod in list(sys.modules.values()):
        if getattr(mod, "__name__", "").partition(".")[0] != "controller":
            continue
        for obj in vars(mod).values():
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == mod.__name__:
                found[_name(obj)] = obj
    return found


def test_every_controller_exception_is_under_the_root():
    found = controller_exceptions()
    outside = sorted(n for n, cls in found.items() if not issubclass(cls, FleetctlError) and n not in INTERNAL)
    assert outside == [], "a user can cause these: derive them from controller.errors.FleetctlError (or list one " \
                          "in INTERNAL with the reason no user can)"
    assert set(INTERNAL) <= set(found), "INTERNAL names a class that is gone"
    assert not any(issubclass(found[n], FleetctlError) for n in INTERNAL)


def test_exit_codes_and_statuses_are_the_ones_the_surfaces_promise():
    found = {n: cls for n, cls in controller_exceptions().items() if issubclass(cls, FleetctlError)}
    assert {n: (cls.exit_code, cls.http_status) for n, cls in found.items()} == EXPECTED


def test_the_class_lines_the_walk_sees_are_every_exception_class_in_the_sources():
    """A class defined in a function body would escape the import walk until the function runs: the sources
    define exception classes at module level only (every ``class X(...Error|Exception...)`` the ast sees)."""
    nested = []
    for path in sorted((ROOT / "controller").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and id(node) not in top:
                bases = [ast.unparse(b) for b in node.bases]
                if any(b.endswith(("Error", "Exception", "Unavailable", "Retryable")) for b in bases):
                    nested.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert nested == []


def test_foreign_errors_a_user_causes_come_from_one_table() -> None:
    from pydantic import BaseModel, ValidationError

    from contract.records import UnknownModelKey
    from contract.settings import SettingsError

    class M(BaseModel):
        n: int

    with pytest.raises(ValidationError) as invalid:
        M(n="x")  # type: ignore[arg-type]  # the bad value is the point
    assert (exit_code_of(SettingsError("x")), http_status_of(SettingsError("x"))) == (2, 400)
    assert (exit_code_of(UnknownModelKey("x")), http_status_of(UnknownModelKey("x"))) == (2, 400)
    assert (exit_code_of(invalid.value), http_status_of(invalid.value)) == (2, 400)
    assert (exit_code_of(FileNotFoundError("x")), http_status_of(FileNotFoundError("x"))) == (2, None)
    assert (exit_code_of(ValueError("x")), http_status_of(ValueError("x"))) == (None, 400)
    assert (exit_code_of(RuntimeError("x")), http_status_of(RuntimeError("x"))) == (None, None)


def test_an_instance_may_carry_its_own_codes(monkeypatch, capsys):
    """The CLI exits with the error's own code, on one line; the API answers its own status."""
    from controller.cli import app

    class Odd(FleetctlError):
        exit_code = 3

    def raiser() -> object:
        def call(**_kw: object) -> None:
            raise Odd("odd input")
        return call

    monkeypatch.setattr(app, "build_app", raiser)
    assert app.run([]) == 3
    assert capsys.readouterr().err.strip().splitlines() == ["fleetctl: error: odd input"]
    e = FleetctlError("x")
    e.http_status = 418
    assert http_status_of(e) == 418


def test_the_root_is_light():
    """``controller.errors`` imports the standard library only, at import time (the CLI handles errors with it)."""
    tree = ast.parse((ROOT / "controller" / "errors.py").read_text(encoding="utf-8"))
    top = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    assert all(isinstance(n, ast.ImportFrom) and n.module == "__future__" for n in top)
    code = "import json, sys; import controller.errors; print(json.dumps(sorted(sys.modules)))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    loaded = {m.partition(".")[0] for m in json.loads(r.stdout)}
    assert loaded & {"pydantic", "typer", "rich", "pandas", "paramiko", "fastapi", "celery", "redis"} == set()
