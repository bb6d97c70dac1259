"""Simulator tests measure into a private calibration cache, never the user's."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def sim_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "sim-calibration.json"
    monkeypatch.setenv("PSCTL_SIM_CACHE", str(path))
    return path
