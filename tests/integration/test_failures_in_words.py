"""Runs that cannot go on end at once and say why in words: a diverged model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.support import query

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def test_a_learning_rate_that_diverges_ends_the_run_saying_so(tmp_path: Path) -> None:
    db = tmp_path / "experiments.db"
    ended = subprocess.run(
        [sys.executable, "-m", "psctl", "launch", "--dataset", "digits", "--workers", "2",
         "--servers", "1", "--epochs", "20", "--lr", "50", "--db", str(db)],
        capture_output=True, text=True, cwd=tmp_path, timeout=150,
        env=dict(os.environ, NO_COLOR="1", COLUMNS="200"))
    assert ended.returncode != 0
    assert "the model diverged: worker" in ended.stdout + ended.stderr
    [(status, reason)] = query(db, "SELECT status, reason FROM runs")
    assert status == "failed" and "diverged" in reason and "lower learning rate" in reason
    # every worker that diverged says so; the first one's words are the run's reason
    [(count,)] = query(db, "SELECT count(*) FROM events WHERE kind = 'diverged'")
    assert count >= 1
