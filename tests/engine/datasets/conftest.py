"""Fixtures for the data-set tests: an isolated environment and a tiny synthetic IDX data set."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from datasets_support import Tiny, make_tiny

from engine.datasets import registry, resolve


@pytest.fixture(autouse=True)
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """No env var, a private cache dir, no memo of verified files, and no network at all."""
    cache = tmp_path / "cache"
    monkeypatch.delenv(resolve.ENV_VAR, raising=False)
    monkeypatch.setattr(resolve, "cache_root", lambda: cache)

    def no_network(url: str, *, timeout: float, max_bytes: int) -> bytes:
        pytest.fail(f"test tried to download {url}")

    monkeypatch.setattr(resolve, "fetch_url", no_network)
    resolve.clear_verification_cache()
    yield cache
    resolve.clear_verification_cache()


@pytest.fixture
def tiny(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Tiny:
    data = make_tiny(tmp_path / "src", "tiny", seed=1)
    monkeypatch.setitem(registry.REGISTRY, "tiny", data.spec)
    return data
