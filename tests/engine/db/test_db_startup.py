"""engine.db.startup: a run's start-up from its ``start_up`` event and its processes' joins, on
a real SQLite file; an older run (no such event) has none."""

from __future__ import annotations

from pathlib import Path

from engine.config import RunConfig
from engine.db.clock import training_clock
from engine.db.startup import StartUp, run_start_up
from engine.recorder import Recorder
from engine.wire.records import EventRecord, IterationRecord, RunStatus
from tests.engine.db.db_reading import read_once

RUN = "e" * 32
ORIGIN = 1000.0


def _record(db: Path, events: list[tuple[str, dict[str, object]]]) -> None:
    recorder = Recorder(db)
    try:
        recorder.start_run(RUN, "start", RunConfig().to_json_dict(), sync="bsp", workers=2,
                           servers=1, dataset="digits", started_at=ORIGIN + 0.7)
        for kind, detail in events:
            recorder.record_event(EventRecord(at=ORIGIN + 2.0, kind=kind, detail=detail))
        recorder.record_iterations([IterationRecord(
            worker=0, iteration=0, epoch=0, started_at=ORIGIN + 2.25, ended_at=ORIGIN + 2.5,
            compute_s=0.1, push_s=0.0, pull_s=0.0, wait_s=0.0, staleness=0, loss=1.0,
            samples=64, bytes_sent=0, bytes_received=0)])
        recorder.finish(RunStatus.FINISHED)
    finally:
        recorder.close()


def _start_up(db: Path) -> StartUp | None:
    return read_once(db, "reading start-up",
                     lambda conn: run_start_up(conn, RUN, training_clock(conn, RUN)))


def test_the_moments_in_order_the_spans_and_each_process_s_own_start(tmp_path: Path) -> None:
    db = tmp_path / "runs.db"
    _record(db, [
        ("start_up", {"mode": "template", "note": None, "origin": ORIGIN,
                      "at": {"template": 0.2, "launcher": 0.5, "template_stage_0": 0.65,
                             "coordinator": 0.7, "template_stage_1": 1.6,
                             "roles_started": 1.65, "joined": 1.7},
                      "took": {"template_stage_0_s": 0.2, "template_stage_1_s": 0.9,
                               "data_s": 0.03}}),
        ("process_joined", {"role": "server", "rank": 0, "start_s": 0.02, "forked": True}),
        ("process_joined", {"role": "worker", "rank": 0, "start_s": 0.01, "forked": True}),
        ("process_joined", {"role": "worker", "rank": 1, "start_s": 1.5, "forked": False}),
        ("worker_rejoined", {"role": "worker", "rank": 1, "start_s": 0.03, "forked": True}),
        ("process_joined", {"role": "evaluator", "rank": 0}),  # an older role says nothing
    ])
    start = _start_up(db)
    assert start is not None
    assert [name for name, _ in start.moments] == [
        "launcher", "template_stage_0", "coordinator", "template_stage_1", "roles_started",
        "joined"]
    assert start.first_iteration_s == 2.25
    assert (start.joins, start.forked) == (4, 3)
    assert start.role_start_median_s == 0.025 and start.role_start_max_s == 1.5
    said = start.describe()  # how long start-up took is said once, by runs show's line above
    assert said.startswith("where start-up went (roles forked from the warm template), from "
                           "the command's start: the launcher began 0.50 s")
    assert "2.25" not in said
    assert "the data set 0.03 s" in said and "(3 of 4 forked)" in said
    assert start.to_dict()["moments"]["coordinator"] == 0.7


def test_a_run_no_launcher_told_of_has_none_and_a_fallback_says_why(tmp_path: Path) -> None:
    old = tmp_path / "old.db"
    _record(old, [("process_joined", {"role": "worker", "rank": 0})])
    assert _start_up(old) is None
    fell_back = tmp_path / "fresh.db"
    _record(fell_back, [("start_up", {"mode": "fresh", "origin": ORIGIN,
                                      "note": "the template process did not start",
                                      "at": {"launcher": 0.4, "joined": 3.0}, "took": {}})])
    start = _start_up(fell_back)
    assert start is not None and start.mode == "fresh"
    assert start.describe().endswith("; the template process did not start")
    assert "each role a fresh Python" in start.describe()
