"""Simulator tests measure into a private calibration cache, never the user's, with the wire's
costs given (tests/sim_costs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.sim_costs import seeded_cache


@pytest.fixture(autouse=True)
def sim_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = seeded_cache(tmp_path / "sim-calibration.json")
    monkeypatch.setenv("PSCTL_SIM_CACHE", str(path))
    return path
