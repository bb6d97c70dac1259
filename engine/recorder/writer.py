"""The recorder's writer thread: queued messages in, batched transactions out.

Everything here runs on the one thread that owns the writing connection (see ``Recorder``);
iteration rows go in with a precompiled executemany, their rollups are rebuilt in the same
transaction, and ElasticBSP barriers are upserted so that a completion fills in its decision.
"""

from __future__ import annotations

import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from sqlalchemy import Connection, Engine, insert, select, update
from sqlalchemy.dialects import sqlite
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from engine.db.schema import (
    ROLLUP_WIDTH_S,
    evaluations,
    events,
    iterations,
    layer_iterations,
    process_samples,
    runs,
    syncs,
    user_metrics,
)
from engine.errors import StoreError
from engine.wire.records import IterationRecord, RunStatus

log = logging.getLogger(__name__)

_MAX_PENDING = 1000


def _compile_iteration_insert() -> tuple[str, tuple[str, ...]]:
    # The Core statement is compiled once and executed with plain tuples: SQLAlchemy's per-row
    # parameter processing cost ~5 us a row, three times what SQLite itself needs for the insert.
    compiled = sqlite_insert(iterations).on_conflict_do_nothing().compile(dialect=sqlite.dialect())
    names = tuple(compiled.positiontup or ())
    if names[:1] != ("run_id",) or set(names[1:]) != set(IterationRecord.model_fields):
        raise RuntimeError(f"iterations columns {names} do not match IterationRecord")
    return str(compiled), names[1:]


_INSERT_ITERATIONS_SQL, _ITERATION_FIELDS = _compile_iteration_insert()
_ENDED_AT = _ITERATION_FIELDS.index("ended_at") + 1  # in a pending row, after run_id

# Rebuilds the iteration_rollups rows of slots :lo..:hi (ROLLUP_WIDTH_S each, counted from the
# run's start :origin) from the iterations rows themselves: exact whatever was skipped as a
# duplicate or arrived late, and all in SQLite, so the writer thread holds no GIL meanwhile. The
# ended_at bounds let the (run_id, ended_at) index find the rows; the CAST decides the slot
# exactly as readers do.
_SLOTS_PER_S = round(1 / ROLLUP_WIDTH_S)
REBUILD_ROLLUPS_SQL = f"""
    INSERT OR REPLACE INTO iteration_rollups
    SELECT run_id, worker, CAST((ended_at - :origin) * {_SLOTS_PER_S} AS INTEGER) AS slot,
           count(*), max(ended_at), max(iteration), sum(samples), sum(compute_s), sum(push_s),
           sum(pull_s), sum(wait_s), min(staleness), max(staleness), min(loss), max(loss),
           sum(bytes_sent), sum(bytes_received), min(lr_scale), max(lr_scale),
           sum(push_bytes), sum(push_bytes_dense), sum(pull_bytes_saved)
    FROM iterations
    WHERE run_id = :run AND ended_at >= :origin + (:lo - 1) * {ROLLUP_WIDTH_S}
      AND ended_at < :origin + (:hi + 2) * {ROLLUP_WIDTH_S}
      AND CAST((ended_at - :origin) * {_SLOTS_PER_S} AS INTEGER) BETWEEN :lo AND :hi
    GROUP BY worker, slot
"""
_iteration_values = attrgetter(*_ITERATION_FIELDS)
DUPLICATE_EVENT = "duplicate_iterations"
ENDED = (RunStatus.FINISHED, RunStatus.FAILED, RunStatus.INTERRUPTED)


# -- messages from callers to the writer thread ----------------------------------------------------


@dataclass(frozen=True)
class StartRunRequest:
    values: dict[str, Any]


@dataclass(frozen=True)
class ResumeRunRequest:
    run_id: str
    heartbeat_at: float


@dataclass(frozen=True)
class IterationsRequest:
    run_id: str
    rows: tuple[IterationRecord, ...]


@dataclass(frozen=True)
class RowRequest:
    table: str  # "evaluations", "events", "process_samples", "syncs" or "layer_iterations"
    values: dict[str, Any]


@dataclass(frozen=True)
class RowsRequest:
    """Several rows of one table at once (``user_metrics``: up to MAX_NAMES an iteration)."""

    table: str  # "user_metrics"
    rows: tuple[dict[str, Any], ...]


@dataclass(frozen=True)
class FinishRequest:
    run_id: str
    status: str
    reason: str | None
    ended_at: float


@dataclass(frozen=True)
class FlushRequest:
    done: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class CloseRequest:
    done: threading.Event = field(default_factory=threading.Event)


MessageRequest = (StartRunRequest | ResumeRunRequest | IterationsRequest | RowRequest
                  | RowsRequest | FinishRequest | FlushRequest | CloseRequest)


SYNC_JSON_COLUMNS = ("base_clocks", "predicted", "chosen", "barrier_clocks", "arrivals")


def _upsert_sync(values: dict[str, Any]) -> Any:
    statement = sqlite_insert(syncs).values(values)
    completed = {k: statement.excluded[k] for k in ("arrivals", "actual_wait", "released_at")}
    return statement.on_conflict_do_update(index_elements=["run_id", "sync_index"],
                                           set_=completed)


def config_json(config: dict[str, Any]) -> str:
    try:
        return json.dumps(config, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise StoreError(f"the run configuration cannot be stored as JSON: {exc}") from exc


class Writer:
    """The writer thread's state; touched only by that thread."""

    def __init__(
        self,
        engine: Engine,
        messages: queue.Queue[MessageRequest],
        on_error: Callable[[BaseException], None],
        flush_interval_s: float,
        heartbeat_interval_s: float,
    ) -> None:
        self._engine = engine
        self._messages = messages
        self._on_error = on_error
        self._flush_interval_s = flush_interval_s
        self._heartbeat_interval_s = heartbeat_interval_s
        self._iterations: dict[str, list[tuple[Any, ...]]] = {}
        self._rows: dict[str, list[dict[str, Any]]] = {"evaluations": [], "events": [],
                                                       "process_samples": [], "syncs": [],
                                                       "layer_iterations": [],
                                                       "user_metrics": []}
        self._run_id: str | None = None
        self._origins: dict[str, float] = {}  # runs.started_at: rollup slots count from it
        self._last_commit = time.monotonic()
        self._last_heartbeat = time.monotonic()
        self._failed = False

    def run(self) -> None:
        conn: Connection | None = None
        try:
            conn = self._engine.connect()
        except Exception as exc:
            self._fail(exc)
        while True:
            message = self._next_message()
            if not self._failed and conn is not None:
                try:
                    self._handle(conn, message)
                except Exception as exc:
                    self._fail(exc)
            if isinstance(message, FlushRequest | CloseRequest):
                message.done.set()
            if isinstance(message, CloseRequest):
                break
        if conn is not None:
            conn.close()

    def _fail(self, exc: BaseException) -> None:
        # Keep draining the queue so nobody waits forever; the error surfaces at the next call.
        log.error("recorder writer failed: %s", exc)
        self._failed = True
        self._run_id = None  # no more heartbeats: a failed recorder must read as crashed
        self._iterations.clear()
        for pending in self._rows.values():
            pending.clear()
        self._on_error(exc)

    def _next_message(self) -> MessageRequest | None:
        timeout = self._seconds_to_next_write()
        try:
            if timeout <= 0:
                return self._messages.get_nowait()
            return self._messages.get(timeout=timeout)
        except queue.Empty:
            return None

    def _seconds_to_next_write(self) -> float:
        now = time.monotonic()
        deadlines = []
        if self._pending():
            deadlines.append(self._last_commit + self._flush_interval_s)
        if self._run_id is not None:
            deadlines.append(self._last_heartbeat + self._heartbeat_interval_s)
        return min(deadlines) - now if deadlines else 3600.0

    def _pending(self) -> int:
        pending_iterations = sum(len(p) for p in self._iterations.values())
        return pending_iterations + sum(len(p) for p in self._rows.values())

    def _handle(self, conn: Connection, message: MessageRequest | None) -> None:
        match message:
            case IterationsRequest(run_id=run_id, rows=rows):
                pending = self._iterations.setdefault(run_id, [])
                pending.extend((run_id, *_iteration_values(r)) for r in rows)
            case RowRequest(table=table, values=values):
                self._rows[table].append(values)
            case RowsRequest(table=table, rows=rows):
                self._rows[table].extend(rows)
            case (StartRunRequest() | ResumeRunRequest() | FinishRequest() | FlushRequest()
                  | CloseRequest()):
                self._write(conn, message)
                return
        if self._due():
            self._write(conn, None)

    def _due(self) -> bool:
        now = time.monotonic()
        if self._pending() >= _MAX_PENDING:
            return True
        if self._pending() and now - self._last_commit >= self._flush_interval_s:
            return True
        return self._run_id is not None and now - self._last_heartbeat >= self._heartbeat_interval_s

    def _write(
        self, conn: Connection,
        control: (StartRunRequest | ResumeRunRequest | FinishRequest | FlushRequest
                  | CloseRequest | None),
    ) -> None:
        """One transaction: pending rows first, then the control message, then the heartbeat."""
        with conn.begin():
            self._write_pending(conn)
            if isinstance(control, StartRunRequest):
                conn.execute(insert(runs).values(control.values))
                self._run_id = control.values["id"]
                self._origins[control.values["id"]] = float(control.values["started_at"])
            elif isinstance(control, ResumeRunRequest):
                self._write_resume(conn, control)
            elif isinstance(control, FinishRequest):
                self._write_finish(conn, control)
            if self._run_id is not None:
                self._beat(conn, self._run_id)
        self._last_commit = self._last_heartbeat = time.monotonic()

    def _beat(self, conn: Connection, run_id: str) -> None:
        # A row deleted under a live run (``psctl runs rm --force``) fails no insert while the
        # run is quiet; without this the run would go on unrecorded and never end.
        now = time.time()
        if conn.execute(update(runs).where(runs.c.id == run_id).values(heartbeat_at=now)).rowcount:
            return
        raise StoreError(f"run {run_id} is no longer in the database (deleted while it ran?)")

    def _write_pending(self, conn: Connection) -> None:
        for run_id, rows in self._iterations.items():
            self._write_iterations(conn, run_id, rows)
        self._iterations = {}
        for name, table in (("evaluations", evaluations), ("events", events),
                            ("process_samples", process_samples)):
            if self._rows[name]:
                conn.execute(insert(table), self._rows[name])
                self._rows[name] = []
        for name, table in (("layer_iterations", layer_iterations),
                            ("user_metrics", user_metrics)):
            if self._rows[name]:  # a retried report is skipped, as iterations are
                conn.execute(sqlite_insert(table).on_conflict_do_nothing(), self._rows[name])
                self._rows[name] = []
        for values in self._rows["syncs"]:  # in order: a completion updates its decision
            conn.execute(_upsert_sync(values))
        self._rows["syncs"] = []

    def _write_iterations(self, conn: Connection, run_id: str, rows: list[tuple[Any, ...]]) -> None:
        # A worker that retries a report must not kill the writer: duplicates are skipped, counted.
        inserted = conn.exec_driver_sql(_INSERT_ITERATIONS_SQL, rows).rowcount
        if inserted < len(rows):
            self._record_duplicates(conn, run_id, len(rows) - inserted)
        self._rebuild_rollups(conn, run_id, rows)
        conn.execute(
            update(runs)
            .where(runs.c.id == run_id)
            .values(iteration_count=runs.c.iteration_count + inserted)
        )

    def _rebuild_rollups(self, conn: Connection, run_id: str, rows: list[tuple[Any, ...]]) -> None:
        origin = self._origins.get(run_id)
        if origin is None:
            origin = conn.execute(select(runs.c.started_at).where(runs.c.id == run_id)).scalar()
            if origin is None:
                return  # no such run: the insert above already failed on the foreign key
            self._origins[run_id] = origin = float(origin)
        slots = [int((row[_ENDED_AT] - origin) * _SLOTS_PER_S) for row in rows]
        conn.exec_driver_sql(REBUILD_ROLLUPS_SQL, {"run": run_id, "origin": origin,
                                                  "lo": min(slots), "hi": max(slots)})

    def _record_duplicates(self, conn: Connection, run_id: str, count: int) -> None:
        log.warning("run %s: ignored %d duplicate iteration row(s)", run_id, count)
        detail = json.dumps({"count": count})
        values = {"run_id": run_id, "at": time.time(), "kind": DUPLICATE_EVENT, "detail": detail}
        conn.execute(insert(events).values(values))

    def _write_resume(self, conn: Connection, message: ResumeRunRequest) -> None:
        changed = conn.execute(
            update(runs).where(runs.c.id == message.run_id)
            .values(status="running", reason=None, ended_at=None,
                    heartbeat_at=message.heartbeat_at)).rowcount
        if not changed:
            raise StoreError(f"run {message.run_id} is not in the database: nothing to resume")
        self._run_id = message.run_id

    def _write_finish(self, conn: Connection, message: FinishRequest) -> None:
        changed = conn.execute(
            update(runs)
            .where(runs.c.id == message.run_id)
            .values(
                status=message.status,
                reason=message.reason,
                ended_at=message.ended_at,
                heartbeat_at=message.ended_at,
            )
        ).rowcount
        self._run_id = None
        if not changed:
            raise StoreError(f"run {message.run_id} is no longer in the database, so its end "
                             f"({message.status}) could not be recorded")
