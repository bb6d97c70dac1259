"""The summary ``psctl launch`` prints when a run ends, where its end could not be recorded."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from rich.console import Console

from engine.launcher import LaunchResult
from engine.recorder import Recorder
from engine.wire.records import EventRecord, RunStatus
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


def test_a_run_ended_by_a_crash_shows_the_end_of_its_traceback(tmp_path: Path) -> None:
    db, run_id = tmp_path / "runs.db", uuid.uuid4().hex
    message = "RuntimeError: boom (in forward, boom.py line 13)"
    traceback = ('Traceback (most recent call last):\n  File "loops.py", line 80, in step\n'
                 '    loss = model(x)\n  File "/tmp/boom.py", line 13, in forward\n'
                 '    raise RuntimeError("boom")\nRuntimeError: boom\n')
    recorder = Recorder(db)
    try:
        recorder.start_run(run_id, "boom", {}, sync="bsp", workers=2, servers=1,
                           dataset="digits", started_at=time.time())
        recorder.record_event(EventRecord(at=time.time(), kind="process_error", detail={
            "role": "worker", "rank": 1, "message": message, "traceback": traceback}))
        recorder.finish(RunStatus.FAILED, f"worker 1 failed: {message}")
    finally:
        recorder.close()

    def summary(reason: str) -> list[str]:
        console = Console(record=True, width=200, no_color=True)
        print_summary(LaunchResult(run_id, RunStatus.FAILED, reason, tmp_path), db, console)
        return console.export_text().splitlines()

    lines = summary(f"worker 1 failed: {message}")
    assert lines[2:7] == [f"  reason: worker 1 failed: {message}",
                          "        loss = model(x)",
                          '      File "/tmp/boom.py", line 13, in forward',
                          '        raise RuntimeError("boom")',
                          "    RuntimeError: boom"]
    # a run that ended for another reason is not explained by a crash it also had
    assert summary("the model diverged")[3].startswith("  details:")


def test_a_simulated_run_says_its_duration_is_virtual_time(tmp_path: Path) -> None:
    from tests.psctl.recorded import recorded_run

    db = tmp_path / "runs.db"
    for run_id, simulated in (("a" * 32, True), ("b" * 32, False)):
        recorded_run(db, run_id, "run", simulated=simulated)
        console = Console(record=True, width=200, no_color=True)
        print_summary(LaunchResult(run_id, RunStatus.FINISHED, None, tmp_path), db, console)
        duration = console.export_text().splitlines()[1]
        assert duration.startswith("  duration ")
        assert (" of virtual time (simulated), " in duration) is simulated, duration


def _interrupted(db: Path, run_id: str, *, checkpoint: bool) -> list[str]:
    recorder = Recorder(db)
    try:
        recorder.start_run(run_id, "stopped", {}, sync="bsp", workers=2, servers=1,
                           dataset="digits", started_at=time.time())
        if checkpoint:
            recorder.record_event(EventRecord(at=time.time(), kind="checkpoint", detail={
                "seq": 1, "folder": "/tmp/x/checkpoints/1"}))
        recorder.finish(RunStatus.INTERRUPTED, "interrupted by the user")
    finally:
        recorder.close()
    console = Console(record=True, width=200, no_color=True)
    print_summary(LaunchResult(run_id, RunStatus.INTERRUPTED, "interrupted by the user",
                               db.parent, processes=5), db, console)
    return console.export_text().splitlines()


def test_an_interrupted_run_says_how_to_go_on_with_psctl_resume(tmp_path: Path) -> None:
    run_id = uuid.uuid4().hex
    lines = _interrupted(tmp_path / "runs.db", run_id, checkpoint=True)
    assert lines[2].startswith("  interrupted: the run's 5 processes were stopped; logs in ")
    assert lines[3] == f"  continue it from its last checkpoint: psctl resume {run_id[:8]}"


def test_an_interrupted_run_without_a_checkpoint_says_what_resume_needs(tmp_path: Path) -> None:
    lines = _interrupted(tmp_path / "runs.db", uuid.uuid4().hex, checkpoint=False)
    assert lines[3] == ("  it saved no checkpoint, so psctl resume cannot continue it; launch "
                        "with --checkpoint-every SECONDS to be able to")
