"""A resumed run's earlier end, kept when the resume fails before the run trains again.

``psctl resume`` reopens the run (running again) before its processes start. A resume that
fails on its way back (a shard server refuses the checkpoint, say) changed nothing of the run:
it is recorded as a ``resume_failed`` event with its reason, and the run is closed again with
the end it had, ``interrupted`` or ``failed`` and that end's reason, so that an interrupted run
is not relabelled failed. A run that had crashed recorded no end: it ends failed with the
resume's reason, as any run that fails does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select

from engine.db import open_engine
from engine.db.queries import reading
from engine.db.schema import runs
from engine.wire.records import RunStatus

KEPT = (RunStatus.INTERRUPTED, RunStatus.FAILED)


@dataclass(frozen=True)
class EarlierEnd:
    status: RunStatus
    reason: str | None


def earlier_end(db: Path, run_id: str) -> EarlierEnd | None:
    """The end the run recorded before this resume; None where it recorded none it could
    keep (it crashed: its row still says running)."""
    engine = open_engine(db, readonly=True)
    try:
        with reading(engine, "reading the run to resume") as conn:
            row = conn.execute(select(runs.c.status, runs.c.reason)
                               .where(runs.c.id == run_id)).one_or_none()
    finally:
        engine.dispose()
    if row is None or row.status not in KEPT:
        return None
    return EarlierEnd(RunStatus(row.status), row.reason)


def end_to_record(earlier: EarlierEnd | None, trained: bool, status: RunStatus,
                  reason: str | None) -> tuple[RunStatus, str | None]:
    """The end to record for a resumed run that ended with ``status`` and ``reason``: its
    earlier one if the resume failed before it trained again, else its own."""
    if earlier is None or trained or status is not RunStatus.FAILED:
        return status, reason
    return earlier.status, earlier.reason
