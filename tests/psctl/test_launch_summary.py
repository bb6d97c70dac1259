"""The summary ``psctl launch`` prints when a run ends, where its end could not be recorded."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from rich.console import Console

from engine.launcher import LaunchResult
from engine.recorder import Recorder
from engine.wire.records import RunStatus
from psctl.launch import print_summary


def test_a_run_whose_end_could_not_be_recorded_is_headed_by_how_it_ended(
        tmp_path: Path) -> None:
    db, run_id = tmp_path / "runs.db", uuid.uuid4().hex
    recorder = Recorder(db)
    try:
        recorder.start_run(run_id, "full-disk", {}, sync="bsp", workers=2, servers=1,
                           dataset="digits", started_at=time.time())
    finally:
        recorder.close()  # the row says running: its end never reached the disk
    console = Console(record=True, width=200, no_color=True)
    reason = "the recorder could not write runs.db: database or disk is full"
    print_summary(LaunchResult(run_id, RunStatus.FAILED, reason, tmp_path), db, console)
    lines = console.export_text().splitlines()
    assert lines[0] == f"failed run {run_id} (full-disk)"
    assert lines[2] == f"  reason: {reason}"
