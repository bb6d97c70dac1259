"""Where a run's roles ran, read back from the events they joined with."""

from __future__ import annotations

from pathlib import Path

from engine.db.queries import run_detail
from engine.db.schema import open_engine
from engine.wire.records import EventRecord
from tests.engine.db.test_db_queries import RUN_A, record_run


def _joined(at: float, role: str, rank: int, node: str) -> EventRecord:
    return EventRecord(at=at, kind="process_joined",
                       detail={"role": role, "rank": rank, "pid": 10 + at, "node": node})


def test_roles_are_grouped_by_node_and_a_restart_counts_where_it_last_ran(
        tmp_path: Path) -> None:
    db = tmp_path / "nodes.db"
    record_run(db, RUN_A, "spread", 100.0, events=[
        EventRecord(at=100.0, kind="coordinator_listening",
                    detail={"address": "ws://127.0.0.4:7000", "pid": 1}),
        _joined(101, "server", 1, "127.0.0.3"), _joined(102, "server", 0, "127.0.0.2"),
        _joined(103, "evaluator", 0, "127.0.0.2"), _joined(104, "worker", 1, "127.0.0.4"),
        _joined(105, "worker", 0, "127.0.0.3"),
        EventRecord(at=110.0, kind="worker_rejoined",
                    detail={"rank": 1, "pid": 99, "node": "127.0.0.2"}),
    ])
    engine = open_engine(db, readonly=True)
    try:
        nodes = run_detail(engine, RUN_A).nodes
    finally:
        engine.dispose()
    assert nodes == (("127.0.0.2", ("server 0", "evaluator", "worker 1")),
                     ("127.0.0.3", ("server 1", "worker 0")),
                     ("127.0.0.4", ("coordinator",)))


def test_a_run_from_before_nodes_were_recorded_has_none(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    record_run(db, RUN_A, "old", 100.0, events=[
        EventRecord(at=101.0, kind="process_joined", detail={"role": "worker", "rank": 0,
                                                             "pid": 5})])
    engine = open_engine(db, readonly=True)
    try:
        assert run_detail(engine, RUN_A).nodes == ()
    finally:
        engine.dispose()
