"""A run's one time base (issue 57, item 8): seconds of training from its first iteration, a
resumed run's downtime left out, start-up one number from the command's start; the same in
``runs show``'s tables, its JSON, compare and the dashboard's clock."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.db import open_engine
from engine.db.clock import TrainingClock, training_clock
from engine.db.downtime import Downtime
from engine.db.metrics import evaluation_series, run_metrics
from engine.db.queries import reading, run_detail
from engine.db.series import run_clock
from engine.recorder import Recorder
from engine.wire.records import EvaluationRecord, EventRecord, IterationRecord, RunStatus

T0 = 1_700_000_000.0
RUN = "c" * 32


def _iteration(i: int, start: float) -> IterationRecord:
    return IterationRecord(worker=0, iteration=i, epoch=0, started_at=start, ended_at=start + 1.0,
                           compute_s=0.5, push_s=0.1, pull_s=0.1, wait_s=0.3, staleness=0,
                           loss=1.0, samples=10, bytes_sent=100, bytes_received=300)


def _start_up(at: float, origin: float) -> EventRecord:
    return EventRecord(at=at, kind="start_up", detail={
        "mode": "template", "note": None, "origin": origin,
        "at": {"launcher": 0.5, "coordinator": 3.0, "joined": 4.0}, "took": {}})


def _launched_and_resumed(db: Path) -> None:
    """The command started at T0; the coordinator recorded the run at T0 + 3 and the first
    iteration started at T0 + 5 (start-up 5 s: 2 s of it after the run's record). 10 one-second
    iterations, an evaluation at T0 + 12 and a worker lost at T0 + 13; killed at T0 + 16; a
    `psctl resume` began at T0 + 95 (its own start_up), resumed at T0 + 100, its first
    iteration at T0 + 103; evaluated at T0 + 108."""
    with Recorder(db) as recorder:
        recorder.start_run(RUN, "r", {"sync": {"model": "asp"}}, sync="asp", workers=1,
                           servers=1, dataset="digits", started_at=T0 + 3)
        recorder.record_event(_start_up(T0 + 4, T0))
        recorder.record_iterations([_iteration(i, T0 + 5 + i) for i in range(10)])
        recorder.record_evaluation(EvaluationRecord(at=T0 + 12, elapsed_s=9.0, step=7,
                                                    accuracy=0.5, loss=1.0, epoch=0.5))
        recorder.record_event(EventRecord(at=T0 + 13, kind="worker_lost", detail={
            "rank": 0, "restart": 1, "max_restarts": 3}))
        recorder.finish(RunStatus.FAILED, "killed", ended_at=T0 + 16)
    with Recorder(db) as recorder:
        recorder.resume_run(RUN)
        recorder.record_event(_start_up(T0 + 99, T0 + 95))
        recorder.record_event(EventRecord(at=T0 + 100, kind="resumed", detail={
            "checkpoint": 1, "folder": "f", "downtime_s": 84.0, "active_s": 13.0}))
        recorder.record_iterations([_iteration(10 + i, T0 + 103 + i) for i in range(10)])
        recorder.record_evaluation(EvaluationRecord(at=T0 + 108, elapsed_s=25.0, step=15,
                                                    accuracy=0.9, loss=0.5, epoch=1.0))
        recorder.finish(RunStatus.FINISHED, ended_at=T0 + 114)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "experiments.db"
    _launched_and_resumed(path)
    return path


def test_the_clock_counts_training_from_the_first_iteration(db: Path) -> None:
    engine = open_engine(db, readonly=True)
    with reading(engine, "test") as conn:
        clock = training_clock(conn, RUN)
    assert (clock.started_at, clock.first_iteration_at) == (T0 + 3, T0 + 5)
    assert clock.startup_s == 5.0  # from the command's start: the launch's, not the resume's
    assert clock.seconds(T0 + 12) == 7.0
    assert clock.seconds(T0 + 50) == 10.0  # down: where training stopped
    assert clock.seconds(T0 + 108) == 15.0
    assert clock.seconds(T0 + 4) == -1.0  # start-up: a second before the first iteration
    assert clock.to_dict() == {"first_iteration_at": T0 + 5, "startup_s": 5.0,
                               "downtime": [{"start": T0 + 15, "end": T0 + 103,
                                             "seconds": 88.0}]}
    assert run_clock(engine, RUN) == clock.to_dict()  # the run page's
    engine.dispose()


def test_runs_show_counts_everything_on_that_clock_and_start_up_is_one_number(db: Path) -> None:
    engine = open_engine(db, readonly=True)
    detail = run_detail(engine, RUN)
    assert detail.totals.startup_s == 5.0 and detail.totals.first_iteration_at == T0 + 5
    assert detail.start_up is not None
    assert detail.start_up.first_iteration_s == 5.0  # not -90: the resume's is downtime
    # The evaluations at 7 and 15 s of training, as compare's plot and time to target count.
    assert [e.training_s for e in detail.evaluations] == [7.0, 15.0]
    assert evaluation_series(engine, RUN) == [(7.0, 0.5), (15.0, 0.9)]
    assert run_metrics(engine, RUN).startup_s == 5.0
    assert run_metrics(engine, RUN, target=0.85).time_to_target_s == 15.0
    # Its faults on the same clock; the resume at the 10 s training stopped at.
    assert [(at, kind) for at, kind, _ in detail.faults] == [(8.0, "worker_lost"),
                                                             (10.0, "resumed")]
    assert detail.downtime[0]["training_s"] == 10.0
    as_json = detail.to_dict()
    assert as_json["evaluations"][1]["training_s"] == 15.0
    assert as_json["totals"]["startup_s"] == as_json["start_up"]["first_iteration_s"] == 5.0
    engine.dispose()


def test_a_run_no_launcher_told_of_counts_start_up_from_its_record() -> None:
    """The simulator, psctl role, a run recorded before start-up was: the run's own start."""
    clock = TrainingClock(started_at=T0, first_iteration_at=T0 + 2, startup_s=2.0,
                          downtime=Downtime(((T0 + 5, T0 + 9),)))
    assert [clock.seconds(T0 + s) for s in (0, 2, 5, 7, 9, 10)] == [-2, 0, 3, 3, 3, 4]
    before = TrainingClock(started_at=T0, first_iteration_at=None, startup_s=None)
    assert before.seconds(T0 + 4) == 4.0  # no iteration yet: from the run's start
