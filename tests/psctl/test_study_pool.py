"""Load-free study runs several at once (issue 41, part 5): the same numbers as one at a time,
the wall time in the report, and Ctrl-C leaves no process and no run behind."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.backends import load_free
from engine.plan import build_config
from tests.conftest import psctl
from tests.integration.support import query

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

STUDY = """
[study]
name = "together"
title = "Four points in virtual time"
target = 0.5

[base]
cluster.backend = "sim"
cluster.workers = 2
cluster.servers = 1
data.dataset = "digits"
model.hidden = [32]
train.epochs = {epochs}
regime.compute_ms = 10.0
sim.server_ms = 1.0

[[axis]]
name = "sync"
key = "sync.model"
values = ["bsp", "asp", "ssp", "dssp"]
"""


def _rows(folder: Path) -> dict[str, tuple[float, int]]:
    summary = json.loads((folder / "summary.json").read_text())
    return {r["labels"]["sync"]: (r["final_accuracy"], r["iterations"]) for r in summary["rows"]}


def test_parallel_runs_measure_what_serial_runs_do(tmp_path: Path) -> None:
    study, db = tmp_path / "together.toml", tmp_path / "experiments.db"
    study.write_text(STUDY.format(epochs=2))
    two = psctl("study", str(study), "--jobs", "2", "--out", str(tmp_path / "two"), db=db)
    assert two.returncode == 0, two.stderr
    assert "4 runs in virtual time, 2 at a time" in two.stderr
    one = psctl("study", str(study), "--jobs", "1", "--out", str(tmp_path / "one"), db=db)
    assert one.returncode == 0, one.stderr
    assert "at a time" not in one.stderr
    assert _rows(tmp_path / "two") == _rows(tmp_path / "one")  # virtual time: identical
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert summary["wall"]["jobs"] == 2 and summary["wall"]["ran"] == 4
    assert summary["wall"]["seconds"] > 0
    assert [r["labels"]["sync"] for r in summary["rows"]] == ["bsp", "asp", "ssp", "dssp"]
    assert "wall time: " in (tmp_path / "two" / "report.md").read_text()


def test_runs_in_virtual_time_are_load_free() -> None:
    """Their costs are measured once, before several start (engine.sim.building.calibrate)."""
    assert load_free(build_config({}, {"cluster.backend": "sim", "data.dataset": "digits"}))
    assert not load_free(build_config({}, {"data.dataset": "digits",
                                           "regime.compute_ms": 5.0}))


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        text = (task / "children").read_text() if (task / "children").exists() else ""
        found |= {int(p) for p in text.split()}
    return found


def _recorded_runs(db: Path) -> int:
    try:
        return len(query(db, "SELECT id FROM runs")) if db.exists() else 0
    except sqlite3.OperationalError:  # the file exists before the recorder's tables do
        return 0


def test_ctrl_c_stops_every_parallel_run_and_leaves_no_process(tmp_path: Path) -> None:
    study, db = tmp_path / "together.toml", tmp_path / "experiments.db"
    study.write_text(STUDY.format(epochs=200))  # far longer than the test waits
    env = dict(os.environ, PSCTL_DB=str(db), NO_COLOR="1")
    parent = subprocess.Popen([sys.executable, "-m", "psctl", "study", str(study), "--jobs",
                               "2", "--out", str(tmp_path / "out")], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline, seen = time.monotonic() + 120, set()
    try:
        while time.monotonic() < deadline and _recorded_runs(db) < 2:
            seen |= _children(parent.pid)
            time.sleep(0.2)
        seen |= _children(parent.pid)
        parent.send_signal(signal.SIGINT)  # to the study alone, as a kill -INT would
        _, stderr = parent.communicate(timeout=150)
    finally:
        if parent.poll() is None:
            parent.kill()
    assert parent.returncode == 130, stderr
    assert "interrupted" in stderr
    statuses = [s for (s,) in query(db, "SELECT status FROM runs")]
    assert len(statuses) == 2 and set(statuses) == {"interrupted"}, statuses
    time.sleep(0.5)
    alive = [pid for pid in seen if Path(f"/proc/{pid}").exists()
             and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()]
    assert not alive, f"left running: {alive}"
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["interrupted"] and not summary["complete"]
