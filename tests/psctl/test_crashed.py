"""A run whose every process is killed with SIGKILL reads as ``crashed``, never stuck running."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
from typer.testing import CliRunner

from psctl.cli import app
from tests.integration.support import launch_in_background, query, wait_for, wait_until_training

runner = CliRunner()
pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _children(parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                found.append(int(entry.name))
    return found


def _status(db: Path, *command: str, crash_after: str) -> list[str]:
    result = runner.invoke(app, [*command, "--json", "--db", str(db)],
                           env={"PSCTL_CRASH_AFTER_S": crash_after})
    assert result.exit_code == 0, result.output
    return [row["status"] for row in json.loads(result.stdout)]


def test_sigkilled_run_reads_as_crashed_after_the_heartbeat_threshold(tmp_path: Path) -> None:
    db = tmp_path / "experiments.db"
    launch = launch_in_background(db)
    try:
        wait_until_training(db)
    finally:
        # Power loss: no process gets to say anything (each role runs in its own session).
        for pid in [*_children(launch.pid), launch.pid]:
            os.kill(pid, signal.SIGKILL)
        launch.communicate(timeout=10)  # reaps it and closes its pipes
    assert query(db, "SELECT status FROM runs") == [("running",)]  # as stored, forever
    assert _status(db, "runs", "ls", crash_after="15") == ["running"]  # heartbeat still fresh
    wait_for(lambda: _status(db, "runs", "ls", crash_after="2") == ["crashed"], 10,
             "the heartbeat to go stale")
    assert _status(db, "compare", crash_after="2") == ["crashed"]
    assert _status(db, "runs", "ls", "--status", "crashed", crash_after="2") == ["crashed"]
