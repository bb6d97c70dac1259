"""Read queries over runs written by the real recorder: listing, selectors, detail, progress."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from engine.db.queries import (
    CRASH_AFTER_S,
    list_runs,
    progress,
    resolve_run,
    run_detail,
)
from engine.db.schema import open_engine
from engine.errors import AmbiguousRun, RunNotFound, StoreError
from engine.recorder import Recorder
from engine.wire.records import EvaluationRecord, EventRecord, IterationRecord, RunStatus

RUN_A = "aaaa1111" + "0" * 24
RUN_B = "aaaa2222" + "0" * 24
RUN_C = "cccc3333" + "0" * 24


def it(worker: int, number: int, started: float, ended: float, **extra: Any) -> IterationRecord:
    values: dict[str, Any] = {
        "worker": worker,
        "iteration": number,
        "epoch": 0,
        "started_at": started,
        "ended_at": ended,
        "compute_s": 0.0,
        "push_s": 0.0,
        "pull_s": 0.0,
        "wait_s": 0.0,
        "staleness": 0,
        "loss": None,
        "samples": 32,
        "bytes_sent": 0,
        "bytes_received": 0,
    }
    values.update(extra)
    return IterationRecord(**values)


def evaluation(at: float, accuracy: float, step: int = 0) -> EvaluationRecord:
    return EvaluationRecord(
        at=at, elapsed_s=at - 100.0, step=step, accuracy=accuracy, loss=1.0, epoch=0
    )


def record_run(
    db: Path,
    run_id: str,
    name: str,
    started_at: float,
    *,
    status: RunStatus | None = RunStatus.FINISHED,
    iterations: list[IterationRecord] | None = None,
    evaluations: list[EvaluationRecord] | None = None,
    events: list[EventRecord] | None = None,
) -> None:
    """Record a run through the recorder; status None leaves it 'running' with no heartbeat."""
    recorder = Recorder(db)
    try:
        recorder.start_run(
            run_id,
            name,
            {"seed": 1},
            sync="ssp",
            workers=2,
            servers=1,
            dataset="mnist",
            started_at=started_at,
        )
        recorder.record_iterations(iterations or [])
        for ev in evaluations or []:
            recorder.record_evaluation(ev)
        for event in events or []:
            recorder.record_event(event)
        if status is not None:
            recorder.finish(status, "boom" if status is RunStatus.FAILED else None)
        else:
            recorder.flush()
    finally:
        recorder.close()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "experiments.db"


@pytest.fixture
def reader(db: Path) -> Iterator[Engine]:
    open_engine(db).dispose()  # an empty database
    engine = open_engine(db, readonly=True)
    yield engine
    engine.dispose()


# -- list_runs -----------------------------------------------------------------------------------


def test_list_runs_newest_first_with_accuracies(db: Path, reader: Engine) -> None:
    record_run(db, RUN_A, "first", 100.0, evaluations=[evaluation(101, 0.5), evaluation(102, 0.25)])
    record_run(db, RUN_B, "second", 200.0, status=RunStatus.FAILED)
    record_run(db, RUN_C, "third", 300.0, iterations=[it(0, 0, 300, 301), it(1, 0, 300, 302)])

    listed = list_runs(reader)
    assert [r.id for r in listed] == [RUN_C, RUN_B, RUN_A]
    assert [r.status for r in listed] == ["finished", "failed", "finished"]
    assert [r.iterations for r in listed] == [2, 0, 0]
    first = listed[2]
    assert (first.best_accuracy, first.final_accuracy) == (0.5, 0.25)
    assert (listed[0].best_accuracy, listed[0].final_accuracy) == (None, None)
    assert (first.sync, first.workers, first.servers, first.dataset) == ("ssp", 2, 1, "mnist")
    assert first.ended_at is not None
    assert first.duration_s == pytest.approx(first.ended_at - 100.0)
    assert [r.id for r in list_runs(reader, limit=2)] == [RUN_C, RUN_B]
    assert [r.id for r in list_runs(reader, status="failed")] == [RUN_B]
    json.dumps([r.to_dict() for r in listed])


def test_stale_heartbeat_reads_as_crashed(db: Path, reader: Engine) -> None:
    record_run(db, RUN_A, "live-or-dead", 100.0, status=None)
    record_run(db, RUN_B, "done", 50.0)
    [heartbeat] = [r.heartbeat_at for r in list_runs(reader) if r.id == RUN_A]

    fresh = heartbeat + CRASH_AFTER_S - 1
    stale = heartbeat + CRASH_AFTER_S + 1
    assert list_runs(reader, now=fresh)[0].status == "running"
    assert list_runs(reader, now=fresh)[0].duration_s == pytest.approx(fresh - 100.0)
    crashed = list_runs(reader, now=stale)[0]
    assert (crashed.status, crashed.ended_at) == ("crashed", None)
    assert crashed.duration_s == pytest.approx(heartbeat - 100.0)
    assert list_runs(reader, now=heartbeat + 2, crash_after_s=1)[0].status == "crashed"

    assert [r.id for r in list_runs(reader, status="crashed", now=stale)] == [RUN_A]
    assert list_runs(reader, status="running", now=stale) == []
    assert [r.id for r in list_runs(reader, status="running", now=fresh)] == [RUN_A]
    assert list_runs(reader, status="crashed", now=fresh) == []


def test_unknown_status_filter_is_refused(reader: Engine) -> None:
    with pytest.raises(StoreError, match="unknown run status 'done'"):
        list_runs(reader, status="done")


def test_reader_sees_a_run_while_the_recorder_is_writing(db: Path) -> None:
    recorder = Recorder(db)
    try:
        recorder.start_run(RUN_A, "live", {}, sync="async", workers=1, servers=1, dataset="d")
        engine = open_engine(db, readonly=True)
        try:
            assert [r.status for r in list_runs(engine)] == ["running"]
        finally:
            engine.dispose()
        recorder.finish(RunStatus.FINISHED)
    finally:
        recorder.close()


# -- resolve_run ---------------------------------------------------------------------------------


@pytest.fixture
def three_runs(db: Path, reader: Engine) -> Engine:
    record_run(db, RUN_A, "baseline", 100.0)
    record_run(db, RUN_B, "twin", 200.0)
    record_run(db, RUN_C, "twin", 300.0)
    return reader


def test_resolve_full_id_prefix_and_name(three_runs: Engine) -> None:
    assert resolve_run(three_runs, RUN_B) == RUN_B
    assert resolve_run(three_runs, "aaaa1") == RUN_A
    assert resolve_run(three_runs, "CCCC") == RUN_C
    assert resolve_run(three_runs, "baseline") == RUN_A
    assert resolve_run(three_runs, "  aaaa2 ") == RUN_B


def test_resolve_last(three_runs: Engine) -> None:
    assert resolve_run(three_runs, "@last") == RUN_C
    assert resolve_run(three_runs, "@last~0") == RUN_C
    assert resolve_run(three_runs, "@last~1") == RUN_B
    assert resolve_run(three_runs, "@last~2") == RUN_A
    with pytest.raises(RunNotFound, match="3 run"):
        resolve_run(three_runs, "@last~3")
    with pytest.raises(RunNotFound, match="@last or @last~N"):
        resolve_run(three_runs, "@first")


def test_resolve_unknown(three_runs: Engine) -> None:
    for selector in ("nope", "ffff", ""):
        with pytest.raises(RunNotFound) as info:
            resolve_run(three_runs, selector)
        assert not isinstance(info.value, AmbiguousRun)


def test_resolve_ambiguous_prefix_and_name_list_candidates(three_runs: Engine) -> None:
    with pytest.raises(AmbiguousRun) as info:
        resolve_run(three_runs, "aaaa")
    assert RUN_A in str(info.value) and RUN_B in str(info.value)
    assert RUN_C not in str(info.value)
    with pytest.raises(AmbiguousRun, match=RUN_C):
        resolve_run(three_runs, "twin")


def test_resolve_on_an_empty_database(reader: Engine) -> None:
    with pytest.raises(RunNotFound, match="0 run"):
        resolve_run(reader, "@last")


# -- run_detail ----------------------------------------------------------------------------------


def _detail_rows() -> list[IterationRecord]:
    common = {"bytes_sent": 100, "bytes_received": 200}
    return [
        it(
            0,
            0,
            100.0,
            101.0,
            compute_s=0.5,
            push_s=0.125,
            pull_s=0.125,
            wait_s=0.25,
            staleness=0,
            samples=32,
            **common,
        ),
        it(
            0,
            1,
            101.0,
            103.0,
            compute_s=1.0,
            push_s=0.25,
            pull_s=0.25,
            wait_s=0.5,
            staleness=2,
            samples=32,
            **common,
        ),
        it(
            1,
            0,
            100.5,
            101.5,
            compute_s=0.75,
            push_s=0.0,
            pull_s=0.0,
            wait_s=0.25,
            staleness=1,
            samples=64,
            **common,
        ),
    ]


def test_run_detail_per_worker_math(db: Path, reader: Engine) -> None:
    events = [
        EventRecord(at=100.0 + k, kind="tick" if k % 2 else "tock", detail={"k": k})
        for k in range(25)
    ]
    evals = [evaluation(102.0, 0.5, step=1), evaluation(104.0, 0.75, step=3)]
    record_run(
        db,
        RUN_A,
        "d",
        100.0,
        status=RunStatus.FAILED,
        iterations=_detail_rows(),
        evaluations=evals,
        events=events,
    )
    detail = run_detail(reader, RUN_A)

    w0, w1 = detail.workers
    assert (w0.worker, w0.iterations, w0.samples) == (0, 2, 64)
    assert (w0.first_started_at, w0.last_ended_at, w0.wall_s) == (100.0, 103.0, 3.0)
    assert (w0.compute_s_total, w0.compute_s_mean) == (1.5, 0.75)
    assert (w0.push_s_total, w0.push_s_mean, w0.pull_s_total, w0.pull_s_mean) == (
        0.375,
        0.1875,
        0.375,
        0.1875,
    )
    assert (w0.wait_s_total, w0.wait_s_mean) == (0.75, 0.375)
    assert w0.idle_fraction == 0.25
    assert (w0.staleness_mean, w0.staleness_max) == (1.0, 2)
    assert w0.iteration_s_mean == 1.5
    assert w0.samples_per_s == pytest.approx(64 / 3)
    assert (w0.bytes_sent, w0.bytes_received) == (200, 400)
    assert (w1.worker, w1.iterations, w1.samples, w1.wall_s) == (1, 1, 64, 1.0)
    assert (w1.idle_fraction, w1.samples_per_s, w1.staleness_max) == (0.25, 64.0, 1)

    totals = detail.totals
    assert (totals.iterations, totals.samples, totals.wall_s) == (3, 128, 3.0)
    assert totals.samples_per_s == pytest.approx(128 / 3)
    assert (totals.compute_s, totals.wait_s) == (2.25, 1.0)
    assert (totals.bytes_sent, totals.bytes_received) == (300, 600)

    assert detail.summary.status == "failed" and detail.reason == "boom"
    assert detail.config == {"seed": 1}
    assert [(e.step, e.accuracy) for e in detail.evaluations] == [(1, 0.5), (3, 0.75)]
    assert detail.summary.best_accuracy == 0.75 and detail.summary.final_accuracy == 0.75
    assert detail.event_counts == {"tick": 12, "tock": 13}
    assert [e.detail["k"] for e in detail.recent_events] == list(range(5, 25))
    json.dumps(detail.to_dict())


def test_run_detail_of_a_run_without_rows(db: Path, reader: Engine) -> None:
    record_run(db, RUN_A, "empty", 100.0)
    detail = run_detail(reader, RUN_A)
    assert detail.workers == () and detail.evaluations == () and detail.event_counts == {}
    assert (detail.totals.iterations, detail.totals.samples_per_s) == (0, None)


def test_run_detail_unknown_run(reader: Engine) -> None:
    with pytest.raises(RunNotFound, match="no run with id"):
        run_detail(reader, "missing")


# -- progress ------------------------------------------------------------------------------------


def test_progress_of_a_live_run(db: Path, reader: Engine) -> None:
    now = float(int(time.time()))  # whole seconds keep the window arithmetic exact
    rows = [
        it(0, i, now - 20 + i, now - 19 + i, epoch=i // 10, staleness=i % 3, loss=float(i))
        for i in range(20)
    ]
    rows += [it(1, i, now - 20 + 2 * i, now - 19 + 2 * i) for i in range(10)]
    record_run(
        db,
        RUN_A,
        "live",
        now - 30,
        status=None,
        iterations=rows,
        evaluations=[evaluation(now - 5, 0.5, 1), evaluation(now - 2, 0.625, 2)],
    )

    snap = progress(reader, RUN_A, now=now)
    assert (snap.status, snap.total_iterations) == ("running", 30)
    w0, w1 = snap.workers
    assert (w0.worker, w0.iteration, w0.epoch, w0.staleness, w0.loss) == (0, 19, 1, 1, 19.0)
    # worker 0 ended iterations at ..., now-5, now-4, ..., now: five in (now - 5, now]
    assert w0.iterations_per_s == 1.0
    assert (w1.iteration, w1.ended_at) == (9, now - 1)
    assert w1.iterations_per_s == 2 / 5  # ended at now-3 and now-1
    assert snap.iterations_per_s == pytest.approx(7 / 5)
    assert snap.latest_evaluation is not None and snap.latest_evaluation.accuracy == 0.625
    json.dumps(snap.to_dict())


def test_progress_of_a_run_without_rows(db: Path, reader: Engine) -> None:
    record_run(db, RUN_A, "quiet", 100.0)
    snap = progress(reader, RUN_A)
    assert (snap.status, snap.workers, snap.latest_evaluation, snap.iterations_per_s) == (
        "finished",
        (),
        None,
        0.0,
    )
    with pytest.raises(RunNotFound):
        progress(reader, "missing")


def test_progress_rates_of_an_ended_run_are_measured_up_to_its_end(
    db: Path, reader: Engine
) -> None:
    t = time.time()
    rows = [it(0, 0, t - 9, t - 8), it(0, 1, t - 3, t - 2), it(0, 2, t - 2, t - 1)]
    record_run(db, RUN_A, "done", t - 10, iterations=rows)
    snap = progress(reader, RUN_A, now=t + 3600)
    assert snap.status == "finished"
    assert snap.workers[0].iterations_per_s == 2 / 5


def test_a_rate_counts_only_the_training_in_its_window(db: Path, reader: Engine) -> None:
    """Two seconds into training, the 5 s window holds 3 s of start-up: the rate is over the
    2 s trained, not 5 (which made the first ETA minutes long); under 1 s there is none."""
    now = float(int(time.time()))
    rows = [it(0, i, now - 2 + 0.5 * i, now - 1.5 + 0.5 * i) for i in range(4)]
    started = EventRecord(at=now - 2, kind="training_started", detail={"total_iterations": 40})
    record_run(db, RUN_A, "young", now - 30, status=None, iterations=rows, events=[started])
    snap = progress(reader, RUN_A, now=now)
    assert snap.training_started_at == now - 2
    assert snap.workers[0].iterations_per_s == 4 / 2
    early = progress(reader, RUN_A, now=now - 1.5)
    assert early.iterations_per_s == 0.0  # 0.5 s of training: no rate yet
