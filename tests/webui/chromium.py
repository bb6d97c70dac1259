"""What the browser tests share: Debian's ``chromium`` driven by PyPI's ``playwright`` (``.ci/run``
installs both; no browser is downloaded), a dashboard server in a thread, a route that aborts
every request off this machine, and the folder screenshots are saved in."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest

from tests.conftest import REPO

CHROMIUM = shutil.which("chromium")
ARTIFACTS = REPO / "test-artifacts"
LOCAL_HOSTS = {"127.0.0.1", "localhost"}
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="Debian's chromium is not installed "
                                    "(.ci/run installs it: apt-get install chromium)")


def is_local(url: str) -> bool:
    return urlparse(url).hostname in LOCAL_HOSTS or url.startswith("data:")


def block_foreign(route: Any) -> None:
    """A playwright route handler: requests to this machine go through, all others fail."""
    if is_local(route.request.url):
        route.continue_()
    else:
        route.abort()


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless Chromium browser, closed on exit."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def serving(db: Path) -> Iterator[str]:
    """The dashboard over ``db`` on a free loopback port; yields its base URL."""
    from webui.server import BackgroundServer

    server = BackgroundServer(db, port=0)
    try:
        yield server.start()
    finally:
        server.stop()


def screenshot(page: Any, name: str, *, full_page: bool = True) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=full_page)


@contextmanager
def checked_page(browser: Any, *, width: int = 1400, height: int = 1000) -> Iterator[Any]:
    """A page that may only reach this machine; on exit, closed, and no script error raised."""
    page = browser.new_page(viewport={"width": width, "height": height})
    page.route("**/*", block_foreign)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        yield page
    finally:
        page.close()
    assert errors == [], errors
