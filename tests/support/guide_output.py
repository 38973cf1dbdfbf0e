"""A docs page's shown outputs against what its commands print (pure): compare, and write the printed ones back.

What differs from run to run is normalised away on both sides before they are compared: run ids, hashes
(12 to 64 hex digits), Python's patch version, durations in whole seconds (``18 s``, ``-0 s``), and decimal
figures (measured: ``22.87``, ``+0.4%``, ``3.8e-06``, ``75.4 GiB``); integers, words and versions
(``1.4.2``) are compared as they are. Runs of spaces and of one box-drawing character are one, so a table whose
column grew by a digit still matches. The reader's home is ``/home/lab`` on the page: the test's home has the
same length (a table's widths do not change when it is written back). A line ``...`` on the page stands for
any number of lines (the page shortens long outputs); every other line must match, in order.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from tests.support.guide import Command

PAGE_HOME = "/home/lab"
ELLIPSIS = "..."
_RULES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"\b\d{8}-\d{6}-[0-9a-f]{4}\b"), "<run>"),
    (re.compile(r"\b[0-9a-f]{12,64}\b"), "<hash>"),
    (re.compile(r"\bPython \d+\.\d+\.\d+\b"), "Python <version>"),
    (re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?(?= s\b)"), "<n>"),  # durations: 18 s, -0 s, 0.47 s
    (re.compile(r"(?<![\w.])[-+]?\d+\.\d+(?:e[-+]?\d+)?(?![\w.])"), "<x>"),  # measured figures, not 1.4.2
    (re.compile(r"\t"), " "),
    (re.compile(r"([─━═│┃ ])\1+"), r"\1"),
)


def normalise(line: str) -> str:
    """One output line with what differs between runs replaced (see the module's docstring)."""
    for pattern, repl in _RULES:
        line = pattern.sub(repl, line)
    return line.rstrip()


def _trimmed(lines: Sequence[str]) -> list[str]:
    out = list(lines)
    while out and not out[-1].strip():
        out.pop()
    return out


def _segments(shown: Sequence[str]) -> list[list[str]]:
    """The page's lines split at each ``...`` line (an empty first or last segment: the output starts or ends
    with one)."""
    segs: list[list[str]] = [[]]
    for line in shown:
        if line.strip() == ELLIPSIS:
            segs.append([])
        else:
            segs[-1].append(line)
    return segs


def _find(seg: Sequence[str], printed: Sequence[str], start: int) -> int:
    """Where ``seg`` (normalised) first occurs in ``printed`` (normalised) at or after ``start``; -1: nowhere."""
    for i in range(start, len(printed) - len(seg) + 1):
        if all(printed[i + j] == seg[j] for j in range(len(seg))):
            return i
    return -1


def spans(shown: Sequence[str], printed: Sequence[str]) -> list[tuple[int, int]] | None:
    """Where each segment of the page's output lies in the printed output ((start, end) per segment), or None
    when the page's output does not match it."""
    segs = [[normalise(x) for x in s] for s in _segments(_trimmed(shown))]
    out = [normalise(x) for x in _trimmed(printed)]
    if len(segs) == 1:
        return [(0, len(out))] if segs[0] == out else None
    found: list[tuple[int, int]] = []
    first, *middle, last = segs
    if out[:len(first)] != first:
        return None
    found.append((0, len(first)))
    at = len(first)
    for seg in middle:
        i = _find(seg, out, at)
        if i < 0:
            return None
        found.append((i, i + len(seg)))
        at = i + len(seg)
    if len(out) - len(last) < at or out[len(out) - len(last):] != last:
        return None
    found.append((len(out) - len(last), len(out)))
    return found


@dataclass(frozen=True)
class Mismatch:
    command: Command
    printed: tuple[str, ...]  # what the command printed, the test's home written as the page's

    def describe(self) -> str:
        shown = "\n".join(self.command.shown) or "(nothing)"
        printed = "\n".join(self.printed) or "(nothing)"
        return (f"line {self.command.line}: `{self.command.text}`: the page shows\n{shown}\n--- but it printed\n"
                f"{printed}")


def as_on_page(output: str, home: str) -> tuple[str, ...]:
    """A command's output with the test's home written as the page's."""
    return tuple(output.replace(home, PAGE_HOME).splitlines())


def mismatch(cmd: Command, output: str, home: str) -> Mismatch | None:
    printed = as_on_page(output, home)
    return None if spans(cmd.shown, printed) is not None else Mismatch(cmd, printed)


def regenerated(shown: Sequence[str], printed: Sequence[str]) -> list[str] | None:
    """The page's output block made of the printed lines: all of them where the page shows all; where it
    shortens (``...``), the printed lines in the place of each shown part, found by that part's first line (its
    last for the part after the last ``...``). None: a part's line is not in the output (edit that block by
    hand)."""
    segs = _segments(_trimmed(shown))
    lines = _trimmed(printed)
    if len(segs) == 1:
        return list(lines)
    norm = [normalise(x) for x in lines]
    out: list[str] = []
    at = 0
    for k, seg in enumerate(segs):
        if k:
            out.append(ELLIPSIS)
        if not seg:
            continue
        if k == 0:
            i = 0
        elif k == len(segs) - 1:
            i = max(at, len(lines) - len(seg))
            if normalise(seg[-1]) != (norm[-1] if norm else None):
                return None
        else:
            i = _find([normalise(seg[0])], norm, at)
            if i < 0:
                return None
        out.extend(lines[i:i + len(seg)])
        at = i + len(seg)
    return out


def rewrite(page: str, fixes: Sequence[tuple[Command, Sequence[str]]]) -> str:
    """The page with each command's shown output replaced by the given lines."""
    lines = page.split("\n")
    for cmd, new in sorted(fixes, key=lambda f: f[0].shown_at, reverse=True):
        lines[cmd.shown_at:cmd.shown_at + len(cmd.shown)] = list(new)
    return "\n".join(lines)
