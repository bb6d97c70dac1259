"""Opening the experiments database: schema creation, version check, readonly mode, errors."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import inspect, select, text
from sqlalchemy.exc import OperationalError

from engine.db.schema import SCHEMA_VERSION, meta, open_engine, runs, translate_errors
from engine.errors import StoreError

TABLES = {"runs", "iterations", "evaluations", "events", "tags", "meta", "syncs",
          "iteration_rollups", "process_samples", "layer_iterations", "user_metrics"}


def _run_values(run_id: str = "a" * 32) -> dict[str, object]:
    return {
        "id": run_id,
        "name": "n",
        "status": "running",
        "started_at": 1.0,
        "heartbeat_at": 1.0,
        "config_json": "{}",
        "sync": "async",
        "workers": 1,
        "servers": 1,
        "dataset": "mnist",
    }


def test_creates_every_table_and_records_the_schema_version(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "sub" / "experiments.db")
    try:
        assert set(inspect(engine).get_table_names()) == TABLES
        with engine.connect() as conn:
            version = conn.execute(select(meta.c.value).where(meta.c.key == "schema_version"))
            assert version.scalar() == str(SCHEMA_VERSION)
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 5000
    finally:
        engine.dispose()


def test_indexes_the_queries_need_exist(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "x.db")
    try:
        names = {ix["name"] for t in TABLES for ix in inspect(engine).get_indexes(t)}
        assert {"ix_runs_started_at", "ix_iterations_run_ended", "ix_events_run_kind"} <= names
    finally:
        engine.dispose()


def test_reopening_keeps_data_and_version(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    engine = open_engine(path)
    with engine.begin() as conn:
        conn.execute(runs.insert().values(_run_values()))
    engine.dispose()
    engine = open_engine(path)
    try:
        with engine.connect() as conn:
            assert conn.execute(select(runs.c.id)).scalar() == "a" * 32
            assert conn.execute(select(meta.c.value)).all() == [(str(SCHEMA_VERSION),)]
    finally:
        engine.dispose()


@pytest.mark.parametrize("readonly", [False, True])
def test_newer_schema_version_is_refused(tmp_path: Path, readonly: bool) -> None:
    path = tmp_path / "x.db"
    open_engine(path).dispose()
    with sqlite3.connect(path) as raw:
        raw.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (SCHEMA_VERSION + 1,))
    raw.close()
    with pytest.raises(StoreError, match="newer psctl"):
        open_engine(path, readonly=readonly)


def test_file_that_is_not_a_database_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    path.write_bytes(b"this is certainly not an SQLite database file" * 100)
    with pytest.raises(StoreError, match="not a database"):
        open_engine(path)
    with pytest.raises(StoreError, match="not a database"):
        open_engine(path, readonly=True)


def test_missing_database_in_readonly_mode_says_where_to_look(tmp_path: Path) -> None:
    path = tmp_path / "nowhere" / "experiments.db"
    with pytest.raises(StoreError) as info:
        open_engine(path, readonly=True)
    message = str(info.value)
    assert "No runs have been recorded yet" in message
    assert str(path) in message and "--db" in message and "PSCTL_DB" in message
    assert not path.exists() and not path.parent.exists()


def test_readonly_sqlite_file_without_psctl_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as raw:
        raw.execute("CREATE TABLE t (x)")
    raw.close()
    with pytest.raises(StoreError, match="not a psctl experiments database"):
        open_engine(path, readonly=True)


def test_readonly_engine_cannot_write(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    open_engine(path).dispose()
    engine = open_engine(path, readonly=True)
    try:
        with pytest.raises(OperationalError, match="readonly"), engine.begin() as conn:
            conn.execute(runs.insert().values(_run_values()))
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM runs")).scalar() == 0
    finally:
        engine.dispose()


def test_paths_with_uri_special_characters_work(tmp_path: Path) -> None:
    path = tmp_path / "dir with space #1" / "exp?x=1%20.db"
    open_engine(path).dispose()
    engine = open_engine(path, readonly=True)
    try:
        assert path.is_file()
        assert set(inspect(engine).get_table_names()) == TABLES
    finally:
        engine.dispose()


def test_a_version_1_database_is_migrated_by_a_writer(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        conn.execute("INSERT INTO meta VALUES ('schema_version', '1')")
        conn.execute("CREATE TABLE iterations (run_id TEXT, worker INTEGER, iteration INTEGER, "
                     "PRIMARY KEY (run_id, worker, iteration)) WITHOUT ROWID")
    with pytest.raises(StoreError, match="upgraded by a writer"):
        open_engine(path, readonly=True)
    engine = open_engine(path)
    try:
        columns = {c["name"] for c in inspect(engine).get_columns("iterations")}
        assert {"pushed_at", "acked_at"} <= columns
        assert "syncs" in inspect(engine).get_table_names()
    finally:
        engine.dispose()
    open_engine(path, readonly=True).dispose()


def test_a_version_2_database_gains_process_samples(tmp_path: Path) -> None:
    path = tmp_path / "v2.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        conn.execute("INSERT INTO meta VALUES ('schema_version', '2')")
    with pytest.raises(StoreError, match="upgraded by a writer"):
        open_engine(path, readonly=True)
    open_engine(path).dispose()
    engine = open_engine(path, readonly=True)
    try:
        assert "process_samples" in inspect(engine).get_table_names()
        with engine.connect() as conn:
            version = conn.execute(select(meta.c.value).where(meta.c.key == "schema_version"))
            assert version.scalar() == str(SCHEMA_VERSION)
    finally:
        engine.dispose()


def test_a_version_3_database_gains_runs_notes(tmp_path: Path) -> None:
    path = tmp_path / "v3.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        conn.execute("INSERT INTO meta VALUES ('schema_version', '3')")
        conn.execute("CREATE TABLE runs (id TEXT PRIMARY KEY, name TEXT NOT NULL)")
        conn.execute("INSERT INTO runs VALUES ('r1', 'kept')")
    with pytest.raises(StoreError, match="upgraded by a writer"):
        open_engine(path, readonly=True)
    open_engine(path).dispose()
    engine = open_engine(path, readonly=True)
    try:
        assert "notes" in {c["name"] for c in inspect(engine).get_columns("runs")}
        with engine.connect() as conn:
            row = conn.execute(text("SELECT name, notes FROM runs")).one()
            assert tuple(row) == ("kept", None)
            version = conn.execute(select(meta.c.value).where(meta.c.key == "schema_version"))
            assert version.scalar() == str(SCHEMA_VERSION)
    finally:
        engine.dispose()


def test_a_version_4_database_gains_the_applied_lr_scale(tmp_path: Path) -> None:
    path = tmp_path / "v4.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        conn.execute("INSERT INTO meta VALUES ('schema_version', '4')")
        conn.execute("CREATE TABLE iterations (run_id TEXT, worker INTEGER, iteration INTEGER, "
                     "staleness INTEGER)")
        conn.execute("INSERT INTO iterations VALUES ('r1', 0, 7, 2)")
        conn.execute("CREATE TABLE iteration_rollups (run_id TEXT, worker INTEGER, slot INTEGER)")
    with pytest.raises(StoreError, match="upgraded by a writer"):
        open_engine(path, readonly=True)
    open_engine(path).dispose()
    engine = open_engine(path, readonly=True)
    try:
        columns = {c["name"] for c in inspect(engine).get_columns("iterations")}
        rollups = {c["name"] for c in inspect(engine).get_columns("iteration_rollups")}
        assert {"lr_scale", "push_bytes", "push_bytes_dense"} <= columns
        assert {"lr_min", "lr_max", "push_bytes", "push_bytes_dense"} <= rollups
        assert "layer_iterations" in inspect(engine).get_table_names()
        with engine.connect() as conn:
            row = conn.execute(text("SELECT iteration, staleness, lr_scale FROM iterations")).one()
            assert tuple(row) == (7, 2, None)
            version = conn.execute(select(meta.c.value).where(meta.c.key == "schema_version"))
            assert version.scalar() == str(SCHEMA_VERSION)
    finally:
        engine.dispose()


def test_a_version_5_database_gains_the_bytes_a_cache_saved(tmp_path: Path) -> None:
    path = tmp_path / "v5.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
        conn.execute("INSERT INTO meta VALUES ('schema_version', '5')")
        conn.execute("CREATE TABLE iterations (run_id TEXT, worker INTEGER, iteration INTEGER)")
        conn.execute("INSERT INTO iterations VALUES ('r1', 0, 7)")
        conn.execute("CREATE TABLE iteration_rollups (run_id TEXT, worker INTEGER, slot INTEGER)")
    open_engine(path).dispose()
    engine = open_engine(path, readonly=True)
    try:
        for table in ("iterations", "iteration_rollups"):
            assert "pull_bytes_saved" in {c["name"] for c in inspect(engine).get_columns(table)}
        with engine.connect() as conn:
            row = conn.execute(text("SELECT iteration, pull_bytes_saved FROM iterations")).one()
            assert tuple(row) == (7, None)
            version = conn.execute(select(meta.c.value).where(meta.c.key == "schema_version"))
            assert version.scalar() == str(SCHEMA_VERSION)
    finally:
        engine.dispose()


def test_a_version_6_database_gains_the_users_own_metrics(tmp_path: Path) -> None:
    path = tmp_path / "v6.db"
    open_engine(path).dispose()
    with sqlite3.connect(path) as conn:  # as version 6 left it: no user_metrics
        conn.execute("DROP TABLE user_metrics")
        conn.execute("UPDATE meta SET value = '6' WHERE key = 'schema_version'")
        conn.execute("INSERT INTO runs (id, name, status, started_at, heartbeat_at, config_json, "
                     "sync, workers, servers, dataset) VALUES ('r1', 'n', 'finished', 1, 1, "
                     "'{}', 'bsp', 1, 1, 'digits')")
    with pytest.raises(StoreError, match="upgraded by a writer"):
        open_engine(path, readonly=True)
    open_engine(path).dispose()
    engine = open_engine(path, readonly=True)
    try:
        assert "user_metrics" in inspect(engine).get_table_names()
        with engine.connect() as conn:
            assert conn.execute(text("SELECT id FROM runs")).scalar() == "r1"
            assert conn.execute(text("SELECT count(*) FROM user_metrics")).scalar() == 0
            version = conn.execute(select(meta.c.value).where(meta.c.key == "schema_version"))
            assert version.scalar() == str(SCHEMA_VERSION)
    finally:
        engine.dispose()


def _version_7_process_samples(conn: sqlite3.Connection) -> None:
    """process_samples as schema version 7 made it (no pss_bytes), with one run's row."""
    conn.execute("DROP TABLE process_samples")
    conn.execute("CREATE TABLE process_samples (run_id TEXT NOT NULL REFERENCES runs (id) "
                 "ON DELETE CASCADE, at REAL NOT NULL, role TEXT NOT NULL, rank INTEGER NOT "
                 "NULL, pid INTEGER NOT NULL, cpu_percent REAL NOT NULL, rss_bytes INTEGER NOT "
                 "NULL)")
    conn.execute("CREATE INDEX ix_process_samples_run_at ON process_samples (run_id, at)")
    conn.execute("UPDATE meta SET value = '7' WHERE key = 'schema_version'")
    conn.execute("INSERT INTO runs (id, name, status, started_at, heartbeat_at, config_json, "
                 "sync, workers, servers, dataset) VALUES ('r1', 'n', 'finished', 1, 1, "
                 "'{}', 'bsp', 1, 1, 'digits')")
    conn.execute("INSERT INTO process_samples VALUES ('r1', 2.0, 'worker', 0, 42, 50.0, 1000)")


def test_a_version_7_database_gains_proportional_memory(tmp_path: Path) -> None:
    path = tmp_path / "v7.db"
    open_engine(path).dispose()
    with sqlite3.connect(path) as conn:
        _version_7_process_samples(conn)
    conn.close()
    with pytest.raises(StoreError, match="upgraded by a writer"):
        open_engine(path, readonly=True)
    open_engine(path).dispose()
    engine = open_engine(path, readonly=True)
    try:
        columns = {c["name"]: c for c in inspect(engine).get_columns("process_samples")}
        assert columns["pss_bytes"]["nullable"] and str(columns["pss_bytes"]["type"]) == "INTEGER"
        with engine.connect() as conn:
            row = conn.execute(text("SELECT pid, rss_bytes, pss_bytes FROM process_samples"))
            assert tuple(row.one()) == (42, 1000, None)  # an old row: no PSS was read
            version = conn.execute(select(meta.c.value).where(meta.c.key == "schema_version"))
            assert version.scalar() == "8" == str(SCHEMA_VERSION)
    finally:
        engine.dispose()
    open_engine(path).dispose()  # a second writer finds the column there: nothing to add
    with sqlite3.connect(path) as conn:
        names = [row[1] for row in conn.execute("PRAGMA table_info(process_samples)")]
    conn.close()
    assert names.count("pss_bytes") == 1


def test_user_metrics_keep_one_value_per_process_iteration_and_name(tmp_path: Path) -> None:
    engine = open_engine(tmp_path / "x.db")
    try:
        with engine.begin() as conn:
            conn.execute(runs.insert().values(_run_values()))
            insert = ("INSERT INTO user_metrics (run_id, name, role, rank, iteration, at, value) "
                      "VALUES (:run, 'g', :role, 0, 3, 1.0, 2.0)")
            conn.execute(text(insert), {"run": "a" * 32, "role": "worker"})
            conn.execute(text(insert), {"run": "a" * 32, "role": "evaluator"})
        for role in ("worker", "server"):  # the same key again; a role psctl.log never has
            with pytest.raises(StoreError), translate_errors("inserting"), engine.begin() as conn:
                conn.execute(text(insert), {"run": "a" * 32, "role": role})
        with engine.begin() as conn:
            conn.execute(runs.delete())
            assert conn.execute(text("SELECT count(*) FROM user_metrics")).scalar() == 0
    finally:
        engine.dispose()
