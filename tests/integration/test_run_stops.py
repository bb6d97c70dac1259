"""A run ends, with every one of its processes, when it is deleted (``psctl runs rm --force``),
when its recorder cannot write, and it fails when it stopped before any iteration."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.support import (
    default_hangup,
    descendants,
    launch_in_background,
    query,
    running,
    wait_for,
    wait_until_training,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]
# A hang guard, not a measured bound (the module's pytest timeout is above it): how soon the
# processes end is bench/run_stops.py's, where a slow end is reported, not failed.
HANG_GUARD_S = 100.0


@pytest.fixture
def launch(tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    """``psctl launch`` of a long digits run, training by the time the test gets it; killed
    (the launcher alone, by pid: its roles die with it) should the test leave it running."""
    db = tmp_path / "experiments.db"
    process = launch_in_background(db)
    try:
        wait_until_training(db)
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.communicate(timeout=15)


def the_run(tmp_path: Path, launch: subprocess.Popen[str]) -> tuple[Path, str, list[int]]:
    """The database, the run's id, and the pids of its launcher and every process it started."""
    db = tmp_path / "experiments.db"
    [(run_id,)] = query(db, "SELECT id FROM runs")
    pids = [launch.pid, *descendants(launch.pid)]
    # launcher, coordinator, the template and the server, evaluator and two workers it forked
    assert len(pids) == 7
    return db, run_id, pids


def test_rm_force_stops_every_process_of_a_live_run_then_deletes_it(
        tmp_path: Path, launch: subprocess.Popen[str]) -> None:
    db, run_id, pids = the_run(tmp_path, launch)
    began = time.monotonic()
    rm = subprocess.Popen([sys.executable, "-m", "psctl", "runs", "rm", run_id[:8], "--force",
                           "--yes", "--db", str(db)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=dict(os.environ, NO_COLOR="1"))
    try:
        ended = _await_ended(pids, began)
        _, err = rm.communicate(timeout=30)
    finally:
        if rm.poll() is None:
            rm.kill()
            rm.communicate(timeout=10)
    print(f"every process of the run ended {ended:.1f} s after runs rm --force began")
    assert rm.returncode == 0, err
    assert f"stopped run {run_id[:8]}: its 5 process(es) ended" in err
    assert "deleted 1 run(s)" in err
    assert query(db, "SELECT count(*) FROM runs") == [(0,)]
    assert query(db, "SELECT count(*) FROM iterations") == [(0,)]
    assert launch.wait(5) != 0


def test_a_run_whose_row_is_deleted_ends_and_its_launcher_says_why(
        tmp_path: Path, launch: subprocess.Popen[str]) -> None:
    db, run_id, pids = the_run(tmp_path, launch)
    began = time.monotonic()
    with sqlite3.connect(db) as conn:  # what `runs rm --force` did before it stopped runs first
        conn.execute("PRAGMA foreign_keys = ON")
        conn.execute("DELETE FROM runs WHERE id = ?", (run_id,))
    conn.close()
    ended = _await_ended(pids, began)
    print(f"every process of the run ended {ended:.1f} s after its row was deleted")
    _, err = launch.communicate(timeout=10)
    assert launch.returncode == 1
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    assert f"run {run_id[:8]} " in errors[0]
    assert "is no longer in" in errors[0] and "deleted while it ran" in errors[0]
    assert "every process of the run has ended" in errors[0]


def test_a_recorder_that_cannot_write_fails_the_run_with_the_reason(
        tmp_path: Path, launch: subprocess.Popen[str]) -> None:
    db, run_id, pids = the_run(tmp_path, launch)
    began = time.monotonic()
    with sqlite3.connect(db) as conn:  # the database refuses rows from now on, as a full disk
        conn.execute("CREATE TRIGGER refuse BEFORE INSERT ON iterations "
                     "BEGIN SELECT RAISE(ABORT, 'the disk refuses'); END")
    conn.close()
    ended = _await_ended(pids, began)
    print(f"every process of the run ended {ended:.1f} s after its writes began to fail")
    _, err = launch.communicate(timeout=10)
    assert launch.returncode == 1, err
    [(status, reason)] = query(db, "SELECT status, reason FROM runs WHERE id = ?", run_id)
    assert status == "failed"
    assert reason.startswith("the recorder could not write ")
    assert reason.endswith(": the disk refuses")
    # The console wraps long lines off a terminal, wherever the reason's length puts the break.
    assert "the disk refuses" in " ".join(err.split())


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)],
                         ids=["SIGTERM", "SIGHUP"])
def test_sigterm_or_sighup_to_the_launcher_stops_the_run_as_ctrl_c_does(
        tmp_path: Path, launch: subprocess.Popen[str], sig: signal.Signals, code: int) -> None:
    """Issue 57: either once ended the launcher at once, no summary, the run left running
    (later crashed) and its roles ended only by the kernel's parent-death signal."""
    db, run_id, pids = the_run(tmp_path, launch)
    began = time.monotonic()
    launch.send_signal(sig)
    ended = _await_ended(pids, began)
    _, err = launch.communicate(timeout=30)
    print(f"every process of the run ended {ended:.1f} s after {sig.name}")
    assert ended < 10
    assert launch.returncode == code, err
    assert query(db, "SELECT status FROM runs") == [("interrupted",)]
    said = " ".join(err.split())
    assert "interrupted: the run's 5 processes were stopped;" in said
    assert f"continue it from its last checkpoint: psctl resume {run_id[:8]}" in said


def test_sigterm_to_psctl_resume_interrupts_the_resumed_run_again(
        tmp_path: Path, launch: subprocess.Popen[str]) -> None:
    """Issue 57: a resumed run stops on SIGTERM as a launched one does: 143, interrupted, every
    process ended, the way to go on named."""
    db, run_id, pids = the_run(tmp_path, launch)
    launch.send_signal(signal.SIGTERM)
    _await_ended(pids, time.monotonic())
    launch.communicate(timeout=30)
    [(before,)] = query(db, "SELECT iteration_count FROM runs")
    resume = subprocess.Popen(
        [sys.executable, "-m", "psctl", "resume", run_id[:8], "--no-live"],
        env=dict(os.environ, PSCTL_DB=str(db), NO_COLOR="1"), stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, preexec_fn=default_hangup)
    try:
        wait_for(lambda: query(db, "SELECT status, iteration_count FROM runs")[0][0] == "running"
                 and query(db, "SELECT iteration_count FROM runs")[0][0] > before + 5, 90,
                 "the resumed run to train")
        began, pids = time.monotonic(), [resume.pid, *descendants(resume.pid)]
        resume.send_signal(signal.SIGTERM)
        ended = _await_ended(pids, began)
        _, err = resume.communicate(timeout=30)
    finally:
        if resume.poll() is None:
            resume.kill()
    assert ended < 10
    assert resume.returncode == 143, err
    assert query(db, "SELECT status FROM runs") == [("interrupted",)]
    assert f"psctl resume {run_id[:8]}" in " ".join(err.split())


def test_a_run_that_completed_no_iteration_failed(tmp_path: Path) -> None:
    db = tmp_path / "experiments.db"
    # A time limit that passes before any worker has joined: each is stopped as it joins.
    done = subprocess.run(
        [sys.executable, "-m", "psctl", "launch", "--dataset", "digits", "--workers", "2",
         "--servers", "1", "--epochs", "2", "--max-seconds", "0.001", "--no-live", "--db",
         str(db)], capture_output=True, text=True, timeout=120, check=False,
        env=dict(os.environ, NO_COLOR="1"))
    assert done.returncode == 1, done.stderr
    reason = ("no worker completed an iteration before the run stopped (time limit of 0.001 s "
              "reached)")
    assert query(db, "SELECT status, reason, iteration_count FROM runs") == [
        ("failed", reason, 0)]


def _await_ended(pids: list[int], began: float) -> float:
    """Seconds from ``began`` until none of ``pids`` runs; fails past HANG_GUARD_S."""
    while time.monotonic() - began < HANG_GUARD_S:
        if not any(running(pid) for pid in pids):
            return time.monotonic() - began
        time.sleep(0.05)
    left = [pid for pid in pids if running(pid)]
    raise AssertionError(f"processes {left} still ran {HANG_GUARD_S} s later")
