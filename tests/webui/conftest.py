"""Fixtures the dashboard's browser tests share: one chromium per module, the dashboard served
over the module's own ``db`` fixture (a module that needs another shape defines its own)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.webui.chromium import checked_page, chromium, serving


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as launched:
        yield launched


@pytest.fixture(scope="module")
def base(db: Path) -> Iterator[str]:
    with serving(db) as url:
        yield url


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    with checked_page(browser) as opened:
        yield opened
