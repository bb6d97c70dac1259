"""The recorder against a real SQLite file: round trips, batching, heartbeat, errors."""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine.errors import StoreError
from engine.recorder import DUPLICATE_EVENT, Recorder
from engine.wire.records import (
    EvaluationRecord,
    EventRecord,
    IterationRecord,
    LayerRecord,
    RunStatus,
    UserMetricRecord,
)


def iteration(worker: int, number: int, **overrides: Any) -> IterationRecord:
    values: dict[str, Any] = {
        "worker": worker,
        "iteration": number,
        "epoch": 0,
        "started_at": 1000.0 + number,
        "ended_at": 1000.5 + number,
        "compute_s": 0.25,
        "push_s": 0.125,
        "pull_s": 0.0625,
        "wait_s": 0.0625,
        "staleness": 1,
        "loss": 2.5,
        "samples": 64,
        "bytes_sent": 4096,
        "bytes_received": 8192,
    }
    values.update(overrides)
    return IterationRecord(**values)


def start(recorder: Recorder, run_id: str | None = None, **overrides: Any) -> str:
    run_id = run_id or uuid.uuid4().hex
    kwargs: dict[str, Any] = {
        "sync": "async",
        "workers": 2,
        "servers": 1,
        "dataset": "mnist",
        "started_at": 1000.0,
    }
    kwargs.update(overrides)
    recorder.start_run(run_id, "baseline", {"lr": 0.1, "model": {"layers": [784, 10]}}, **kwargs)
    return run_id


def query(path: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    with sqlite3.connect(path) as raw:
        rows = raw.execute(sql, params).fetchall()
    raw.close()
    return rows


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "experiments.db"


@pytest.fixture
def recorder(db: Path) -> Iterator[Recorder]:
    rec = Recorder(db, flush_interval_s=0.05, heartbeat_interval_s=0.05)
    yield rec
    rec.close()  # must not raise: every test reads the writer errors it provokes


def test_start_run_is_committed_when_it_returns(recorder: Recorder, db: Path) -> None:
    run_id = start(recorder)
    [row] = query(
        db,
        "SELECT id, name, status, started_at, ended_at, config_json, sync, "
        "workers, servers, dataset, iteration_count FROM runs",
    )
    assert row[:5] == (run_id, "baseline", "running", 1000.0, None)
    assert json.loads(row[5]) == {"lr": 0.1, "model": {"layers": [784, 10]}}
    assert row[6:] == ("async", 2, 1, "mnist", 0)


def test_every_record_type_round_trips(recorder: Recorder, db: Path) -> None:
    run_id = start(recorder)
    rows = [iteration(0, 0), iteration(1, 0, loss=None, staleness=3)]
    recorder.record_iterations(rows)
    evaluation = EvaluationRecord(
        at=1001.0, elapsed_s=1.0, step=7, accuracy=0.875, loss=0.5, epoch=0.25
    )
    recorder.record_evaluation(evaluation)
    recorder.record_event(EventRecord(at=1002.0, kind="worker_exit", detail={"worker": 1, "rc": 0}))
    recorder.flush()

    stored = query(db, "SELECT * FROM iterations ORDER BY worker")
    assert stored == [(run_id, *r.model_dump().values()) for r in rows]
    assert query(
        db, "SELECT run_id, at, elapsed_s, step, epoch, accuracy, loss FROM evaluations"
    ) == [(run_id, 1001.0, 1.0, 7, 0.25, 0.875, 0.5)]
    [(ev_run, at, kind, detail)] = query(db, "SELECT run_id, at, kind, detail FROM events")
    assert (ev_run, at, kind, json.loads(detail)) == (
        run_id,
        1002.0,
        "worker_exit",
        {"worker": 1, "rc": 0},
    )
    assert query(db, "SELECT iteration_count FROM runs") == [(2,)]


def test_layer_rows_round_trip_and_a_retried_report_is_skipped(recorder: Recorder,
                                                               db: Path) -> None:
    run_id = start(recorder)
    rows = [LayerRecord(worker=1, iteration=4, layer=layer, pull_order=3 - layer,
                        push_order=layer, suspend_s=0.25 * layer, staleness=layer % 2)
            for layer in range(4)]
    recorder.record_layers(rows)
    recorder.record_layers(rows[:2])  # the same report again
    recorder.flush()
    stored = query(db, "SELECT * FROM layer_iterations ORDER BY layer")
    assert stored == [(run_id, *row.model_dump().values()) for row in rows]


def test_user_metrics_round_trip_and_a_retried_report_is_skipped(recorder: Recorder,
                                                                 db: Path) -> None:
    run_id = start(recorder)
    rows = [UserMetricRecord(role=role, rank=rank, iteration=i, at=1000.5 + i, name=name,
                             value=0.5 * i + rank)
            for role, rank in (("worker", 0), ("worker", 1), ("evaluator", 0))
            for i in range(3) for name in ("grad_norm", "act/mean")]
    recorder.record_user_metrics(rows)
    recorder.record_user_metrics(rows[:4])  # the same report again
    recorder.record_user_metrics([])
    recorder.flush()
    stored = query(db, "SELECT run_id, role, rank, iteration, at, name, value FROM user_metrics "
                       "ORDER BY role DESC, rank, iteration, name DESC")
    assert stored == [(run_id, r.role, r.rank, r.iteration, r.at, r.name, r.value) for r in rows]


def test_many_small_batches_are_all_written(recorder: Recorder, db: Path) -> None:
    start(recorder)
    rows = [iteration(w, i) for i in range(10_000) for w in range(2)]
    for k in range(0, len(rows), 100):
        recorder.record_iterations(rows[k : k + 100])
    recorder.flush()
    assert query(db, "SELECT count(*), sum(samples) FROM iterations") == [(20_000, 20_000 * 64)]
    assert query(db, "SELECT iteration_count FROM runs") == [(20_000,)]


def test_rows_are_committed_without_an_explicit_flush(recorder: Recorder, db: Path) -> None:
    start(recorder)
    recorder.record_iterations([iteration(0, 0)])
    deadline = time.monotonic() + 5
    while query(db, "SELECT count(*) FROM iterations") != [(1,)]:
        assert time.monotonic() < deadline, "the flush interval never wrote the row"
        time.sleep(0.02)


def test_heartbeat_advances_while_the_run_is_open(recorder: Recorder, db: Path) -> None:
    start(recorder)
    [(first,)] = query(db, "SELECT heartbeat_at FROM runs")
    time.sleep(0.3)
    [(later,)] = query(db, "SELECT heartbeat_at FROM runs")
    assert later > first + 0.1


def test_finish_sets_status_reason_and_end(recorder: Recorder, db: Path) -> None:
    start(recorder)
    recorder.record_iterations([iteration(0, 0)])
    before = time.time()
    recorder.finish(RunStatus.FAILED, "worker 1 exited with code 3")
    [(status, reason, ended_at, count)] = query(
        db, "SELECT status, reason, ended_at, iteration_count FROM runs"
    )
    assert (status, reason, count) == ("failed", "worker 1 exited with code 3", 1)
    assert before <= ended_at <= time.time()
    with pytest.raises(StoreError, match="no run is open"):
        recorder.record_iterations([iteration(0, 1)])


def test_heartbeat_stops_after_finish(recorder: Recorder, db: Path) -> None:
    start(recorder)
    recorder.finish(RunStatus.FINISHED)
    [(first,)] = query(db, "SELECT heartbeat_at FROM runs")
    time.sleep(0.2)
    assert query(db, "SELECT heartbeat_at FROM runs") == [(first,)]


def test_finish_refuses_a_status_that_is_not_final(recorder: Recorder) -> None:
    start(recorder)
    for status in (RunStatus.RUNNING, RunStatus.CRASHED):
        with pytest.raises(ValueError):
            recorder.finish(status)


def test_one_run_at_a_time(recorder: Recorder) -> None:
    with pytest.raises(StoreError, match="start_run first"):
        recorder.record_event(EventRecord(at=1.0, kind="x"))
    start(recorder)
    with pytest.raises(StoreError, match="still open"):
        start(recorder)
    recorder.finish(RunStatus.FINISHED)
    start(recorder)  # a second run after the first finished is fine


def test_duplicate_iterations_are_ignored_and_counted(recorder: Recorder, db: Path) -> None:
    start(recorder)
    recorder.record_iterations([iteration(0, 0), iteration(0, 1)])
    recorder.flush()
    recorder.record_iterations([iteration(0, 1, loss=9.0), iteration(0, 2)])
    recorder.flush()
    assert query(db, "SELECT iteration, loss FROM iterations") == [(0, 2.5), (1, 2.5), (2, 2.5)]
    assert query(db, "SELECT iteration_count FROM runs") == [(3,)]
    [(detail,)] = query(db, "SELECT detail FROM events WHERE kind = ?", DUPLICATE_EVENT)
    assert json.loads(detail) == {"count": 1}
    recorder.finish(RunStatus.FINISHED)  # the writer survived


def test_writer_error_surfaces_at_the_next_call(recorder: Recorder, db: Path) -> None:
    start(recorder)
    with sqlite3.connect(db) as raw:
        raw.execute("DROP TABLE iterations")
    raw.close()
    recorder.record_iterations([iteration(0, 0)])
    with pytest.raises(StoreError, match="no such table: iterations"):
        recorder.flush()
    with pytest.raises(StoreError, match="no such table: iterations"):
        recorder.record_event(EventRecord(at=1.0, kind="x"))
    with pytest.raises(StoreError, match="no such table"):
        recorder.finish(RunStatus.FINISHED)
    recorder.close()  # already reported: close does not raise it again


def test_unreported_writer_error_is_raised_by_close(db: Path) -> None:
    recorder = Recorder(db, flush_interval_s=0.01)
    start(recorder)
    with sqlite3.connect(db) as raw:
        raw.execute("DROP TABLE evaluations")
    raw.close()
    recorder.record_evaluation(
        EvaluationRecord(at=1, elapsed_s=1, step=1, accuracy=0.5, loss=1, epoch=0)
    )
    with pytest.raises(StoreError, match="no such table: evaluations"):
        recorder.close()


def test_unserialisable_config_is_refused(recorder: Recorder) -> None:
    with pytest.raises(StoreError, match="JSON"):
        recorder.start_run(
            "r" * 32, "n", {"x": object()}, sync="s", workers=1, servers=1, dataset="d"
        )


def test_closed_recorder_refuses_calls(db: Path) -> None:
    recorder = Recorder(db)
    start(recorder)
    recorder.close()
    recorder.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        recorder.flush()


def test_mark_ended_changes_only_a_running_run(recorder: Recorder, db: Path) -> None:
    running = start(recorder)
    recorder.close()
    finished_recorder = Recorder(db)
    finished = start(finished_recorder)
    finished_recorder.finish(RunStatus.FINISHED)
    finished_recorder.close()

    assert Recorder.mark_ended(db, running, RunStatus.FAILED, "coordinator died") is True
    assert Recorder.mark_ended(db, running, RunStatus.INTERRUPTED, "again") is False
    assert Recorder.mark_ended(db, finished, RunStatus.FAILED, "late") is False
    assert Recorder.mark_ended(db, "no-such-run", RunStatus.FAILED, None) is False
    rows = dict(
        (r[0], r[1:])
        for r in query(db, "SELECT id, status, reason, ended_at IS NOT NULL FROM runs")
    )
    assert rows == {running: ("failed", "coordinator died", 1), finished: ("finished", None, 1)}


def test_mark_ended_on_a_missing_database_creates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "none.db"
    assert Recorder.mark_ended(path, "x", RunStatus.FAILED, None) is False
    assert not path.exists()


def test_rollups_agree_with_the_rows_despite_duplicates(recorder: Recorder, db: Path) -> None:
    run_id = start(recorder)
    recorder.record_iterations([iteration(0, i, loss=None if i == 3 else 1.0 + i)
                                for i in range(6)])
    recorder.flush()
    # A retried report (duplicates) together with rows landing in seconds already rolled up.
    recorder.record_iterations([iteration(0, 4), iteration(0, 5), iteration(1, 0),
                                iteration(1, 1, staleness=7)])
    recorder.flush()
    rolled = query(db, "SELECT worker, slot, n, last_iteration, staleness_max, loss_min "
                   "FROM iteration_rollups WHERE run_id = ? ORDER BY worker, slot", run_id)
    # Iteration i ends at 1000.5 + i: slot 4i + 2 of 0.25 s.
    assert [r[:4] for r in rolled] == [(0, 4 * i + 2, 1, i) for i in range(6)] + [
        (1, 2, 1, 0), (1, 6, 1, 1)]
    assert rolled[3][5] is None and rolled[-1][4] == 7
    assert query(db, "SELECT sum(n) FROM iteration_rollups")[0][0] == query(
        db, "SELECT iteration_count FROM runs")[0][0] == 8


def _delete_run(db: Path, run_id: str) -> None:
    with sqlite3.connect(db) as raw:  # as `psctl runs rm --force` of a live run did
        raw.execute("PRAGMA foreign_keys = ON")
        raw.execute("DELETE FROM runs WHERE id = ?", (run_id,))
    raw.close()


def test_a_run_row_deleted_under_a_quiet_run_fails_the_writer(recorder: Recorder,
                                                              db: Path) -> None:
    run_id = start(recorder)
    recorder.check()
    _delete_run(db, run_id)
    # Nothing is recorded meanwhile (every worker waiting): the heartbeat finds the row gone.
    deadline = time.monotonic() + 5
    while True:
        try:
            recorder.check()
        except StoreError as exc:
            assert f"run {run_id} is no longer in the database" in str(exc)
            break
        assert time.monotonic() < deadline, "the writer did not notice the row was gone"
        time.sleep(0.02)
    with pytest.raises(StoreError, match="no longer in the database"):
        recorder.record_event(EventRecord(at=1.0, kind="x"))


def test_finishing_a_run_whose_row_is_gone_is_an_error(db: Path) -> None:
    with Recorder(db, heartbeat_interval_s=3600) as recorder:
        run_id = start(recorder)
        _delete_run(db, run_id)
        with pytest.raises(StoreError, match=r"its end \(finished\) could not be recorded"):
            recorder.finish(RunStatus.FINISHED)
