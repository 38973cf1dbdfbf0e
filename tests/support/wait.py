"""Waiting in tests: poll a condition until it holds or a deadline passes."""

from __future__ import annotations

import time


def wait_for(cond, timeout: float, what: str, interval: float = 0.2):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        v = cond()
        if v:
            return v
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
