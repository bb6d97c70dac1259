"""The experiments database: schema and opening (:mod:`.schema`), read queries (:mod:`.queries`).

Only :class:`engine.recorder.Recorder` writes to it; everything here except opening a writable
engine for the recorder is read-only.
"""

from engine.db.queries import (
    CRASH_AFTER_S,
    EvaluationPoint,
    EventEntry,
    Progress,
    RunDetail,
    RunSummary,
    RunTotals,
    WorkerProgress,
    WorkerStats,
    list_runs,
    progress,
    resolve_run,
    run_detail,
)
from engine.db.schema import SCHEMA_VERSION, metadata, open_engine

__all__ = [
    "CRASH_AFTER_S",
    "SCHEMA_VERSION",
    "EvaluationPoint",
    "EventEntry",
    "Progress",
    "RunDetail",
    "RunSummary",
    "RunTotals",
    "WorkerProgress",
    "WorkerStats",
    "list_runs",
    "metadata",
    "open_engine",
    "progress",
    "resolve_run",
    "run_detail",
]
