"""docs/getting-started.md, run as written: its console blocks in order, in a fresh home folder, to a PASS verdict,
each command printing what the page shows under it.

The commands come from the page itself (tests/support/guide.py reads them), so the page cannot drift from what
works. The test's home folder is a fresh temp folder with the clone where the page says it is
(``~/src/m1000-fleet``, a link to this checkout); the blocks the page marks ``skip`` (apt-get, git clone,
make install) are what this machine has already. Each command's output is compared with the page's
(tests/support/guide_output.py: run ids, hashes, durations and measured figures normalised, ``...`` shortens);
the home is ``/tmp/`` and 4 letters, as long as the page's ``/home/lab``, so that its tables are as wide.
``GUIDE_REGENERATE=1`` (``make guide-outputs``) writes what the commands printed back into the page instead of
failing on a difference. After the page's last step ("stop everything") no process it started may be left:
each carries a token in its environment, or works under the temp home.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import socket
from pathlib import Path

import psutil
import pytest

from tests.support.guide import GuideShell, Outcome, parse_guide, runnable
from tests.support.guide_output import PAGE_HOME, Mismatch, mismatch, regenerated, rewrite
from tests.support.procs import env_has, processes_under

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "getting-started.md"
EXAMPLES = ROOT / "docs" / "examples"
CLONE = Path("src") / "m1000-fleet"  # where the page has the reader clone the project, under their home
TOKEN_VAR = "GUIDE_TEST_TOKEN"
REGENERATE = os.environ.get("GUIDE_REGENERATE") == "1"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.redis,
    pytest.mark.skipif(not (shutil.which("redis-server") and shutil.which("redis-cli")),
                       reason="redis-server and redis-cli not on PATH (apt-get install redis-server)"),
    pytest.mark.skipif(not (ROOT / ".venv" / "bin" / "fleetctl").exists(), reason=".venv not built (make install)"),
    pytest.mark.timeout(600),
]


def _ports() -> set[int]:
    """Fixed ports the page and its example files name (a taken one would make the run talk to a stranger)."""
    text = PAGE.read_text(encoding="utf-8") + "".join(p.read_text(encoding="utf-8") for p in EXAMPLES.glob("*.toml"))
    found = re.findall(r"--port (\d+)|-p (\d+)|port = (\d+)|127\.0\.0\.1:(\d+)", text)
    return {int(n) for groups in found for n in groups if n}


def _taken(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _started(token: str, home: Path, shell_pid: int) -> list[psutil.Process]:
    """Live processes the page's commands started: the token in their environment, or working under home."""
    found = {p.pid: p for p in processes_under(home)}
    for p in psutil.process_iter():
        if p.pid not in found and env_has(p, token):
            found[p.pid] = p
    out = []
    for pid, p in found.items():
        try:
            if pid not in (shell_pid, os.getpid()) and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            continue
    return out


def _describe(procs: list[psutil.Process]) -> str:
    out = []
    for p in procs:
        try:
            out.append(f"{p.pid} {' '.join(p.cmdline())[:160]}")
        except psutil.Error:
            continue
    return "; ".join(out)


def _short_home() -> Path:
    """A fresh folder ``/tmp/`` + 4 random letters: as long as the page's home (its tables keep their widths)."""
    letters = "abcdefghijklmnopqrstuvwxyz0123456789"
    for _ in range(100):
        path = Path("/tmp/" + "".join(secrets.choice(letters) for _ in range(len(PAGE_HOME) - len("/tmp/"))))
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            continue
        return path
    raise AssertionError("no free /tmp/XXXX folder for the guide's home")


def _write_back(mismatches: list[Mismatch]) -> list[str]:
    """Write the printed outputs into the page; the commands whose shortened output could not be placed."""
    fixes, by_hand = [], []
    for m in mismatches:
        new = regenerated(m.command.shown, m.printed)
        if new is None:
            by_hand.append(m.describe())
        else:
            fixes.append((m.command, new))
    PAGE.write_text(rewrite(PAGE.read_text(encoding="utf-8"), fixes), encoding="utf-8")
    return by_hand


def _transcript(outcomes: list[Outcome]) -> str:
    return "\n".join(f"$ {o.command.text}   # line {o.command.line}, exit {o.exit_code}, {o.seconds:.1f} s, "
                     f"{o.tries} tries\n{o.output}" for o in outcomes)


def test_the_getting_started_page_run_as_written_ends_in_a_pass_verdict_and_leaves_nothing_running(
        tmp_path: Path) -> None:
    commands = runnable(parse_guide(PAGE.read_text(encoding="utf-8")))
    taken = sorted(p for p in _ports() if _taken(p))
    assert not taken, f"ports the page uses are taken on this machine: {taken}"

    home = _short_home()
    (home / CLONE).parent.mkdir(parents=True)
    (home / CLONE).symlink_to(ROOT, target_is_directory=True)
    token = secrets.token_hex(12)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FLEET_", "M1000_", "XDG_", "VIRTUAL_ENV", "PYTHON"))}
    env.update(HOME=str(home), PATH=f"{ROOT / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}", COLUMNS="120",
               TERM="dumb", **{TOKEN_VAR: token})

    shell = GuideShell(home, env)
    outcomes: list[Outcome] = []
    mismatches: list[Mismatch] = []
    try:
        for cmd in commands:
            outcome = shell.run(cmd)
            outcomes.append(outcome)
            (tmp_path / "transcript.txt").write_text(_transcript(outcomes), encoding="utf-8")
            assert outcome.exit_code == 0 and outcome.matched, (
                f"line {cmd.line}: `{cmd.text}` " + (f"exited {outcome.exit_code}" if outcome.exit_code else
                                                    f"never showed /{cmd.until}/ in {cmd.retry_for:.0f} s")
                + f"; transcript:\n{_transcript(outcomes)[-6000:]}")
            if (m := mismatch(cmd, outcome.output, str(home))) is not None:
                mismatches.append(m)

        validations = [o for o in outcomes if re.search(r"\bfleetctl\b.*\bvalidate\b", o.command.text)]
        assert validations, "the page validates no release (no `fleetctl ... validate` command)"
        assert re.search(r"^verdict: pass - PASS ", validations[-1].output, re.MULTILINE), validations[-1].output

        # the page's last step stops everything: nothing it started may outlive it (a few seconds to exit)
        left: list[psutil.Process] = []
        for _ in range(30):
            left = _started(token, home, shell.proc.pid)
            if not left:
                break
            psutil.wait_procs(left, timeout=0.5)
        assert not left, f"still running after the page's last step ({commands[-1].text!r}): {_describe(left)}"

        if REGENERATE and mismatches:
            by_hand = _write_back(mismatches)
            assert not by_hand, "written back but these (edit them by hand):\n\n" + "\n\n".join(by_hand)
        assert REGENERATE or not mismatches, (
            "the page shows another output than the command printed (make guide-outputs writes them back):\n\n"
            + "\n\n".join(m.describe() for m in mismatches))
    finally:
        shell.close()
        for p in _started(token, home, shell.proc.pid):
            try:
                p.send_signal(signal.SIGKILL)
            except psutil.Error:
                continue
        shutil.rmtree(home, ignore_errors=True)
