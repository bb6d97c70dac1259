"""Fixtures for the data-set tests: an isolated environment and a tiny synthetic IDX data set."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from datasets_support import StandIn, Tiny, make_tiny

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
def stand_in() -> Iterator[StandIn]:
    """Register a data set for the test (in place of one of that name); all undone after."""
    with contextlib.ExitStack() as stack:
        yield lambda spec: stack.enter_context(
            registry.DATASETS.registered(spec.name, spec, spec.description))


@pytest.fixture
def tiny(tmp_path: Path, stand_in: StandIn) -> Tiny:
    data = make_tiny(tmp_path / "src", "tiny", seed=1)
    stand_in(data.spec)
    return data
