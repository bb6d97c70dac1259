"""Comparison metrics on runs written by the recorder: known values, and blanks, not zeros."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.db import open_engine
from engine.db.metrics import evaluation_series, run_metrics, run_records
from engine.recorder import Recorder, delete_runs, set_tags
from engine.wire.records import EvaluationRecord, IterationRecord, RunStatus

T0 = 1_700_000_000.0


def _iteration(worker: int, i: int, staleness: int) -> IterationRecord:
    start = T0 + i
    return IterationRecord(worker=worker, iteration=i, epoch=0, started_at=start,
                           ended_at=start + 1.0, compute_s=0.5, push_s=0.1, pull_s=0.1,
                           wait_s=0.3, staleness=staleness, loss=1.0, samples=10,
                           bytes_sent=100, bytes_received=300)


def _record(db: Path, run_id: str, iterations: list[IterationRecord],
            accuracies: list[float]) -> None:
    with Recorder(db) as recorder:
        recorder.start_run(run_id, run_id, {"sync": {"model": "asp"}}, sync="asp", workers=1,
                           servers=1, dataset="digits", started_at=T0)
        recorder.record_iterations(iterations)
        for n, accuracy in enumerate(accuracies):
            recorder.record_evaluation(EvaluationRecord(at=T0 + n, elapsed_s=float(n), step=n,
                                                        accuracy=accuracy, loss=1.0, epoch=0.0))
        recorder.finish(RunStatus.FINISHED)


def test_metrics_of_known_iterations(tmp_path: Path) -> None:
    db = tmp_path / "experiments.db"
    # 20 iterations: staleness 0 for 18 of them, then 5 and 9: p95 (nearest rank 19) is 5.
    rows = [_iteration(0, i, s) for i, s in enumerate([0] * 18 + [5, 9])]
    _record(db, "a" * 32, rows, [0.5, 0.8, 0.9, 0.85])
    engine = open_engine(db, readonly=True)
    m = run_metrics(engine, "a" * 32, target=0.85)
    assert m.samples == 200 and m.train_wall_s == pytest.approx(20.0)
    assert m.samples_per_s == pytest.approx(10.0)
    assert m.idle_fraction == pytest.approx(0.3)
    assert m.bytes_per_sample == pytest.approx(40.0)
    assert m.staleness_mean == pytest.approx(14 / 20) and m.staleness_p95 == 5
    assert m.time_to_target_s == 2.0  # the first evaluation at or above the target
    assert run_metrics(engine, "a" * 32, target=0.95).time_to_target_s is None
    assert [y for _, y in evaluation_series(engine, "a" * 32)] == [0.5, 0.8, 0.9, 0.85]


def test_a_run_without_iterations_has_blank_metrics(tmp_path: Path) -> None:
    db = tmp_path / "experiments.db"
    _record(db, "b" * 32, [], [])
    m = run_metrics(open_engine(db, readonly=True), "b" * 32, target=0.5)
    assert (m.samples, m.train_wall_s, m.samples_per_s, m.staleness_mean, m.staleness_p95,
            m.idle_fraction, m.bytes_per_sample, m.time_to_target_s) == (0, *[None] * 7)


def test_tags_and_deletion_go_through_the_recorder(tmp_path: Path) -> None:
    db = tmp_path / "experiments.db"
    _record(db, "c" * 32, [_iteration(0, 0, 0)], [0.5])
    set_tags(db, "c" * 32, {"k": "v", "x": "1"})
    set_tags(db, "c" * 32, {"k": "w"}, remove=["x"])
    engine = open_engine(db, readonly=True)
    assert run_records(engine, ["c" * 32])[0].tags == {"k": "w"}
    assert delete_runs(db, ["c" * 32, "d" * 32]) == 1
    assert run_metrics(engine, "c" * 32).samples == 0
