"""docs/reference/*.md: their generated blocks are what the code gives (``make reference`` writes them with
``docs/tools/gen_reference.py``), and what the generator writes is valid, complete Markdown."""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import typer

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "reference"
GENERATOR = ROOT / "docs" / "tools" / "gen_reference.py"


def _load() -> ModuleType:
    """The generator is a script of the docs, not a package: loaded from its file."""
    spec = importlib.util.spec_from_file_location("gen_reference", GENERATOR)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen = _load()


@pytest.mark.parametrize("page", sorted(gen.PAGES))
def test_the_reference_page_is_what_the_code_gives(page):
    text = (REFERENCE / page).read_text(encoding="utf-8")
    fresh = gen.render(page, text)
    assert fresh == text, gen.stale_message(page, text, fresh)


def test_a_new_option_makes_the_cli_page_stale(monkeypatch):
    """An option added to ``fleetctl validate`` and not to the page: the check fails, names the page and the fix,
    and shows the option's row."""
    from controller.cli import runs

    old = runs.validate
    sig = inspect.signature(old, eval_str=True)

    def validate(**kw: Any) -> Any:
        return old(**kw)

    validate.__doc__ = old.__doc__
    extra = inspect.Parameter("extra", inspect.Parameter.KEYWORD_ONLY, annotation=str,
                              default=typer.Option("x", "--extra", help="a new option"))
    # the signature inspect (and typer) read: a function's own attribute, which mypy's types do not declare
    validate.__signature__ = sig.replace(parameters=[*sig.parameters.values(), extra])  # type: ignore[attr-defined]
    monkeypatch.setattr(runs, "validate", validate)
    text = (REFERENCE / "cli.md").read_text(encoding="utf-8")
    fresh = gen.render("cli.md", text)
    message = gen.stale_message("cli.md", text, fresh)
    assert message.splitlines()[0] == "docs/reference/cli.md is stale: run `make reference`"
    counts = re.search(r"has \*\*(\d+) verbs\*\* with \*\*(\d+) options", text)
    assert counts is not None, "the page counts its verbs and options"
    verbs, options = map(int, counts.groups())
    added = [ln for ln in message.splitlines() if ln.startswith("+")]
    assert added[0] == "+++ generated" and added[2:] == ["+| `--extra` | str | `x` | a new option |"]
    assert added[1].startswith(f"+`fleetctl` has **{verbs} verbs** with **{options + 1} options** (")  # counted


def test_a_page_without_a_blocks_markers_is_refused_naming_the_block():
    text = (REFERENCE / "metrics.md").read_text(encoding="utf-8")
    cut = text.replace("<!-- generated:device-metrics end -->", "")
    with pytest.raises(gen.PageError) as err:
        gen.render("metrics.md", cut)
    assert str(err.value) == ("docs/reference/metrics.md: block generated:device-metrics appears 0 times (expected "
                              "once: put back its start and end markers)")


def test_help_text_is_escaped_for_markdown_tables_and_code_spans_are_kept():
    assert gen.md("a | b <v> [x] *y* _z_ snake_case `x|y` `<d>`") == \
        r"a \| b \<v\> \[x\] \*y\* \_z\_ snake_case `x\|y` `<d>`"
    assert gen.table(("a", "b"), [("1", "two\nlines")]) == "| a | b |\n| --- | --- |\n| 1 | two lines |"


def test_defaults_of_this_machine_are_written_as_on_any_machine():
    from agent.settings import AgentSettings
    from controller.settings import ControllerSettings

    fields = AgentSettings.model_fields
    assert gen.setting_default("module", fields["module"]) == "host name"
    assert gen.setting_default("workdir", fields["workdir"]) == "`~/m1000-fleet`"
    assert gen.setting_default("data_dir", fields["data_dir"]) == \
        "`~/.local/share/m1000-fleet` (`$XDG_DATA_HOME/m1000-fleet` when that is set)"
    known_hosts = ControllerSettings.model_fields["known_hosts"]
    assert gen.setting_default("known_hosts", known_hosts) == "`~/.ssh/known_hosts`"


def test_every_command_option_and_setting_says_what_it_is():
    """A blank in a generated table is a help text or a description missing in the code."""
    from agent.cli import app as agent_app
    from agent.settings import AgentSettings
    from controller.cli.app import build_app
    from controller.inventory import Module
    from controller.settings import ControllerSettings

    missing = []
    for root, prog in ((typer.main.get_command(build_app()), "fleetctl"),
                       (typer.main.get_command(agent_app), "fleet-agent")):
        for cmd, ctx in gen._click_tree(root, typer.Context(root, info_name=prog)):
            if not cmd.help:
                missing.append(ctx.command_path)
            missing += [f"{ctx.command_path} {p.name}" for p in cmd.get_params(ctx) if not p.hidden and not p.help]
    for model in (AgentSettings, ControllerSettings, Module):
        missing += [f"{model.__name__}.{n}" for n, f in model.model_fields.items() if not f.description]
    assert missing == []


@pytest.mark.slow
def test_the_pages_do_not_depend_on_the_machine_or_its_environment(tmp_path):
    """Another home folder, XDG_DATA_HOME and FLEET_* variables: the generator finds every page up to date."""
    env = {**os.environ, "HOME": str(tmp_path / "home"), "XDG_DATA_HOME": str(tmp_path / "xdg"),
           "FLEET_API_PORT": "8080", "FLEET_WORKDIR": "/srv/elsewhere", "FLEET_CONFIG": str(tmp_path / "none.toml")}
    r = subprocess.run([sys.executable, str(GENERATOR), "--check"], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=120)
    assert (r.returncode, r.stderr) == (0, "")
    assert r.stdout == "docs/reference: every generated block is up to date\n"
