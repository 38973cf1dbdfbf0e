"""A docs page's shell session: its commands read from the page itself (pure), and a shell that runs them in order.

The commands are the page's ```` ```console ```` blocks: a line that starts with ``$ `` is a command (a line
ending in ``\\`` goes on on the next one), the lines after it up to the next command are its output as shown to
the reader (``Command.shown``; tests/support/guide_output.py compares them with what the command prints).
A MyST comment line just above a block (invisible on the rendered page) changes how it is run:

- ``% guide-test: skip``: not run (installing packages, cloning: the test's machine has them already);
- ``% guide-test: retry SECONDS until REGEX``: the block's command is run again, a second apart, until its
  output matches ``REGEX`` (``re.search``), as a reader runs ``fleetctl devices`` again until the agents show up;
- ``% guide-test: timeout SECONDS``: each command of the block may take this long (default
  :data:`DEFAULT_TIMEOUT`).

:class:`GuideShell` is the one I/O seam: one ``bash`` for the whole page, so ``cd``, ``export`` and background
jobs (``&``, ``jobs``, ``wait``) behave as in the reader's terminal.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import secrets
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from markdown_it import MarkdownIt

DEFAULT_TIMEOUT = 300.0
PROMPT = "$ "
_DIRECTIVE = re.compile(r"^%\s*guide-test:\s*(?P<body>.*?)\s*$")
_RETRY = re.compile(r"^retry (?P<seconds>\d+(?:\.\d+)?) until (?P<regex>.+)$")
_TIMEOUT = re.compile(r"^timeout (?P<seconds>\d+(?:\.\d+)?)$")


class GuideError(ValueError):
    """The page's markup cannot be read as a session (names the line)."""


@dataclass(frozen=True)
class Command:
    text: str  # what is typed after the prompt, continuation lines joined with newlines
    line: int  # 1-based line of the page where it starts
    timeout: float = DEFAULT_TIMEOUT
    retry_for: float = 0.0  # > 0: run again until ``until`` matches its output, for at most this long
    until: str | None = None
    shown: tuple[str, ...] = ()  # the output the page shows under it ("..." lines: shortened there)
    shown_at: int = 0  # 0-based line of the page where that output starts (it ends at shown_at + len(shown))


@dataclass(frozen=True)
class Block:
    line: int
    commands: tuple[Command, ...]
    skipped: bool


def _directives(lines: list[str], fence_line: int) -> list[tuple[int, str]]:
    """The ``% guide-test:`` comment lines right above the fence at 0-based ``fence_line`` (nearest last)."""
    out: list[tuple[int, str]] = []
    i = fence_line - 1
    while i >= 0:
        m = _DIRECTIVE.match(lines[i].strip())
        if not m:
            break
        out.insert(0, (i + 1, m.group("body")))
        i -= 1
    return out


def _commands(body: str, first_line: int) -> list[tuple[int, str, tuple[str, ...]]]:
    """(line, command, output shown under it) of every ``$ `` prompt in a console block's body; ``\\`` continues a
    command."""
    out: list[tuple[int, str, tuple[str, ...]]] = []
    lines = body.splitlines()
    i = 0
    while i < len(lines):
        raw = lines[i]
        if raw.startswith(PROMPT):
            start = i
            parts = [raw[len(PROMPT):]]
            while parts[-1].endswith("\\") and i + 1 < len(lines):
                i += 1
                parts.append(lines[i].removeprefix("> "))
            shown = []
            while i + 1 < len(lines) and not lines[i + 1].startswith(PROMPT):
                i += 1
                shown.append(lines[i])
            text = "\n".join(parts).strip()
            if text:
                out.append((first_line + start, text, tuple(shown)))
        i += 1
    return out


def parse_guide(text: str) -> list[Block]:
    """Every ``console`` block of a Markdown page, in order, with its commands and how to run them."""
    lines = text.splitlines()
    blocks: list[Block] = []
    for tok in MarkdownIt("commonmark").parse(text):
        if tok.type != "fence" or tok.info.strip().split(" ")[0] != "console" or tok.map is None:
            continue
        fence = tok.map[0]
        skipped, timeout, retry_for, until = False, DEFAULT_TIMEOUT, 0.0, None
        for line, body in _directives(lines, fence):
            if body == "skip":
                skipped = True
            elif m := _RETRY.match(body):
                retry_for, until = float(m.group("seconds")), m.group("regex")
                try:
                    re.compile(until)
                except re.error as exc:
                    raise GuideError(f"line {line}: guide-test retry: bad regex {until!r}: {exc}") from None
            elif m := _TIMEOUT.match(body):
                timeout = float(m.group("seconds"))
            else:
                raise GuideError(f"line {line}: unknown guide-test directive {body!r} "
                                 "(skip; retry SECONDS until REGEX; timeout SECONDS)")
        cmds = tuple(Command(text=c, line=n, timeout=timeout, retry_for=retry_for, until=until, shown=shown,
                             shown_at=n + c.count("\n"))
                     for n, c, shown in _commands(tok.content, fence + 2))
        if not cmds:
            raise GuideError(f"line {fence + 1}: a console block without a '{PROMPT}' command")
        if until is not None and len(cmds) != 1:
            raise GuideError(f"line {fence + 1}: guide-test retry applies to a block of one command, "
                             f"this one has {len(cmds)}")
        blocks.append(Block(line=fence + 1, commands=cmds, skipped=skipped))
    return blocks


def runnable(blocks: list[Block]) -> list[Command]:
    return [c for b in blocks if not b.skipped for c in b.commands]


@dataclass(frozen=True)
class Outcome:
    command: Command
    exit_code: int
    output: str
    seconds: float
    tries: int
    matched: bool  # the retry's regex matched the last output (True for a command without one)


class CommandTimeout(AssertionError):
    pass


class GuideShell:
    """One ``bash`` fed the page's commands one at a time, its stdout and stderr read as one stream."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.marker = f"__guide_done_{secrets.token_hex(8)}__"
        self.proc = subprocess.Popen(["bash", "--noprofile", "--norc"], cwd=cwd, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                                     text=True, bufsize=1)
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _once(self, cmd: Command) -> tuple[int, str]:
        assert self.proc.stdin is not None
        # braces, not a subshell: cd, export and background jobs stay in this shell; stdin closed for the command
        self.proc.stdin.write(f"{{\n{cmd.text}\n}} </dev/null\nprintf '\\n%s %d\\n' {self.marker} $?\n")
        self.proc.stdin.flush()
        out: list[str] = []
        end = time.monotonic() + cmd.timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, end - time.monotonic()))
            except queue.Empty:
                raise CommandTimeout(f"line {cmd.line}: `{cmd.text}` still running after {cmd.timeout:.0f} s; "
                                     f"its output:\n{''.join(out)}") from None
            if line is None:
                raise AssertionError(f"line {cmd.line}: the shell ended during `{cmd.text}`:\n{''.join(out)}")
            if line.startswith(self.marker + " "):
                text = "".join(out)
                return int(line.split()[1]), text[:-1] if text.endswith("\n") else text
            out.append(line)

    def run(self, cmd: Command) -> Outcome:
        start = time.monotonic()
        tries = 0
        while True:
            tries += 1
            code, output = self._once(cmd)
            matched = cmd.until is None or re.search(cmd.until, output) is not None
            if matched or time.monotonic() - start > cmd.retry_for:
                return Outcome(cmd, code, output, time.monotonic() - start, tries, matched)
            time.sleep(1.0)

    def close(self, timeout: float = 10.0) -> None:
        """End the shell (its own process group too, if it does not end when its input does)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=timeout)
        except (OSError, subprocess.TimeoutExpired):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=timeout)
        self._reader.join(timeout=timeout)  # ends at EOF, unless a process the page left holds the pipe
        if not self._reader.is_alive():
            self.proc.stdout.close()
