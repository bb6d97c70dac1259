"""Reading the user's own metrics: names, per-process series (downsampled), a run's final and
mean value, and the curve against seconds of training."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from engine.db.schema import open_engine
from engine.db.user_metrics import (
    metric_names,
    metric_series,
    metric_summary,
    run_clock,
    training_series,
)

RUN, OTHER = "a" * 32, "b" * 32
T0 = 1000.0


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    db = tmp_path / "x.db"
    open_engine(db).dispose()
    with sqlite3.connect(db) as conn:
        for run in (RUN, OTHER):
            conn.execute("INSERT INTO runs (id, name, status, started_at, ended_at, "
                         "heartbeat_at, config_json, sync, workers, servers, dataset) VALUES "
                         "(?, 'n', 'finished', ?, ?, ?, '{}', 'bsp', 2, 1, 'digits')",
                         (run, T0, T0 + 100, T0 + 100))
        # Training starts 10 s after the run; worker w's iteration i ends at T0 + 10 + i + 0.5.
        conn.executemany(
            "INSERT INTO iterations (run_id, worker, iteration, epoch, started_at, ended_at, "
            "compute_s, push_s, pull_s, wait_s, staleness, samples, bytes_sent, "
            "bytes_received) VALUES (?, ?, ?, 0, ?, ?, 0, 0, 0, 0, 0, 1, 0, 0)",
            [(RUN, w, i, T0 + 10 + i, T0 + 10.5 + i) for w in (0, 1) for i in range(100)])
        rows = [(RUN, "grad_norm", "worker", w, i, T0 + 10.5 + i, float(i + 10 * w))
                for w in (1, 0) for i in range(100)]
        rows += [(RUN, "act", "evaluator", 0, step, T0 + 20 * k, 0.5 * k)
                 for k, step in enumerate((40, 80, 120), start=1)]
        rows += [(OTHER, "zeta", "worker", 0, 0, T0, 1.0)]
        conn.executemany("INSERT INTO user_metrics (run_id, name, role, rank, iteration, at, "
                         "value) VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
    engine = open_engine(db, readonly=True)
    yield engine
    engine.dispose()


def test_the_names_of_a_run_and_of_no_other(engine: Engine) -> None:
    assert metric_names(engine, RUN) == ["act", "grad_norm"]
    assert metric_names(engine, OTHER) == ["zeta"]
    assert metric_names(engine, "c" * 32) == []


def test_each_series_whole_when_it_fits(engine: Engine) -> None:
    found = metric_series(engine, RUN, points=1000)
    assert list(found) == ["act", "grad_norm"]
    [evaluator] = found["act"]
    assert (evaluator.role, evaluator.rank, evaluator.iteration, evaluator.value) == (
        "evaluator", 0, [40.0, 80.0, 120.0], [0.5, 1.0, 1.5])
    workers = found["grad_norm"]
    assert [(s.role, s.rank, s.rows) for s in workers] == [("worker", 0, 100), ("worker", 1, 100)]
    assert workers[1].value == [float(i + 10) for i in range(100)]
    assert workers[0].at == [T0 + 10.5 + i for i in range(100)]


def test_a_long_series_is_averaged_over_runs_of_iterations(engine: Engine) -> None:
    worker0 = metric_series(engine, RUN, points=10)["grad_norm"][0]
    assert len(worker0.value) == 10 and worker0.rows == 100
    assert worker0.iteration[0] == 4.5 and worker0.value[0] == 4.5  # mean of 0..9
    assert worker0.value[-1] == 94.5
    assert worker0.to_dict()["rows"] == 100


def test_final_is_the_mean_of_each_workers_last_value_and_mean_of_all(engine: Engine) -> None:
    summary = metric_summary(engine, RUN, "grad_norm")
    assert summary is not None
    assert (summary.role, summary.final, summary.mean) == ("worker", (99 + 109) / 2, 54.5)
    only_evaluator = metric_summary(engine, RUN, "act")
    assert only_evaluator is not None
    assert (only_evaluator.role, only_evaluator.final, only_evaluator.mean) == (
        "evaluator", 1.5, 1.0)
    assert metric_summary(engine, RUN, "nope") is None


def test_the_curve_counts_seconds_of_training_from_the_first_iteration(engine: Engine) -> None:
    points = training_series(engine, RUN, "grad_norm")
    assert len(points) == 100
    assert points[0] == (pytest.approx(0.5), 5.0)  # worker 0's 0 and worker 1's 10
    assert points[-1] == (pytest.approx(99.5), 104.0)
    assert training_series(engine, RUN, "act")[0] == (pytest.approx(10.0), 0.5)
    assert training_series(engine, RUN, "nope") == []


def test_the_clock_is_the_runs_training_clock_and_status(engine: Engine) -> None:
    clock, status = run_clock(engine, RUN)
    assert (clock.started_at, clock.first_iteration_at, status) == (T0, T0 + 10, "finished")
