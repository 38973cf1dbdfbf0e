"""Issue 50 item 4: verbs whose names a user confuses, renamed; the old names kept hidden for one release, each
saying so in one line on stderr before it does what it did. ``release`` and ``compare-releases``:
tests/cli/test_reserve.py and tests/cli/test_compare_releases.py; here ``devices check --golden``, which started a
validation from a verb named check."""

from __future__ import annotations

import typer.main
from typer.core import TyperGroup

from tests.support.cli import one_line, run_main

MISSING = "SGLang-MUSA-M1000-M1000_9.9.9_sglang.tar.gz"


def test_golden_is_its_own_verb_and_devices_check_no_longer_shows_it(env, capsys) -> None:
    from controller.cli.app import build_app

    group = typer.main.get_group(build_app())
    devices = group.commands["devices"]
    assert isinstance(devices, TyperGroup)
    check = devices.commands["check"]
    shown = {o for p in check.params if not getattr(p, "hidden", False) for o in p.opts}
    assert "--golden" not in shown and "--tolerance" not in shown and "--models" not in shown
    assert {o for p in group.commands["golden"].params for o in p.opts} >= {"--devices", "--models", "--tolerance"}
    code, _, err = run_main(capsys, "golden", MISSING)
    assert code == 2 and one_line(err) == f"fleetctl: error: {MISSING}: no such release tarball"


def test_the_old_devices_check_golden_says_the_new_name_then_runs_it(env, capsys) -> None:
    code, _, err = run_main(capsys, "devices", "check", "--golden", MISSING)
    assert code == 2 and err.splitlines() == [
        "fleetctl: note: 'fleetctl devices check --golden REL' is now 'fleetctl golden REL'; the old name goes in "
        "the next release", f"fleetctl: error: {MISSING}: no such release tarball"]
