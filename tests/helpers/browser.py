"""The web page in real Chromium: Debian's chromium driven by Playwright (never a downloaded browser),
a page that records its script errors, and polling the page without ``eval`` (its CSP forbids it)."""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

NO_CHROMIUM = "no chromium on PATH or at /usr/bin/chromium (apt-get install chromium; .ci/run does)"


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser"):
        if p := shutil.which(name):
            return p
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None


@contextlib.contextmanager
def chromium_page(width: int, height: int) -> Iterator:
    """A Playwright page in headless chromium (the test skips without one); ``page.errors`` collects
    the page's uncaught script errors."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    exe = chromium_path()
    if exe is None:
        pytest.skip(NO_CHROMIUM)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, args=["--no-sandbox", "--disable-gpu"])
        pg = browser.new_page(viewport={"width": width, "height": height})
        errors: list[str] = []
        pg.on("pageerror", lambda e: errors.append(str(e)))
        pg.errors = errors
        try:
            yield pg
        finally:
            browser.close()


def wait_until(cond: Callable[[], object], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def until(page, js: str, timeout: float = 60.0) -> None:  # noqa: ANN001 (a Playwright page)
    """Poll a JavaScript function in the page (``wait_for_function`` would eval a string, which the
    page's CSP rightly forbids)."""
    wait_until(lambda: page.evaluate(js), timeout)
