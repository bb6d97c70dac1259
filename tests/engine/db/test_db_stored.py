"""engine.db.stored: the keys a run's servers stored, summed from their ``server_stats`` events on
a real SQLite file; what runs show says of it; a run whose servers said nothing has none."""

from __future__ import annotations

from pathlib import Path

from engine.config import RunConfig
from engine.db.stored import StoredKeys, stored_keys
from engine.recorder import Recorder
from engine.wire.records import EventRecord, RunStatus
from psctl.detail_tables import stored_line
from tests.engine.db.db_reading import read_once

RUN = "d" * 32


def _stored(db: Path, details: list[dict[str, object]]) -> StoredKeys | None:
    recorder = Recorder(db)
    try:
        recorder.start_run(RUN, "stored", RunConfig().to_json_dict(), sync="asp", workers=1,
                           servers=2, dataset="digits", started_at=1000.0)
        for detail in details:
            recorder.record_event(EventRecord(at=1001.0, kind="server_stats", detail=detail))
        recorder.finish(RunStatus.FINISHED)
    finally:
        recorder.close()
    return read_once(db, "reading stored keys", lambda conn: stored_keys(conn, RUN))


def test_the_servers_stored_keys_are_summed_and_said(tmp_path: Path) -> None:
    stored = _stored(tmp_path / "runs.db", [
        {"rank": 0, "stored_keys": 3_000, "stored_bytes": 72_000, "sparse": True},
        {"rank": 1, "stored_keys": 1_000, "stored_bytes": 8_000, "sparse": False}])
    assert stored == StoredKeys(keys=4_000, bytes=80_000, sparse=True)
    assert stored_line(stored) == ("keys the servers stored: 4,000 (sparse: only keys pushed "
                                   "are stored), 20 bytes a key: 78.1 KiB of values, optimizer "
                                   "state and key maps")


def test_a_run_whose_servers_did_not_count_has_none(tmp_path: Path) -> None:
    assert _stored(tmp_path / "runs.db", [{"rank": 0, "pushes": 5}]) is None
