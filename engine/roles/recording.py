"""The coordinator's part that records: every row of the run goes through it to the recorder
(the database's only writer), and a recorder that cannot write ends the run rather than
escaping into whichever task or connection handler happened to record."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from engine.errors import StoreError
from engine.usermetrics import MAX_NAMES
from engine.wire.records import (
    EvaluationRecord,
    EventRecord,
    IterationRecord,
    LayerRecord,
    ProcessSample,
    SyncRecord,
    UserMetricRecord,
)

_Row = TypeVar("_Row")


class RecorderSink(Protocol):
    """What the coordinator needs of the recorder (``engine.recorder.Recorder`` fits). A method
    that raises :class:`StoreError` ends the run as failed."""

    def record_iterations(self, rows: list[IterationRecord]) -> None: ...

    def record_evaluation(self, row: EvaluationRecord) -> None: ...

    def record_event(self, row: EventRecord) -> None: ...

    def record_sync(self, row: SyncRecord) -> None: ...

    def record_process_samples(self, rows: list[ProcessSample]) -> None: ...

    def record_layers(self, rows: list[LayerRecord]) -> None: ...

    def record_user_metrics(self, rows: list[UserMetricRecord]) -> None: ...


class Records:
    """Writes a run's rows; ``failed`` is told (once for each failed write) when one cannot
    be written."""

    def __init__(self, sink: RecorderSink, failed: Callable[[StoreError], None]) -> None:
        self._sink, self._failed = sink, failed
        # psctl.log's names so far: each process keeps to MAX_NAMES, and so does the run.
        self._metric_names: set[str] = set()
        self._refused_names: set[str] = set()

    def event(self, kind: str, **detail: Any) -> None:
        self.event_row(EventRecord(at=time.time(), kind=kind, detail=detail))

    def event_row(self, row: EventRecord) -> None:
        self._write(self._sink.record_event, row)

    def iterations(self, rows: list[IterationRecord]) -> None:
        self._write(self._sink.record_iterations, rows)

    def evaluation(self, row: EvaluationRecord) -> None:
        self._write(self._sink.record_evaluation, row)

    def sync(self, row: SyncRecord) -> None:
        self._write(self._sink.record_sync, row)

    def samples(self, rows: list[ProcessSample]) -> None:
        self._write(self._sink.record_process_samples, rows)

    def layers(self, rows: list[LayerRecord]) -> None:
        self._write(self._sink.record_layers, rows)

    def user_metrics(self, rows: list[UserMetricRecord]) -> None:
        """The user's own metrics, up to MAX_NAMES names in the run: the values of names past
        it (processes whose code logs different names) are dropped, each name said once in a
        ``user_metrics_dropped`` event."""
        names = self._metric_names
        for row in rows:
            if row.name not in names and len(names) < MAX_NAMES:
                names.add(row.name)
        kept = [row for row in rows if row.name in names]
        refused = {row.name for row in rows if row.name not in names} - self._refused_names
        if refused:
            self._refused_names |= refused
            self.event("user_metrics_dropped", names=sorted(refused),
                       reason=f"a run records at most {MAX_NAMES} metric names")
        if kept:
            self._write(self._sink.record_user_metrics, kept)

    def _write(self, write: Callable[[_Row], None], row: _Row) -> None:
        try:
            write(row)
        except StoreError as exc:
            self._failed(exc)
