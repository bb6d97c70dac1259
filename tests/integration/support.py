"""Helpers for tests that start real runs: launch, read the database, find leaked processes."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from engine.config import RunConfig, build_config


def config(**overrides: Any) -> RunConfig:
    values = {"cluster.connect_timeout_s": 60.0, "cluster.request_timeout_s": 60.0}
    values.update({key.replace("__", "."): value for key, value in overrides.items()})
    return build_config({}, values)


def launch_in_background(db: Path, *extra: str) -> subprocess.Popen[str]:
    """``psctl launch`` of a digits run long enough to interrupt or kill (2 workers, 1 server),
    recording into ``db``; its output is captured in pipes."""
    env = dict(os.environ, PSCTL_DB=str(db), NO_COLOR="1")
    command = [sys.executable, "-m", "psctl", "launch", "--dataset", "digits", "--workers", "2",
               "--servers", "1", "--epochs", "500", "--no-live", *extra]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def query(db: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as connection:
        return connection.execute(sql, args).fetchall()


def wait_for(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except sqlite3.OperationalError:  # the recorder has not created the tables yet
            value = None
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def processes_with(marker: str) -> list[int]:
    """PIDs whose command line or environment mentions ``marker`` (a run id or token)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            blob = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker.encode() in blob:
            found.append(int(entry.name))
    return found
