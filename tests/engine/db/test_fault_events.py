"""A run's role failures in words (``psctl runs show``): the evaluator's loss and return, a crash
with its message, refused hellos; and where the restarted evaluator ran."""

from __future__ import annotations

from pathlib import Path

from engine.db.queries import run_detail
from engine.db.schema import open_engine
from engine.wire.records import EventRecord
from tests.engine.db.test_db_queries import RUN_A, record_run


def test_role_failures_are_told_in_words_and_the_evaluator_is_where_it_last_ran(
        tmp_path: Path) -> None:
    db = tmp_path / "faults.db"
    record_run(db, RUN_A, "hit", 100.0, events=[
        EventRecord(at=100.0, kind="coordinator_listening",
                    detail={"address": "ws://127.0.0.4:7000", "pid": 1}),
        EventRecord(at=101.0, kind="process_joined",
                    detail={"role": "evaluator", "rank": 0, "pid": 5, "node": "127.0.0.2"}),
        EventRecord(at=102.0, kind="hello_refused",
                    detail={"reason": "worker 0 joined twice", "remote": "127.0.0.1:5555",
                            "refused": 1}),
        EventRecord(at=103.0, kind="evaluator_lost",
                    detail={"rank": 0, "pid": 5, "restart": 1, "max_restarts": 3}),
        EventRecord(at=105.5, kind="evaluator_rejoined",
                    detail={"role": "evaluator", "rank": 0, "pid": 6, "node": "127.0.0.3"}),
        EventRecord(at=107.0, kind="process_error",
                    detail={"role": "worker", "rank": 1, "message": "RuntimeError: boom",
                            "traceback": "..."}),
    ])
    engine = open_engine(db, readonly=True)
    try:
        detail = run_detail(engine, RUN_A)
    finally:
        engine.dispose()
    assert detail.faults == (
        (2.0, "hello_refused", "refused a connection from 127.0.0.1:5555: worker 0 joined twice"),
        (3.0, "evaluator_lost", "evaluator lost (restart 1 of 3)"),
        (5.5, "evaluator_rejoined", "evaluator rejoined"),
        (7.0, "process_error", "worker 1 failed: RuntimeError: boom"),
    )
    assert detail.nodes == (("127.0.0.3", ("evaluator",)), ("127.0.0.4", ("coordinator",)))


def test_the_failure_detectors_verdicts_and_a_divergence_are_told_in_words(
        tmp_path: Path) -> None:
    db = tmp_path / "faults.db"
    record_run(db, RUN_A, "hit", 100.0, events=[
        EventRecord(at=101.0, kind="server_slow", detail={
            "rank": 1, "reason": "no heartbeat for 1.20 s (φ = 9.1), but its process works: "
                                 "waiting for it"}),
        EventRecord(at=102.0, kind="server_unresponsive", detail={
            "rank": 1, "pid": 7, "silent_s": 0.8,
            "reason": "no heartbeat for 0.80 s (φ = 9.5), and its process is stopped"}),
        EventRecord(at=103.0, kind="fence_withheld", detail={
            "rank": 0, "message": "server 0 ..., but it holds the last copy of key ranges 0, "
                                  "1: waiting for it rather than losing them"}),
        EventRecord(at=104.0, kind="diverged", detail={
            "role": "worker", "rank": 1, "message": "the model diverged: worker 1 at "
                                                    "iteration 4: its training loss is nan"}),
    ])
    engine = open_engine(db, readonly=True)
    try:
        said = {kind: text for _, kind, text in run_detail(engine, RUN_A).faults}
    finally:
        engine.dispose()
    assert said["server_slow"].startswith("server 1 slow, not fenced: no heartbeat for 1.20 s")
    assert said["server_unresponsive"] == ("server 1 fenced (killed): no heartbeat for 0.80 s "
                                           "(φ = 9.5), and its process is stopped")
    assert said["fence_withheld"].endswith("waiting for it rather than losing them")
    assert said["diverged"].startswith("the model diverged: worker 1 at iteration 4")
