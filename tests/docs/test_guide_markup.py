"""How a docs page's console blocks are read as a session (tests/support/guide.py), and docs/getting-started.md's
own markup: the example files it shows are the files in docs/examples/, and it skips only install steps."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.guide import DEFAULT_TIMEOUT, GuideError, parse_guide, runnable

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "getting-started.md"
EXAMPLES = ROOT / "docs" / "examples"

SAMPLE = """\
# A page

% guide-test: skip
```console
$ sudo apt-get install redis-server
```

Text between blocks.

```console
$ mkdir lab && cd lab
$ printf '%s\\n' \\
> one two
one
two
output lines are not commands
```

```sh
echo a sh block is not a session
```

% guide-test: retry 20 until PONG
% guide-test: timeout 5
```console
$ redis-cli ping
PONG
```
"""


def test_console_blocks_give_their_prompted_commands_in_order_with_continuations_and_directives() -> None:
    blocks = parse_guide(SAMPLE)
    assert [(b.line, b.skipped) for b in blocks] == [(4, True), (10, False), (25, False)]
    assert [(c.line, c.text) for b in blocks for c in b.commands] == [
        (5, "sudo apt-get install redis-server"),
        (11, "mkdir lab && cd lab"),
        (12, "printf '%s\\n' \\\none two"),
        (26, "redis-cli ping"),
    ]
    ping = blocks[2].commands[0]
    assert (ping.retry_for, ping.until, ping.timeout) == (20.0, "PONG", 5.0)
    assert blocks[1].commands[0].timeout == DEFAULT_TIMEOUT and blocks[1].commands[0].until is None


def test_skipped_blocks_are_left_out_of_the_commands_to_run() -> None:
    assert [c.text for c in runnable(parse_guide(SAMPLE))] == [
        "mkdir lab && cd lab", "printf '%s\\n' \\\none two", "redis-cli ping"]


@pytest.mark.parametrize(("text", "error"), [
    ("% guide-test: skipp\n```console\n$ ls\n```\n", "line 1: unknown guide-test directive 'skipp'"),
    ("% guide-test: retry 5 until (\n```console\n$ ls\n```\n", "line 1: guide-test retry: bad regex '('"),
    ("% guide-test: retry 5 until x\n```console\n$ ls\n$ ls\n```\n",
     "line 2: guide-test retry applies to a block of one command, this one has 2"),
    ("text\n\n```console\nonly output\n```\n", "line 3: a console block without a '$ ' command"),
])
def test_markup_that_cannot_be_run_is_refused_naming_its_line(text: str, error: str) -> None:
    with pytest.raises(GuideError, match=re.escape(error)):
        parse_guide(text)


def test_the_page_shows_every_example_file_and_only_files_that_exist() -> None:
    text = PAGE.read_text(encoding="utf-8")
    included = re.findall(r"^```\{literalinclude\} (\S+)$", text, re.MULTILINE)
    assert included, "the page shows no example file"
    for rel in included:
        assert (PAGE.parent / rel).is_file(), rel
    shown = {(PAGE.parent / rel).resolve() for rel in included}
    # agent-sim-02.toml is agent-sim-01.toml with 02: the page says so and the page's commands use it
    assert {p.resolve() for p in EXAMPLES.iterdir()} - shown == {(EXAMPLES / "agent-sim-02.toml").resolve()}


def test_the_page_skips_only_the_install_steps_and_ends_by_stopping_what_it_started() -> None:
    blocks = parse_guide(PAGE.read_text(encoding="utf-8"))
    skipped = [c.text for b in blocks if b.skipped for c in b.commands]
    assert skipped, "the page has no install step"
    for cmd in skipped:
        assert re.match(r"(sudo apt-get install|git clone|cd ~/src/m1000-fleet$|make install$)", cmd), cmd
    commands = [c.text for c in runnable(blocks)]
    assert any(re.search(r"\bfleetctl\b.*\bvalidate\b", c) for c in commands)
    assert re.search(r"\bkill\b", commands[-1]), commands[-1]
