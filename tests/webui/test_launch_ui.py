"""``psctl launch --ui`` serves the dashboard beside the run and says where."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import psctl


def test_launch_with_ui_prints_the_address(tmp_path: Path) -> None:
    done = psctl("launch", "--dataset", "digits", "--workers", "1", "--servers", "1",
                 "--epochs", "1", "--no-live", "--ui", db=tmp_path / "experiments.db")
    assert done.returncode == 0, done.stderr
    assert re.search(r"dashboard: http://127\.0\.0\.1:\d+/runs/@last", done.stderr)


def test_ui_command_is_documented(tmp_path: Path) -> None:
    done = psctl("ui", "--help", db=tmp_path / "experiments.db")
    assert done.returncode == 0 and "--port" in done.stdout and "--host" in done.stdout
