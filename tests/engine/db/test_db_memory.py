"""A run's memory at its peak: the summed PSS of its processes, each at its latest reading, from
its first reading to its last sample; runs from before PSS was read have none."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from engine.config import RunConfig
from engine.db.memory import MemoryPeak, memory_peak
from engine.db.queries import reading, run_detail
from engine.db.schema import open_engine
from engine.recorder import Recorder
from engine.wire.records import ProcessSample, RunStatus

RUN = "d" * 32
T0 = 100.0
MIB = 2**20

# (role, rank, pid, first and last sample (s after T0), RSS MiB, {when: PSS MiB}); a process
# is sampled every second in between, PSS None but when read. Worker 0 ends at 4 s with the
# largest PSS; worker 1 starts after it ended; worker 2 is never read.
PROCESSES = [
    ("coordinator", 0, 11, 1, 10, 200, {1: 50, 6: 60}),
    ("server", 0, 12, 1, 10, 300, {2: 80, 7: 90}),
    ("worker", 0, 13, 1, 4, 250, {3: 100}),
    ("worker", 1, 14, 5, 10, 260, {5: 20, 8: 40}),
    ("worker", 2, 15, 1, 10, 270, {}),
    ("worker", 3, 16, 1, 10, 280, {3: 10}),
]


def _samples() -> list[ProcessSample]:
    return [ProcessSample(at=T0 + s, role=role, rank=rank, pid=pid, cpu_percent=10.0,
                          rss_bytes=rss * MIB,
                          pss_bytes=None if s not in pss else pss[s] * MIB)
            for role, rank, pid, first, last, rss, pss in PROCESSES
            for s in range(first, last + 1)]


def _record(db: Path, rows: list[ProcessSample]) -> None:
    recorder = Recorder(db)
    try:
        recorder.start_run(RUN, "memory", RunConfig().to_json_dict(), sync="bsp", workers=4,
                           servers=1, dataset="digits", started_at=T0)
        recorder.record_process_samples(rows)
        recorder.finish(RunStatus.FINISHED)
    finally:
        recorder.close()


@pytest.fixture
def reader(tmp_path: Path) -> Iterator[Engine]:
    db = tmp_path / "experiments.db"
    _record(db, _samples())
    engine = open_engine(db, readonly=True)
    yield engine
    engine.dispose()


def _peak(engine: Engine) -> MemoryPeak | None:
    """The peak, its moment in seconds from T0: without iterations, the run's clock counts
    from the run's start (engine/db/clock.py)."""
    with reading(engine, "reading the peak") as conn:
        return memory_peak(conn, RUN, lambda t: t - T0)


def test_the_peak_sums_each_live_processs_latest_reading(reader: Engine) -> None:
    """At 3 s: coordinator 50 (read at 1 s), server 80 (2 s), workers 0 and 3 (3 s), 240 MiB.
    Later readings rise (200 MiB at 8 s), but worker 0's 100 MiB left with it at 4 s: counted
    to the end, the peak would have been 300 MiB at 8 s."""
    assert _peak(reader) == MemoryPeak(
        peak_pss_bytes=240 * MIB, at=3.0, processes=4,
        rss_bytes=(200 + 300 + 250 + 280) * MIB,  # worker 2, never read, is not counted
        pss_by_role={"coordinator": 50 * MIB, "server": 80 * MIB, "worker": 55 * MIB},
        unread=1)  # worker 2, sampled then, with no PSS reading: said, not summed


def test_a_process_counts_from_its_first_reading_to_its_last_sample(tmp_path: Path) -> None:
    """Without worker 0, the peak is at 8 s: worker 1 read at 5 s and 8 s, the others at
    their latest readings (the coordinator's of 6 s, the server's of 7 s)."""
    db = tmp_path / "experiments.db"
    _record(db, [row for row in _samples() if row.pid != 13])
    engine = open_engine(db, readonly=True)
    try:
        peak = _peak(engine)
    finally:
        engine.dispose()
    assert peak == MemoryPeak(
        peak_pss_bytes=(60 + 90 + 40 + 10) * MIB, at=8.0, processes=4,
        rss_bytes=(200 + 300 + 260 + 280) * MIB,
        pss_by_role={"coordinator": 60 * MIB, "server": 90 * MIB, "worker": 25 * MIB},
        unread=1)


def test_a_run_without_pss_has_no_peak(tmp_path: Path) -> None:
    """Runs recorded before schema 8 (or where PSS could not be read) say nothing, not 0."""
    db = tmp_path / "experiments.db"
    _record(db, [row.model_copy(update={"pss_bytes": None}) for row in _samples()])
    engine = open_engine(db, readonly=True)
    try:
        assert _peak(engine) is None
        assert run_detail(engine, RUN).memory is None
    finally:
        engine.dispose()


def test_run_detail_carries_the_peak(reader: Engine) -> None:
    detail = run_detail(reader, RUN)
    assert detail.memory == _peak(reader)
    memory = detail.to_dict()["memory"]
    assert memory["peak_pss_bytes"] == 240 * MIB and memory["pss_by_role"]["worker"] == 55 * MIB
