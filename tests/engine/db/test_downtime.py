"""A resumed run's downtime is left out of every rate, duration and training time, and its
times never go back."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.db import open_engine
from engine.db.downtime import Downtime, run_downtime
from engine.db.metrics import evaluation_series, run_metrics
from engine.db.queries import reading, run_detail
from engine.recorder import Recorder
from engine.wire.records import EvaluationRecord, EventRecord, IterationRecord, RunStatus

T0 = 1_700_000_000.0
RUN = "e" * 32


def _iteration(i: int, start: float) -> IterationRecord:
    return IterationRecord(worker=0, iteration=i, epoch=0, started_at=start, ended_at=start + 1.0,
                           compute_s=0.5, push_s=0.1, pull_s=0.1, wait_s=0.3, staleness=0,
                           loss=1.0, samples=10, bytes_sent=100, bytes_received=300)


def _evaluation(at: float, accuracy: float) -> EvaluationRecord:
    return EvaluationRecord(at=at, elapsed_s=at - T0, step=1, accuracy=accuracy, loss=1.0,
                            epoch=0.0)


def _resumed_run(db: Path) -> None:
    """10 iterations from T0 + 5 (start-up 5 s), killed at T0 + 16, resumed at T0 + 100, the
    first new iteration started at T0 + 103: 10 more; accuracy reaches 0.9 at T0 + 108."""
    with Recorder(db) as recorder:
        recorder.start_run(RUN, "r", {"sync": {"model": "asp"}}, sync="asp", workers=1,
                           servers=1, dataset="digits", started_at=T0)
        recorder.record_iterations([_iteration(i, T0 + 5 + i) for i in range(10)])
        recorder.record_evaluation(_evaluation(T0 + 15, 0.5))
        recorder.finish(RunStatus.FAILED, "killed", ended_at=T0 + 16)
    with Recorder(db) as recorder:
        recorder.resume_run(RUN)
        recorder.record_event(EventRecord(at=T0 + 100, kind="resumed", detail={
            "checkpoint": 1, "folder": "f", "downtime_s": 84.0, "active_s": 16.0}))
        recorder.record_iterations([_iteration(10 + i, T0 + 103 + i) for i in range(10)])
        recorder.record_evaluation(_evaluation(T0 + 108, 0.9))
        recorder.finish(RunStatus.FINISHED, ended_at=T0 + 114)


def test_the_span_runs_from_the_last_iteration_to_the_first_after_the_resume(
        tmp_path: Path) -> None:
    db = tmp_path / "experiments.db"
    _resumed_run(db)
    engine = open_engine(db, readonly=True)
    with reading(engine, "test") as conn:
        down = run_downtime(conn, RUN)
    assert down.spans == ((T0 + 15, T0 + 103),)
    assert down.total_s == pytest.approx(88.0)


def test_rates_and_time_to_target_leave_the_downtime_out(tmp_path: Path) -> None:
    db = tmp_path / "experiments.db"
    _resumed_run(db)
    engine = open_engine(db, readonly=True)
    m = run_metrics(engine, RUN, target=0.85)
    # Training: T0 + 5 .. T0 + 15 and T0 + 103 .. T0 + 113, 20 s for 200 samples.
    assert m.train_wall_s == pytest.approx(20.0)
    assert m.samples_per_s == pytest.approx(10.0)
    assert m.time_to_target_s == pytest.approx(15.0)  # 10 s before, 5 s after
    assert evaluation_series(engine, RUN) == [(pytest.approx(10.0), 0.5),
                                              (pytest.approx(15.0), 0.9)]
    detail = run_detail(engine, RUN)
    assert detail.totals.wall_s == pytest.approx(20.0)
    assert detail.totals.samples_per_s == pytest.approx(10.0)
    assert detail.workers[0].samples_per_s == pytest.approx(10.0)
    assert detail.downtime == ({"start": T0 + 15, "end": T0 + 103, "seconds": 88.0,
                                "training_s": 10.0},)  # it came after 10 s of training
    # runs show's evaluations count the same seconds of training as the plot
    assert [e.training_s for e in detail.evaluations] == [pytest.approx(10.0),
                                                          pytest.approx(15.0)]


def test_a_run_never_resumed_has_no_downtime(tmp_path: Path) -> None:
    db = tmp_path / "experiments.db"
    with Recorder(db) as recorder:
        recorder.start_run(RUN, "r", {}, sync="asp", workers=1, servers=1, dataset="digits",
                           started_at=T0)
        recorder.record_iterations([_iteration(i, T0 + i) for i in range(3)])
        recorder.finish(RunStatus.FINISHED, ended_at=T0 + 3)
    engine = open_engine(db, readonly=True)
    assert run_detail(engine, RUN).downtime == ()
    assert run_metrics(engine, RUN).train_wall_s == pytest.approx(3.0)


def test_overlaps_and_passes() -> None:
    down = Downtime(((10.0, 20.0), (30.0, 35.0)))
    assert down.within(0.0, 100.0) == 15.0
    assert down.within(15.0, 32.0) == 7.0
    assert down.training_s(0.0, 40.0) == 25.0
    assert down.training_s(0.0, 15.0) == 10.0  # inside a span the clock stands still
    assert [down.resumes_before(t) for t in (5.0, 20.0, 33.0, 40.0)] == [0, 1, 1, 2]
