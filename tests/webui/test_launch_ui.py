"""``psctl ui`` is documented. (``launch --ui`` now serves on after the run until stopped: it
is tested, with the address it prints, in test_ui_lifecycle.py.)"""

from __future__ import annotations

from pathlib import Path

from tests.conftest import psctl


def test_ui_command_is_documented(tmp_path: Path) -> None:
    done = psctl("ui", "--help", db=tmp_path / "experiments.db")
    assert done.returncode == 0 and "--port" in done.stdout and "--host" in done.stdout
    assert "--allow-host" in done.stdout and "DNS rebinding" in done.stdout
