"""A resumed run keeps one clock: its active time so far, its downtime, and its epochs, read
from the database, and a duration that leaves the downtime out."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.db.queries import CRASH_AFTER_S, list_runs, reading, resume_clock
from engine.db.schema import open_engine
from engine.errors import RunNotFound
from engine.recorder import Recorder
from engine.wire.records import EvaluationRecord, EventRecord, RunStatus

RUN = "abcd" * 8


def _failed_run(db: Path, started: float, ended: float) -> None:
    recorder = Recorder(db)
    try:
        recorder.start_run(RUN, "r", {"seed": 1}, sync="asp", workers=2, servers=1,
                           dataset="digits", started_at=started)
        for epoch in (1.0, 2.5):
            recorder.record_evaluation(EvaluationRecord(at=started + 10 * epoch,
                                                        elapsed_s=10 * epoch, step=1,
                                                        accuracy=0.5, loss=1.0, epoch=epoch))
        recorder.finish(RunStatus.FAILED, "server 0 died", ended_at=ended)
    finally:
        recorder.close()


def _clock(db: Path, now: float) -> tuple[float, float, float]:
    engine = open_engine(db, readonly=True)
    try:
        with reading(engine, "test") as conn:
            return resume_clock(conn, RUN, now)
    finally:
        engine.dispose()


def test_a_resumed_runs_clock_goes_on_from_where_it_was(tmp_path: Path) -> None:
    db = tmp_path / "experiments.db"
    _failed_run(db, started=1000.0, ended=1040.0)
    active, down, epoch = _clock(db, now=1100.0)
    assert (active, down, epoch) == (40.0, 60.0, 2.5)


def test_duration_leaves_the_downtime_out_and_a_second_resume_counts_the_first(
        tmp_path: Path) -> None:
    db = tmp_path / "experiments.db"
    _failed_run(db, started=1000.0, ended=1040.0)
    recorder = Recorder(db)
    try:
        recorder.resume_run(RUN)
        recorder.record_event(EventRecord(at=1100.0, kind="resumed", detail={
            "checkpoint": 3, "folder": "f", "downtime_s": 60.0, "active_s": 40.0}))
        recorder.finish(RunStatus.FAILED, "again", ended_at=1130.0)
    finally:
        recorder.close()
    engine = open_engine(db, readonly=True)
    try:
        [summary] = list_runs(engine, now=2000.0, crash_after_s=CRASH_AFTER_S)
    finally:
        engine.dispose()
    assert summary.duration_s == pytest.approx(70.0)  # 40 s before, 30 s after the resume
    active, down, _ = _clock(db, now=1200.0)
    assert (active, down) == (pytest.approx(70.0), pytest.approx(70.0))


def test_no_such_run_to_resume(tmp_path: Path) -> None:
    db = tmp_path / "experiments.db"
    _failed_run(db, started=1000.0, ended=1040.0)
    engine = open_engine(db, readonly=True)
    try:
        with reading(engine, "test") as conn, pytest.raises(RunNotFound):
            resume_clock(conn, "f" * 32, 0.0)
    finally:
        engine.dispose()
