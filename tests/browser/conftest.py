"""What the browser tests share: an empty Redis around every test (never so in
tests/unit), one headless chromium per module, a fresh page per test, and screenshots.

These tests never skip: without chromium or Playwright they fail (tests/run.sh installs
both; Playwright cannot download its own browsers here, so it launches /usr/bin/chromium).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO_ROOT
from tests.support.fixtures import clean_redis_autouse  # noqa: F401 (autouse here)

try:
    from playwright.sync_api import Browser, Page, sync_playwright
except ImportError as exc:  # a clear failure, never a skip
    raise ImportError(
        "The browser tests need Playwright for Python: pip install -e '.[test]'"
    ) from exc

CHROMIUM = Path("/usr/bin/chromium")
VIEWPORT = {"width": 1280, "height": 800}
SCREENSHOTS_DIR = REPO_ROOT / "docs" / "screenshots"
ASYNC_UNSAFE = "DJANGO_ALLOW_ASYNC_UNSAFE"


@pytest.fixture(scope="module")
def allow_orm_next_to_playwright() -> Iterator[None]:
    """Let this test thread use the ORM while Playwright's sync API is active.

    Playwright's sync API runs an asyncio event loop in the test's own thread (switching
    to it in a greenlet), so Django sees a running loop and raises SynchronousOnlyOperation
    for every query made by the test or by its fixtures. Nothing here is async: the ORM
    is only called between Playwright calls, never from the loop. This is Django's
    documented escape hatch, set for this module only and restored afterwards; the live
    server's thread has no loop and is unaffected.
    """
    previous = os.environ.get(ASYNC_UNSAFE)
    os.environ[ASYNC_UNSAFE] = "true"
    try:
        yield
    finally:
        if previous is None:
            del os.environ[ASYNC_UNSAFE]
        else:
            os.environ[ASYNC_UNSAFE] = previous


@pytest.fixture(scope="module")
def browser(allow_orm_next_to_playwright: None) -> Iterator[Browser]:
    """One headless chromium for the module (starting it is the slow part)."""
    assert CHROMIUM.is_file(), (
        f"{CHROMIUM} not found: the browser tests need Debian's chromium "
        "(apt-get install chromium; tests/run.sh installs it when run as root)"
    )
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM))
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(browser: Browser, live_server) -> Iterator[Page]:
    """A fresh page (own cookies) per test, closed before the test's database is flushed."""
    context = browser.new_context(viewport=VIEWPORT, base_url=live_server.url)
    # The admin's navigation sidebar starts closed (its own remembered setting), leaving
    # the tables the page's width in the screenshots.
    context.add_init_script("localStorage.setItem('django.admin.navSidebarIsOpen', 'false')")
    try:
        yield context.new_page()
    finally:
        context.close()


@pytest.fixture
def screenshot(page: Page, tmp_path: Path) -> Callable[[str], Path]:
    """``screenshot(name)``: a full-page PNG, into docs/screenshots/ if asked for, else tmp."""

    def take(name: str) -> Path:
        if os.environ.get("DELAYJOBS_SCREENSHOTS") == "1":
            SCREENSHOTS_DIR.mkdir(parents=True, exist_ok=True)
            path = SCREENSHOTS_DIR / name
        else:
            path = tmp_path / name
        page.screenshot(path=str(path), full_page=True)
        assert path.stat().st_size > 0
        return path

    return take
