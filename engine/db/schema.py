"""The experiments database: tables, and how to open it.

SQLite in WAL mode so that the recorder (the only writer) and any number of readers (CLI,
dashboard, live progress display) work on the same file at once without blocking each other.
Every foreign error raised while opening or using the database is translated into
:class:`~engine.errors.StoreError` by :func:`translate_errors`.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from sqlalchemy import (
    REAL,
    CheckConstraint,
    Column,
    Connection,
    Engine,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    create_engine,
    event,
    select,
)
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import QueuePool

from engine.errors import StoreError

SCHEMA_VERSION = 8
BUSY_TIMEOUT_S = 5.0
DB_ENV_VAR = "PSCTL_DB"

STORED_STATUSES = ("running", "finished", "failed", "interrupted")

metadata = MetaData()


def _run_fk() -> ForeignKey:
    return ForeignKey("runs.id", ondelete="CASCADE")


runs = Table(
    "runs",
    metadata,
    Column("id", Text, primary_key=True),
    Column("name", Text, nullable=False),
    Column("status", Text, nullable=False),
    Column("reason", Text),
    Column("started_at", REAL, nullable=False),
    Column("ended_at", REAL),
    Column("heartbeat_at", REAL, nullable=False),
    Column("config_json", Text, nullable=False),
    Column("sync", Text, nullable=False),
    Column("workers", Integer, nullable=False),
    Column("servers", Integer, nullable=False),
    Column("dataset", Text, nullable=False),
    # Maintained by the recorder in the same transaction as the rows it counts, so listing many
    # runs never has to count millions of iteration rows.
    Column("iteration_count", Integer, nullable=False, server_default="0"),
    # Free text a person writes about a run from the dashboard; the recorder never sets it.
    Column("notes", Text),
    CheckConstraint(
        "status IN ('running', 'finished', 'failed', 'interrupted')", name="ck_runs_status"
    ),
    Index("ix_runs_started_at", "started_at"),
    Index("ix_runs_name", "name"),
)

# WITHOUT ROWID clusters the rows by (run, worker, iteration): per-worker aggregates over one run
# read a contiguous range instead of hopping through the table.
iterations = Table(
    "iterations",
    metadata,
    Column("run_id", Text, _run_fk(), primary_key=True),
    Column("worker", Integer, primary_key=True),
    Column("iteration", Integer, primary_key=True),
    Column("epoch", Integer, nullable=False),
    Column("started_at", REAL, nullable=False),
    Column("ended_at", REAL, nullable=False),
    Column("compute_s", REAL, nullable=False),
    Column("push_s", REAL, nullable=False),
    Column("pull_s", REAL, nullable=False),
    Column("wait_s", REAL, nullable=False),
    Column("staleness", Integer, nullable=False),
    Column("loss", REAL),
    Column("samples", Integer, nullable=False),
    Column("bytes_sent", Integer, nullable=False),
    Column("bytes_received", Integer, nullable=False),
    # When the gradient left the worker and when the servers acknowledged it (wall clock). With
    # wait_s these are what ElasticBSP predicts from, so any prediction can be recomputed offline.
    Column("pushed_at", REAL),
    Column("acked_at", REAL),
    # The multiplier the servers applied the pushed gradient with: the aggregator's weight times
    # the learning-rate schedule's and the staleness rule's factors (NULL: nothing pushed).
    Column("lr_scale", REAL),
    # The push frames' bytes (part of bytes_sent), and the same pushes as dense float32 frames:
    # what the worker's push filter saved (equal without one).
    Column("push_bytes", Integer),
    Column("push_bytes_dense", Integer),
    # The bytes a read answered from the worker's own cache (SSP, DSSP) did not move.
    Column("pull_bytes_saved", Integer),
    # The live progress display counts the iterations of the last few seconds.
    Index("ix_iterations_run_ended", "run_id", "ended_at"),
    sqlite_with_rowid=False,
)

# The scheduled worker loop's requests, one row per layer per iteration (schema 5): the order
# each layer was pulled and pushed in, how long its pull was held back, its push's staleness.
layer_iterations = Table(
    "layer_iterations",
    metadata,
    Column("run_id", Text, _run_fk(), primary_key=True),
    Column("worker", Integer, primary_key=True),
    Column("iteration", Integer, primary_key=True),
    Column("layer", Integer, primary_key=True),
    Column("pull_order", Integer, nullable=False),
    Column("push_order", Integer, nullable=False),
    Column("suspend_s", REAL, nullable=False),
    Column("staleness", Integer, nullable=False),
    sqlite_with_rowid=False,
)

# Per (run, worker, ROLLUP_WIDTH_S slot since the run started): what the dashboard charts, summed
# so that a page over a million iterations reads tens of thousands of rows instead. Rebuilt by
# the recorder from the iterations rows in the same transaction that inserts them, so it always
# agrees with them; runs recorded before it existed have none, and readers then aggregate the
# iterations. The slot is the dashboard's narrowest bucket, so every bucket width it picks
# (0.5, 1, 2, 5 s...) is a whole number of slots.
ROLLUP_WIDTH_S = 0.25
iteration_rollups = Table(
    "iteration_rollups",
    metadata,
    Column("run_id", Text, _run_fk(), primary_key=True),
    Column("worker", Integer, primary_key=True),
    Column("slot", Integer, primary_key=True),  # floor((ended_at - started_at) / width)
    Column("n", Integer, nullable=False),
    Column("last_ended_at", REAL, nullable=False),
    Column("last_iteration", Integer, nullable=False),
    Column("samples", Integer, nullable=False),
    Column("compute_s", REAL, nullable=False),
    Column("push_s", REAL, nullable=False),
    Column("pull_s", REAL, nullable=False),
    Column("wait_s", REAL, nullable=False),
    Column("staleness_min", Integer, nullable=False),
    Column("staleness_max", Integer, nullable=False),
    Column("loss_min", REAL),
    Column("loss_max", REAL),
    Column("bytes_sent", Integer, nullable=False),
    Column("bytes_received", Integer, nullable=False),
    Column("lr_min", REAL),
    Column("lr_max", REAL),
    Column("push_bytes", Integer),
    Column("push_bytes_dense", Integer),
    Column("pull_bytes_saved", Integer),
    sqlite_with_rowid=False,
)

evaluations = Table(
    "evaluations",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", Text, _run_fk(), nullable=False),
    Column("at", REAL, nullable=False),
    Column("elapsed_s", REAL, nullable=False),
    Column("step", Integer, nullable=False),
    Column("epoch", REAL, nullable=False),
    Column("accuracy", REAL, nullable=False),
    Column("loss", REAL, nullable=False),
    Index("ix_evaluations_run_at", "run_id", "at"),
)

events = Table(
    "events",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", Text, _run_fk(), nullable=False),
    Column("at", REAL, nullable=False),
    Column("kind", Text, nullable=False),
    Column("detail", Text, nullable=False),
    Index("ix_events_run_at", "run_id", "at"),
    Index("ix_events_run_kind", "run_id", "kind"),
)

# One row per ElasticBSP barrier: what was predicted and chosen when it was decided, and what
# happened when every worker reached it (actual_* stay NULL for a barrier the run never reached).
syncs = Table(
    "syncs",
    metadata,
    Column("run_id", Text, _run_fk(), primary_key=True),
    Column("sync_index", Integer, primary_key=True),
    Column("decided_at", REAL, nullable=False),
    Column("predictor", Text, nullable=False),
    Column("lookahead", Integer, nullable=False),
    Column("base_clocks", Text, nullable=False),  # JSON [n]: each worker's last clock before it
    Column("predicted", Text, nullable=False),  # JSON [n][<=16]: predicted end times (unix s)
    Column("chosen", Text, nullable=False),  # JSON [n]: r_i, the chosen future iteration index
    Column("barrier_clocks", Text, nullable=False),  # JSON [n]: the clock each worker stops after
    Column("predicted_wait", REAL, nullable=False),  # d: predicted spread of arrivals (s)
    Column("arrivals", Text),  # JSON [n]: when each worker pushed its barrier clock (unix s)
    Column("actual_wait", REAL),  # the observed spread: max - min of arrivals (s)
    Column("released_at", REAL),
    sqlite_with_rowid=False,
)

tags = Table(
    "tags",
    metadata,
    Column("run_id", Text, _run_fk(), primary_key=True),
    Column("key", Text, primary_key=True),
    Column("value", Text, nullable=False),
)

# Every second, each process of the run: CPU (percent of one core), resident memory and, for a
# few processes in turn, proportional memory.
process_samples = Table(
    "process_samples",
    metadata,
    Column("run_id", Text, _run_fk(), nullable=False),
    Column("at", REAL, nullable=False),
    Column("role", Text, nullable=False),
    Column("rank", Integer, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("cpu_percent", REAL, nullable=False),
    Column("rss_bytes", Integer, nullable=False),
    # Proportional memory (schema 8): shared pages split among their sharers. Read for a few
    # processes per sample in turn, so NULL in most rows of a large run (and in older runs).
    Column("pss_bytes", Integer),
    Index("ix_process_samples_run_at", "run_id", "at"),
)

# What the user's own code logged with psctl.log (schema 7): per process and iteration (a
# worker's) or evaluation step (the evaluator's), the mean of the values logged under a name.
# Clustered by name so that one metric's series is a contiguous read.
user_metrics = Table(
    "user_metrics",
    metadata,
    Column("run_id", Text, _run_fk(), primary_key=True),
    Column("name", Text, primary_key=True),
    Column("role", Text, primary_key=True),
    Column("rank", Integer, primary_key=True),
    Column("iteration", Integer, primary_key=True),
    Column("at", REAL, nullable=False),
    Column("value", REAL, nullable=False),
    CheckConstraint("role IN ('worker', 'evaluator')", name="ck_user_metrics_role"),
    sqlite_with_rowid=False,
)

meta = Table(
    "meta",
    metadata,
    Column("key", Text, primary_key=True),
    Column("value", Text, nullable=False),
)


@contextmanager
def translate_errors(action: str) -> Iterator[None]:
    """Re-raise SQLAlchemy and sqlite3 errors as StoreError, naming what was being done."""
    try:
        yield
    except (SQLAlchemyError, sqlite3.Error) as exc:
        cause = getattr(exc, "orig", None) or exc
        raise StoreError(f"{action} failed: {cause}") from exc


def missing_database_message(path: Path) -> str:
    return (
        f"No runs have been recorded yet: there is no experiments database at {path}. "
        f"Launch a run first, or point psctl at another database with --db PATH or the "
        f"{DB_ENV_VAR} environment variable."
    )


def open_engine(path: Path, *, readonly: bool = False) -> Engine:
    """Open (and, unless readonly, create) the experiments database at ``path``.

    A readonly engine opens the file with ``mode=ro`` so the CLI and dashboard can never write.
    A writable engine is meant for the recorder only: its transactions take the write lock at
    BEGIN (``BEGIN IMMEDIATE``) so a busy database waits for the busy timeout instead of failing
    on a lock upgrade.
    """
    path = Path(path).expanduser()
    if readonly and not path.is_file():
        raise StoreError(missing_database_message(path))
    if not readonly:
        with translate_errors(f"creating the directory of {path}"):
            path.parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(
        "sqlite+pysqlite://",
        creator=lambda: _connect(path, readonly=readonly),
        poolclass=QueuePool,
    )
    _install_hooks(engine, readonly=readonly)
    try:
        with translate_errors(f"opening the experiments database {path}"):
            _prepare(engine, path, readonly=readonly)
    except BaseException:
        engine.dispose()
        raise
    return engine


def _connect(path: Path, *, readonly: bool) -> sqlite3.Connection:
    uri = f"file:{quote(str(path.resolve()))}" + ("?mode=ro" if readonly else "")
    # The pool hands connections to whichever thread asks; each is used by one thread at a time.
    return sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S, check_same_thread=False)


def _install_hooks(engine: Engine, *, readonly: bool) -> None:
    begin_sql = "BEGIN" if readonly else "BEGIN IMMEDIATE"

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: sqlite3.Connection, _record: Any) -> None:
        # pysqlite's own implicit transactions are bypassed; SQLAlchemy's begin emits BEGIN.
        dbapi_conn.isolation_level = None
        cursor = dbapi_conn.cursor()
        if not readonly:
            cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql(begin_sql)


def _prepare(engine: Engine, path: Path, *, readonly: bool) -> None:
    with engine.begin() as conn:
        if not readonly:
            metadata.create_all(conn)
        version = _stored_version(conn, path)
        if version is None and not readonly:
            conn.execute(meta.insert().values(key="schema_version", value=str(SCHEMA_VERSION)))
            version = SCHEMA_VERSION
        if version == 1 and not readonly:
            version = _migrate_from_1(conn)
        if version == 2 and not readonly:
            version = _migrate_from_2(conn)
        if version == 3 and not readonly:
            version = _migrate_from_3(conn)
        if version == 4 and not readonly:
            version = _migrate_from_4(conn)
        if version == 5 and not readonly:
            version = _migrate_from_5(conn)
        if version == 6 and not readonly:
            version = _migrate_from_6(conn)
        if version == 7 and not readonly:
            version = _migrate_from_7(conn)
    _check_version(version, path)


def _migrate_from_1(conn: Connection) -> int:
    """Version 2 added the push timestamps to iterations (create_all already added syncs)."""
    for column in ("pushed_at", "acked_at"):
        conn.exec_driver_sql(f"ALTER TABLE iterations ADD COLUMN {column} REAL")
    conn.execute(meta.update().where(meta.c.key == "schema_version").values(value="2"))
    return 2


def _migrate_from_2(conn: Connection) -> int:
    """Version 3 added process_samples, which create_all has just made."""
    conn.execute(meta.update().where(meta.c.key == "schema_version").values(value="3"))
    return 3


def _migrate_from_3(conn: Connection) -> int:
    """Version 4 added runs.notes; create_all does not alter a table that already exists."""
    columns = {row[1] for row in conn.exec_driver_sql("PRAGMA table_info(runs)")}
    if "notes" not in columns:
        conn.exec_driver_sql("ALTER TABLE runs ADD COLUMN notes TEXT")
    conn.execute(meta.update().where(meta.c.key == "schema_version").values(value="4"))
    return 4


def _migrate_from_4(conn: Connection) -> int:
    """Version 5 added the applied learning-rate scale and the push bytes before and after the
    push filter to iterations and their rollups (create_all has made layer_iterations)."""
    for table, names in (("iterations", ("lr_scale", "push_bytes", "push_bytes_dense")),
                         ("iteration_rollups", ("lr_min", "lr_max", "push_bytes",
                                                "push_bytes_dense"))):
        columns = {row[1] for row in conn.exec_driver_sql(f"PRAGMA table_info({table})")}
        for name in names:
            if name not in columns:
                kind = "INTEGER" if name.startswith("push_bytes") else "REAL"
                conn.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")
    conn.execute(meta.update().where(meta.c.key == "schema_version").values(value="5"))
    return 5


def _migrate_from_5(conn: Connection) -> int:
    """Version 6 added the bytes reads from a worker's cache saved to iterations and their
    rollups."""
    for table in ("iterations", "iteration_rollups"):
        columns = {row[1] for row in conn.exec_driver_sql(f"PRAGMA table_info({table})")}
        if "pull_bytes_saved" not in columns:
            conn.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN pull_bytes_saved INTEGER")
    conn.execute(meta.update().where(meta.c.key == "schema_version").values(value="6"))
    return 6


def _migrate_from_6(conn: Connection) -> int:
    """Version 7 added user_metrics (psctl.log's values), which create_all has just made."""
    conn.execute(meta.update().where(meta.c.key == "schema_version").values(value="7"))
    return 7


def _migrate_from_7(conn: Connection) -> int:
    """Version 8 added process_samples.pss_bytes (proportional memory); older rows keep NULL."""
    columns = {row[1] for row in conn.exec_driver_sql("PRAGMA table_info(process_samples)")}
    if "pss_bytes" not in columns:
        conn.exec_driver_sql("ALTER TABLE process_samples ADD COLUMN pss_bytes INTEGER")
    conn.execute(meta.update().where(meta.c.key == "schema_version").values(value="8"))
    return 8


def _stored_version(conn: Connection, path: Path) -> int | None:
    has_meta = conn.exec_driver_sql(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'"
    ).first()
    if has_meta is None:
        return None
    value = conn.execute(select(meta.c.value).where(meta.c.key == "schema_version")).scalar()
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise StoreError(f"{path} has a corrupt schema_version {value!r}") from None


def _check_version(version: int | None, path: Path) -> None:
    if version is None:
        raise StoreError(f"{path} is not a psctl experiments database (it has no schema version)")
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{path} was written by a newer psctl (schema version {version}; this psctl reads up "
            f"to {SCHEMA_VERSION}). Upgrade psctl, or point it at another database with --db "
            f"PATH or {DB_ENV_VAR}."
        )
    if version < SCHEMA_VERSION:
        raise StoreError(
            f"{path} has schema version {version}, older than {SCHEMA_VERSION}, and can only be "
            f"upgraded by a writer (psctl launch). Or point psctl at another database with "
            f"--db PATH or {DB_ENV_VAR}."
        )


def parse_json(text: str) -> dict[str, Any]:
    """A JSON column's object (a bare value comes back as ``{"value": ...}``); corrupt JSON is
    the database's fault, said as a :class:`StoreError`."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise StoreError(f"corrupt JSON in the experiments database: {exc}") from exc
    return value if isinstance(value, dict) else {"value": value}
