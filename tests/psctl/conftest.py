"""A second real run beside the session's seeded one, for commands that compare runs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import psctl


@pytest.fixture(scope="session")
def compare_db(seeded_db: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """seeded_db's bsp run plus an asp run with frequent evaluations (read-only: copy to write)."""
    db = tmp_path_factory.mktemp("compare") / "experiments.db"
    shutil.copy(seeded_db, db)
    done = psctl("launch", "--dataset", "digits", "--workers", "2", "--servers", "1",
                 "--epochs", "2", "--sync", "asp", "--eval-interval", "0.5", "--name", "asp-run",
                 "--no-live", db=db)
    assert done.returncode == 0, done.stderr
    return db


@pytest.fixture
def writable_db(compare_db: Path, tmp_path: Path) -> Path:
    """A private copy of compare_db for tests that delete or tag runs."""
    db = tmp_path / "experiments.db"
    shutil.copy(compare_db, db)
    return db
