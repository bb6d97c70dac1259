"""The recorder: the only code that writes the experiments database.

Callers (the coordinator's event loop, mostly) must never wait on SQLite, so every ``record_*``
call only puts its rows on a queue. One background thread owns the only writing connection: it
batches rows into executemany inserts, commits at least every ``flush_interval_s`` (or once
``_MAX_PENDING`` rows are waiting), and keeps ``runs.heartbeat_at`` fresh so that readers can tell
a live run from one whose process died.

A failure in the writer thread is kept and raised as :class:`StoreError` from the next call to
any method, so lost rows never go unnoticed.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import update

from engine.db.schema import open_engine, runs, translate_errors
from engine.errors import StoreError
from engine.recorder.admin import NOTES_MAX_CHARS, delete_runs, set_notes, set_tags
from engine.recorder.writer import (
    DUPLICATE_EVENT,
    ENDED,
    REBUILD_ROLLUPS_SQL,
    SYNC_JSON_COLUMNS,
    CloseRequest,
    FinishRequest,
    FlushRequest,
    IterationsRequest,
    MessageRequest,
    ResumeRunRequest,
    RowRequest,
    RowsRequest,
    StartRunRequest,
    Writer,
    config_json,
)
from engine.wire.records import (
    EvaluationRecord,
    EventRecord,
    IterationRecord,
    LayerRecord,
    ProcessSample,
    RunStatus,
    SyncRecord,
    UserMetricRecord,
)

__all__ = [
    "DUPLICATE_EVENT",
    "NOTES_MAX_CHARS",
    "REBUILD_ROLLUPS_SQL",
    "Recorder",
    "delete_runs",
    "set_notes",
    "set_tags",
]
log = logging.getLogger(__name__)


class Recorder:
    """Writes one run at a time to the database at ``db_path`` from a background thread."""

    def __init__(
        self,
        db_path: Path,
        *,
        flush_interval_s: float = 0.2,
        heartbeat_interval_s: float = 1.0,
    ) -> None:
        self._db_path = Path(db_path)
        self._engine = open_engine(self._db_path)
        self._queue: queue.Queue[MessageRequest] = queue.Queue()
        self._lock = threading.Lock()
        self._run_id: str | None = None
        self._closed = False
        self._error: BaseException | None = None
        self._error_reported = False
        self._writer = Writer(
            self._engine, self._queue, self._set_error, flush_interval_s, heartbeat_interval_s
        )
        self._thread = threading.Thread(target=self._writer.run, name="psctl-recorder", daemon=True)
        self._thread.start()

    # -- public API -----------------------------------------------------------------------------

    def start_run(
        self,
        run_id: str,
        name: str,
        config: dict[str, Any],
        *,
        sync: str,
        workers: int,
        servers: int,
        dataset: str,
        started_at: float | None = None,
    ) -> None:
        """Insert the run row and wait until it is committed, so readers can find it at once."""
        now = time.time()
        values = {
            "id": run_id,
            "name": name,
            "status": RunStatus.RUNNING.value,
            "started_at": now if started_at is None else started_at,
            "heartbeat_at": now,
            "config_json": config_json(config),
            "sync": sync,
            "workers": workers,
            "servers": servers,
            "dataset": dataset,
        }
        self._open(run_id, StartRunRequest(values), "starting")

    def resume_run(self, run_id: str) -> None:
        """Reopen an ended run (``psctl resume``): running again, its rows going on; waits
        until committed."""
        self._open(run_id, ResumeRunRequest(run_id, time.time()), "resuming")

    def _open(self, run_id: str, request: StartRunRequest | ResumeRunRequest,
              action: str) -> None:
        with self._lock:
            self._check_usable()
            if self._run_id is not None:
                raise StoreError(f"run {self._run_id} is still open; finish it before {action}")
            self._queue.put(request)
            self._run_id = run_id
        try:
            self.flush()
        except StoreError:
            with self._lock:
                self._run_id = None
            raise

    def record_iterations(self, rows: Sequence[IterationRecord]) -> None:
        """Queue iteration rows; never blocks on the database."""
        if rows:
            self._queue.put(IterationsRequest(self._open_run(), tuple(rows)))
        else:
            self._open_run()

    def record_evaluation(self, row: EvaluationRecord) -> None:
        values = {"run_id": self._open_run(), **row.model_dump()}
        self._queue.put(RowRequest("evaluations", values))

    def record_event(self, row: EventRecord) -> None:
        # Serialised here, not in the writer, so an unserialisable detail fails its caller only.
        detail = json.dumps(row.detail, default=str)
        values = {"run_id": self._open_run(), "at": row.at, "kind": row.kind, "detail": detail}
        self._queue.put(RowRequest("events", values))

    def record_process_samples(self, rows: Sequence[ProcessSample]) -> None:
        run_id = self._open_run()
        for row in rows:
            self._queue.put(RowRequest("process_samples", {"run_id": run_id, **row.model_dump()}))

    def record_layers(self, rows: Sequence[LayerRecord]) -> None:
        run_id = self._open_run()
        for row in rows:
            self._queue.put(RowRequest("layer_iterations", {"run_id": run_id,
                                                            **row.model_dump()}))

    def record_user_metrics(self, rows: Sequence[UserMetricRecord]) -> None:
        """Queue what the user's code logged (``psctl.log``); never blocks on the database."""
        run_id = self._open_run()
        if rows:
            self._queue.put(RowsRequest("user_metrics", tuple(
                {"run_id": run_id, **row.model_dump()} for row in rows)))

    def record_sync(self, row: SyncRecord) -> None:
        """A barrier decision, or the same barrier again once completed (which updates it)."""
        values: dict[str, Any] = {"run_id": self._open_run(), **row.model_dump()}
        for column in SYNC_JSON_COLUMNS:
            if values[column] is not None:
                values[column] = json.dumps(values[column])
        self._queue.put(RowRequest("syncs", values))

    def finish(
        self, status: RunStatus, reason: str | None = None, *, timeout: float = 10.0,
        ended_at: float | None = None,
    ) -> None:
        """Write everything pending, then the run's final status; returns once committed.
        ``ended_at`` defaults to now (a simulated run passes its virtual end)."""
        if status not in ENDED:
            raise ValueError(f"a run finishes as one of {[s.value for s in ENDED]}, not {status}")
        with self._lock:
            run_id = self._require_run()
            self._queue.put(FinishRequest(run_id, status.value, reason,
                                          time.time() if ended_at is None else ended_at))
            self._run_id = None
        self.flush(timeout)

    def check(self) -> None:
        """Raise :class:`StoreError` if the writer thread has failed; for a caller that records
        nothing for a while but must learn of a failure (a deleted run row) without delay."""
        self._raise_if_failed()

    def flush(self, timeout: float = 10.0) -> None:
        """Block until everything recorded so far is committed."""
        with self._lock:
            self._check_usable()
            message = FlushRequest()
            self._queue.put(message)
        self._wait(message.done, timeout, "flushing")
        self._raise_if_failed()

    def close(self, timeout: float = 10.0) -> None:
        """Write what is pending and stop the writer. Idempotent.

        A writer error already raised to a caller is not raised again here, so ``close`` in a
        ``finally`` does not mask the first report.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._run_id is not None and self._error is None:  # else it was reported
                log.warning(
                    "recorder closed with run %s still open; it will read as crashed", self._run_id
                )
            message = CloseRequest()
            self._queue.put(message)
        try:
            self._wait(message.done, timeout, "closing")
            self._thread.join(timeout)
        finally:
            self._engine.dispose()
        if self._error is not None and not self._error_reported:
            self._raise_if_failed()

    @staticmethod
    def mark_ended(db_path: Path, run_id: str, status: RunStatus, reason: str | None) -> bool:
        """Set a run's final status if it is still ``running``; whether it changed.

        For the launcher, when the coordinator (and so its recorder) died before finishing. The
        run's end is taken to be now, when the death was noticed.
        """
        if status not in ENDED:
            raise ValueError(f"a run ends as one of {[s.value for s in ENDED]}, not {status}")
        if not Path(db_path).is_file():
            return False
        engine = open_engine(Path(db_path))
        stmt = (
            update(runs)
            .where(runs.c.id == run_id, runs.c.status == RunStatus.RUNNING.value)
            .values(status=status.value, reason=reason, ended_at=time.time())
        )
        try:
            with translate_errors(f"marking run {run_id} {status.value}"), engine.begin() as conn:
                return conn.execute(stmt).rowcount == 1
        finally:
            engine.dispose()

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- internals ------------------------------------------------------------------------------

    def _set_error(self, exc: BaseException) -> None:
        with self._lock:
            if self._error is None:
                self._error = exc

    def _raise_if_failed(self) -> None:
        error = self._error
        if error is not None:
            self._error_reported = True
            cause = getattr(error, "orig", None) or error  # the sqlite3 message, not SQLAlchemy's
            raise StoreError(f"the recorder could not write {self._db_path}: {cause}") from error

    def _check_usable(self) -> None:
        self._raise_if_failed()
        if self._closed:
            raise StoreError("the recorder is closed")

    def _require_run(self) -> str:
        self._check_usable()
        if self._run_id is None:
            raise StoreError("no run is open: call start_run first")
        return self._run_id

    def _open_run(self) -> str:
        with self._lock:
            return self._require_run()

    def _wait(self, done: threading.Event, timeout: float, action: str) -> None:
        if not done.wait(timeout):
            self._raise_if_failed()
            raise StoreError(f"the recorder timed out after {timeout:g} s {action} {self._db_path}")


