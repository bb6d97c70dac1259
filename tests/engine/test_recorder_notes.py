"""Notes on a run: written only through engine.recorder.set_notes, bounded, clearable."""

from __future__ import annotations

import sqlite3
import uuid
from pathlib import Path

import pytest

from engine.recorder import NOTES_MAX_CHARS, Recorder, set_notes


def _seed(db: Path) -> str:
    run_id = uuid.uuid4().hex
    recorder = Recorder(db, flush_interval_s=0.05, heartbeat_interval_s=0.05)
    try:
        recorder.start_run(run_id, "baseline", {"lr": 0.1}, sync="async", workers=1,
                           servers=1, dataset="mnist", started_at=1000.0)
    finally:
        recorder.close()
    return run_id


def _notes(db: Path, run_id: str) -> object:
    with sqlite3.connect(db) as raw:
        row = raw.execute("SELECT notes FROM runs WHERE id = ?", (run_id,)).fetchone()
    raw.close()
    return row[0]


def test_notes_are_written_replaced_and_cleared(tmp_path: Path) -> None:
    db = tmp_path / "experiments.db"
    run_id = _seed(db)
    assert _notes(db, run_id) is None
    assert set_notes(db, run_id, "lr too high — diverged at 3k") is True
    assert _notes(db, run_id) == "lr too high — diverged at 3k"
    assert set_notes(db, run_id, "second thought") is True
    assert _notes(db, run_id) == "second thought"
    assert set_notes(db, run_id, "") is True
    assert _notes(db, run_id) is None


def test_an_unknown_run_is_reported_and_nothing_changes(tmp_path: Path) -> None:
    db = tmp_path / "experiments.db"
    run_id = _seed(db)
    assert set_notes(db, "f" * 32, "x") is False
    assert _notes(db, run_id) is None


def test_overlong_notes_are_refused(tmp_path: Path) -> None:
    db = tmp_path / "experiments.db"
    run_id = _seed(db)
    with pytest.raises(ValueError, match="limited"):
        set_notes(db, run_id, "x" * (NOTES_MAX_CHARS + 1))
    assert _notes(db, run_id) is None
    assert set_notes(db, run_id, "x" * NOTES_MAX_CHARS) is True
