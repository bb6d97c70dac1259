"""Ctrl-C on a simulated run: it stops after the current steps, is recorded as interrupted, and
psctl exits 130, with nothing left running."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def _iterations(db: Path) -> int:
    try:
        with sqlite3.connect(db) as conn:
            return int(conn.execute("SELECT COUNT(*) FROM iterations").fetchone()[0])
    except sqlite3.Error:
        return 0


def test_ctrl_c_interrupts_a_simulated_run(tmp_path: Path) -> None:
    db = tmp_path / "sim.db"
    env = dict(os.environ, PSCTL_DB=str(db), NO_COLOR="1")
    proc = subprocess.Popen(
        [sys.executable, "-m", "psctl", "launch", "--backend", "sim", "--dataset", "digits",
         "--workers", "4", "--servers", "2", "--epochs", "100000", "--compute-ms", "10",
         "--server-ms", "1", "--eval-interval", "1000", "--no-live"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while _iterations(db) == 0 and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:  # a run that ignored the Ctrl-C must not outlive the test (100000 epochs)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, stderr
    with sqlite3.connect(db) as conn:
        status, reason = conn.execute("SELECT status, reason FROM runs").fetchone()
    assert (status, reason) == ("interrupted", "interrupted")
    assert "terminate called" not in stderr
