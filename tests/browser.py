"""Headless Chromium (Debian's /usr/bin/chromium) for the tests that look at a page as a person would."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]


@dataclass
class PageEvents:
    """What the page did: console errors and page exceptions, failed requests, every request's URL."""

    errors: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    requested: list[str] = field(default_factory=list)


@contextmanager
def chromium_page() -> Iterator[tuple[Any, PageEvents]]:
    """A fresh page in headless Chromium (1300x900) with its events recorded; skips without Chromium."""
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"needs Debian's chromium at {CHROMIUM}")
    from playwright.sync_api import sync_playwright

    events = PageEvents()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            page.on("console", lambda m: events.errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: events.errors.append(str(e)))
            page.on("requestfailed", lambda r: events.failed.append(r.url))
            page.on("request", lambda r: events.requested.append(r.url))
            yield page, events
        finally:
            browser.close()
