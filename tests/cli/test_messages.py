"""What fleetctl says when a newcomer gets something wrong (issue 27): one line naming what and where,
the fix when there is one, exit 2; what it prints when it did something a newcomer might not find."""

from __future__ import annotations

import json

import pytest

from tests.support.cli import one_line, run_main


# --regress and --slow: one line, not the simulator's traceback; the reports' metric names work
@pytest.mark.parametrize(("args", "says"), [
    (["--regress", "qwen3:decode_tps:0.5x"], "regression 'qwen3:decode_tps:0.5x': fraction '0.5x' is not a number"),
    (["--regress", "qwen3:latency:0.08"],
     "regression 'qwen3:latency:0.08': unknown metric 'latency' (known: prefill, decode, accept, vision, load, all, "
     "or as the reports name them: prefill_tps, ttft_ms, decode_tps, tpot_ms, accept_rate, accept_rate_len, "
     "vision_fps, server_ready_s)"),
    (["--regress", "qwen3:decode"], "regression 'qwen3:decode': expected MODEL_KEY:METRIC:FRACTION, e.g. "
                                    "qwen3:decode_tps:0.08"),
    (["--slow", "0.5"], "--slow 0.5: expected a factor above 1 (1.12: one module 12 % slower)"),
    (["--throttle"], "--throttle says why the slow module is slow: give --slow F too"),
])
def test_a_bad_demo_knob_is_one_line_before_anything_is_built(env, capsys, args, says):
    code, _, err = run_main(capsys, "demo", "--out", str(env / "demo"), *args)
    assert code == 2 and one_line(err) == f"fleetctl: error: {says}"
    assert not (env / "demo").exists()


@pytest.mark.parametrize(("regress", "speed"), [
    (("qwen3:decode_tps:0.08",), "qwen3:decode=0.92"),  # the name the reports print
    (("qwen3:decode:0.08",), "qwen3:decode=0.92"),
    (("all:tpot_ms:0.08", "qwen3vl:vision_fps:0.1"), "decode=0.925926,qwen3vl:vision=0.9"),  # TPOT 8 % longer
    ((), "1.0"),
])
def test_demo_regress_takes_the_reports_metric_names(regress, speed):
    from controller.cli.demo import DemoOptions, release_speed

    assert release_speed(DemoOptions(regress=regress, slow=1.12, throttle=True)) == speed


def test_demo_devices_is_the_hidden_old_name_of_modules(env, capsys):
    """docs/reference/cli.md: old spellings kept hidden, demo --devices N among them (-d/--devices is a selector
    on every other verb)."""
    code, out, _ = run_main(capsys, "demo", "--help")
    assert code == 0 and "--modules" in out and "--devices" not in out
    code, _, err = run_main(capsys, "demo", "--devices", "2", "--slow", "0.5", "--out", str(env / "demo"))
    assert code == 2 and "--slow 0.5" in one_line(err)  # still parsed, then the knob refused


# a fresh lab: "no run history" said what is missing, not what to do
@pytest.fixture
def on_path(monkeypatch):
    """PATH finds this fleetctl (the one beside this Python): hints say plain `fleetctl`."""
    import os
    import sys
    from pathlib import Path

    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"]))


FIRST_STEPS = ("import a baseline with `fleetctl baseline import FILE --release R`, or run a validation "
               "(`fleetctl validate TARBALL`)")


@pytest.mark.parametrize(("args", "prefix"), [
    (["baseline", "list"], ""), (["report", "latest"], ""), (["report"], ""), (["compare", "a", "b"], ""),
    (["trend"], ""),
    (["results"], "no run 'latest': "), (["status", "latest"], "no run 'latest': "),
])
def test_without_a_history_every_read_verb_says_how_one_starts(env, capsys, on_path, args, prefix):
    code, out, err = run_main(capsys, *args)
    assert code == 2 and out == ""
    assert one_line(err) == (f"fleetctl: error: {prefix}no run history at {env / 'history.sqlite'} yet: "
                             f"{FIRST_STEPS}")
    assert not (env / "history.sqlite").exists()


def test_runs_without_a_history_lists_nothing_and_says_why(env, capsys, on_path):
    code, out, err = run_main(capsys, "runs", "-o", "json")
    assert (code, out) == (0, "[]\n")
    assert one_line(err) == f"no run history at {env / 'history.sqlite'} yet: {FIRST_STEPS}"


def test_a_history_with_only_a_baseline_says_to_run_a_validation(env, capsys, on_path, seed_rows):
    from controller.history import History

    h = History(env / "history.sqlite")
    h.add_baseline("1.4.1", seed_rows, source="seed")
    h.close()
    code, out, err = run_main(capsys, "runs", "-o", "json")
    assert (code, out) == (0, "[]\n")
    says = f"no runs in {env / 'history.sqlite'} yet: run a validation (`fleetctl validate TARBALL`)"
    assert one_line(err) == says
    code, _, err = run_main(capsys, "report", "latest")
    assert code == 2 and one_line(err) == f"fleetctl: error: {says}"


# after `make demo`, fleetctl is .venv/bin/fleetctl, not on PATH: a hint says the command that works
def test_hints_name_the_running_fleetctl_when_path_finds_another_or_none(tmp_path, monkeypatch):
    import sys

    from controller.command import fleetctl

    (tmp_path / "bin").mkdir()
    exe = tmp_path / "bin" / "fleetctl"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["bin/fleetctl", "baseline", "list"])  # as typed
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert fleetctl("report", "latest") == "bin/fleetctl report latest"
    assert fleetctl("--history", "/a b/h.sqlite") == "bin/fleetctl --history '/a b/h.sqlite'"
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin")
    assert fleetctl("report", "latest") == "fleetctl report latest"
    monkeypatch.setattr(sys, "argv", [str(exe)])  # found on PATH: the shell passes the whole path
    assert fleetctl("watch", "run-1") == "fleetctl watch run-1"


def test_a_fresh_lab_hint_from_the_venv_fleetctl(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    venv_bin = Path(sys.executable).parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env.update(PATH="/usr/bin:/bin", FLEET_DATA_DIR=str(tmp_path))
    exe = os.path.relpath(venv_bin / "fleetctl", root)
    r = subprocess.run([exe, "baseline", "list"], cwd=root, env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert r.stderr == (f"fleetctl: error: no run history at {tmp_path / 'history.sqlite'} yet: import a baseline "
                        f"with `{exe} baseline import FILE --release R`, or run a validation "
                        f"(`{exe} validate TARBALL`)\n")


@pytest.mark.slow  # over the fast tier's 2 s CPU budget with a neighbour on the other core
def test_report_html_without_out_says_where_it_wrote(filled, capsys):
    code, out, err = run_main(capsys, "report", "run-b", "-o", "html")
    where = filled.parent / "report-run-b" / "report.html"
    assert code == 0 and where.is_file()
    assert err == f"wrote {where}\n" and out.startswith("REGRESSED run-b")
    code, out, _ = run_main(capsys, "report", "--help")
    assert "html/csv into ./report-RUN/" in " ".join(out.split())


def test_logs_of_an_unknown_step_name_it_and_the_known_ones(env, capsys):
    from controller.history import History
    from tests.support.cli import finished_run

    logs = env / "work" / "runs" / "r1" / "logs"
    logs.mkdir(parents=True)
    (logs / "01-unpack.log").write_text("unpacked\n")
    (env / "inv.toml").write_text(f'[[module]]\nname = "m1"\ntransport = "local"\nworkdir = "{env / "work"}"\n')
    finished_run(History(env / "history.sqlite"), "r1", modules=["m1"])
    code, out, err = run_main(capsys, "logs", "r1", "--step", "nope")
    assert (code, out) == (2, "")
    assert one_line(err) == ("fleetctl: error: --step 'nope': no such step (the steps with logs: fetch, unpack, "
                             "configure, generate, environment, precompile, server, benchmark)")
    code, _, err = run_main(capsys, "logs", "r1", "--key", "qwen9")
    assert code == 2 and one_line(err).startswith("fleetctl: error: --key 'qwen9': no such model key (known: qwen3, ")
    code, out, err = run_main(capsys, "logs", "r1", "--step", "precompile")  # a step that left no log (yet)
    assert (code, out) == (0, "") and "no step logs of run r1 (yet)" in err


def test_the_agent_names_its_logs_only_by_the_steps_fleetctl_offers(tmp_path):
    from agent.store import RunStore
    from contract.vocab import LOG_STEPS

    store = RunStore(tmp_path)
    assert [store.next_log("r1", s).name for s in LOG_STEPS[:2]] == ["01-fetch.log", "01-unpack.log"]
    with pytest.raises(ValueError, match="log step 'bench' is not in contract.vocab.LOG_STEPS"):
        store.next_log("r1", "bench")


# `fleetctl serve --new-token > tokens` wrote a file readable by others, which `serve` then refused
def test_new_token_adds_to_a_tokens_file_that_serve_accepts(env, capsys, on_path, monkeypatch):
    import stat

    from controller.serve.tokens import Identity, Role, TokenError, Tokens

    monkeypatch.setenv("FLEET_USER", "alice")
    path = env / "tokens"
    path.write_text("# the CI's\n")
    path.chmod(0o644)
    with pytest.raises(TokenError) as exc:
        Tokens.load(path)
    assert str(exc.value) == (f"{path}: the API tokens file is readable by others (chmod 600 {path}; "
                              f"`fleetctl serve --new-token --tokens {path}` writes it 0600)")
    code, out, err = run_main(capsys, "serve", "--new-token", "--tokens", str(path))
    first = out.strip()
    assert code == 0 and len(first) == 48
    assert err == f"added a token of user alice, role trigger, to {path} (mode 0600, 1 token)\n"
    code, out, err = run_main(capsys, "serve", "--new-token", "--tokens", str(path), "--user", "ci", "--role", "read")
    second = out.strip()
    assert code == 0 and err == f"added a token of user ci, role read, to {path} (mode 0600, 2 tokens)\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text() == f"# m1000-fleet tokens v2\n# the CI's\nalice trigger {first}\nci read {second}\n"
    tokens = Tokens.load(path)
    assert tokens.identify(first) == Identity("alice", Role.trigger)
    assert tokens.identify(second) == Identity("ci", Role.read)
    fresh = env / "new" / "tokens"  # no file, no folder yet
    code, out, _ = run_main(capsys, "serve", "--new-token", "--tokens", str(fresh), "--role", "admin")
    assert code == 0 and Tokens.load(fresh).identify(out.strip()) == Identity("alice", Role.admin)
    code, out, err = run_main(capsys, "serve", "--new-token")  # as before: the token only
    assert code == 0 and len(out.strip()) == 48 and err == ""
    code, _, err = run_main(capsys, "serve", "--new-token", "--tokens", str(fresh), "--role", "root")
    assert code == 2 and one_line(err) == "fleetctl: error: role 'root': one of read, trigger, admin"
    code, _, err = run_main(capsys, "serve", "--new-token", "--user", "bob")
    assert code == 2 and "--user and --role name the owner of a token added with --new-token --tokens FILE" in err


# an old flat tokens file (one token a line, every token could do anything) is upgraded in place when a named
# token is added: its tokens stay admin, as users token-N
def test_new_token_upgrades_a_flat_tokens_file(env, capsys):
    from controller.serve.tokens import Identity, Role, Tokens

    path = env / "tokens"
    old1, old2 = "a" * 32, "b" * 32
    path.write_text(f"# CI\n{old1}\n\n{old2}\n")
    path.chmod(0o600)
    code, out, err = run_main(capsys, "serve", "--new-token", "--tokens", str(path), "--user", "bob")
    assert code == 0 and err == f"added a token of user bob, role trigger, to {path} (mode 0600, 3 tokens)\n"
    new = out.strip()
    assert path.read_text() == (f"# m1000-fleet tokens v2\n# CI\ntoken-1 admin {old1}\n\ntoken-2 admin {old2}\n"
                                f"bob trigger {new}\n")
    t = Tokens.load(path)
    assert [t.identify(x) for x in (old1, old2, new)] == [
        Identity("token-1", Role.admin), Identity("token-2", Role.admin), Identity("bob", Role.trigger)]


# a file with a tarball's name but not a release inside was dispatched to every module, and failed at unpack
def test_validate_refuses_what_is_not_a_release_before_dispatch(env, capsys):
    from controller.history import History
    from tests.support.cli import TARBALL

    (env / "junk").mkdir()
    (env / "junk" / TARBALL).write_bytes(b"<html>404 not found</html>")
    code, _, err = run_main(capsys, "validate", f"junk/{TARBALL}", "--models", "qwen3", "--detach")
    assert code == 2
    assert one_line(err).startswith(f"fleetctl: error: junk/{TARBALL}: not a readable release tarball (a "
                                    "gzip-compressed tar): ")
    assert History(env / "history.sqlite").runs() == [] and not (env / "fleet" / "releases").exists()
    code, out, err = run_main(capsys, "validate", TARBALL, "--models", "qwen3", "--detach")  # the stub: a release
    assert code == 0, err


def test_a_lab_folders_fleet_toml_is_read_without_dash_c(filled, capsys, monkeypatch, tmp_path):
    """A new user in their lab folder ran `fleetctl devices` without -c: the folder's fleet.toml was passed over for
    the embedded broker and the defaults, and every module of the Redis lab showed offline. ./fleet.toml is the
    default config, as ./inventory.toml is the default inventory."""
    lab = tmp_path / "lab"
    lab.mkdir()
    (lab / "fleet.toml").write_text(f'[controller]\nhistory = "{filled}"\n')
    monkeypatch.delenv("FLEET_HISTORY")
    monkeypatch.chdir(lab)
    code, out, err = run_main(capsys, "runs", "-o", "json")
    assert code == 0, err
    assert {"run-a", "run-b"} <= {r["run_id"] for r in json.loads(out)}
    (lab / "fleet.toml").write_text("[controler]\n")  # and it is checked like any config
    code, _, err = run_main(capsys, "runs")
    assert code == 2 and one_line(err).startswith("fleetctl: error: fleet.toml: unknown section [controler]")


@pytest.mark.parametrize(("skew", "shown"), [(-0.3, "0 s"), (0.4, "0 s"), (-2.6, "-3 s"), (12.0, "+12 s"),
                                             (None, "")])
def test_clock_skew_never_reads_minus_zero(skew, shown):
    from controller.cli.devices import shown_skew

    assert shown_skew(skew) == shown


# fleetctl serve on a busy /metrics port printed a traceback naming neither the port nor the setting (issue 51)
def test_serve_on_a_busy_metrics_port_names_it_and_the_setting(env, capsys, monkeypatch):
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        monkeypatch.setenv("FLEET_CONTROLLER_METRICS_PORT", str(port))
        code, _, err = run_main(capsys, "serve")
    assert code == 2 and one_line(err) == (
        f"fleetctl: error: /metrics could not listen on 127.0.0.1:{port} (Address already in use): set metrics_port "
        "in [controller] (FLEET_CONTROLLER_METRICS_PORT; 0 turns /metrics off)")
