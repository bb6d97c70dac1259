"""Downsampling and live deltas over a database written here directly (a test fixture)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from engine.db import open_engine, series
from engine.recorder import REBUILD_ROLLUPS_SQL
from webui import live

RUN = "ab" * 16
T0 = 1000.0


def _insert(db: Path, worker: int, iterations: range, staleness: int = 0) -> None:
    with sqlite3.connect(db) as conn:
        conn.executemany(
            "INSERT INTO iterations (run_id, worker, iteration, epoch, started_at, ended_at, "
            "compute_s, push_s, pull_s, wait_s, staleness, loss, samples, bytes_sent, "
            "bytes_received) VALUES (?, ?, ?, 0, ?, ?, 0.05, 0.02, 0.02, 0.01, ?, ?, 8, 100, 100)",
            [(RUN, worker, i, T0 + 0.1 * i, T0 + 0.1 * (i + 1), staleness + i % 3, 1.0 / (i + 1))
             for i in iterations])
        conn.execute("UPDATE runs SET iteration_count = (SELECT count(*) FROM iterations)")


@pytest.fixture()
def db(tmp_path: Path) -> Path:
    path = tmp_path / "experiments.db"
    open_engine(path).dispose()
    with sqlite3.connect(path) as conn:
        conn.execute("INSERT INTO runs (id, name, status, started_at, heartbeat_at, config_json, "
                     "sync, workers, servers, dataset) VALUES (?, 'r', 'running', ?, 9e9, '{}', "
                     "'asp', 2, 1, 'digits')", (RUN, T0))
    _insert(path, 0, range(100))
    _insert(path, 1, range(50), staleness=1)
    return path


def test_choose_width_is_round_and_bounded() -> None:
    assert series.choose_width(1000.0, 1000) == 1.0
    assert series.choose_width(3000.0, 1000) == 5.0
    assert series.MIN_WIDTH_S <= series.choose_width(1.0, 1000) <= 2 * series.MIN_WIDTH_S


def test_buckets_partition_rows_and_keep_extremes(db: Path) -> None:
    engine = open_engine(db, readonly=True)
    buckets = series.iteration_buckets(engine, RUN, width=1.0)
    f = {name: i for i, name in enumerate(series.BUCKET_FIELDS)}
    assert sum(r[f["n"]] for r in buckets.rows) == buckets.total_rows == 150
    assert max(r[f["st_max"]] for r in buckets.rows) == 3
    assert min(r[f["loss_min"]] for r in buckets.rows) == pytest.approx(1 / 100)
    tail = series.iteration_buckets(engine, RUN, width=1.0, since=T0 + 8.5)
    assert {r[f["b"]] for r in tail.rows} == {8, 9, 10}


def test_new_rows_and_histogram_are_exact(db: Path) -> None:
    engine = open_engine(db, readonly=True)
    cursors = series.worker_cursors(engine, RUN, 2)
    assert cursors == {0: 99, 1: 49}
    before = series.staleness_histogram(engine, RUN, upto=cursors)
    _insert(db, 1, range(50, 60), staleness=1)
    fresh = series.new_rows(engine, RUN, 2, cursors)
    assert fresh.cursors == {0: 99, 1: 59}
    assert fresh.first_ended_at == pytest.approx(T0 + 5.1)
    added = sum(n for _, _, n in fresh.staleness)
    assert added == 10
    assert sum(n for *_, n in before) + added == sum(
        n for *_, n in series.staleness_histogram(engine, RUN))


def test_live_delta_carries_only_the_changed_buckets(db: Path) -> None:
    engine = open_engine(db, readonly=True)
    message, state = live.snapshot(engine, RUN)
    assert message["total_rows"] == 150 and live.delta(engine, state) is None
    _insert(db, 1, range(50, 60), staleness=1)
    change = live.delta(engine, state)
    assert change is not None and change["total_rows"] == 160
    assert change["from_bucket"] == int(5.1 / state.width)
    assert all(r[1] >= change["from_bucket"] for r in change["records"])
    assert sum(n for *_, n in change["staleness"]) == 10


def _roll_up(db: Path) -> None:
    """What the recorder does after each insert, here over the whole fixture run."""
    with sqlite3.connect(db) as conn:
        conn.execute(REBUILD_ROLLUPS_SQL, {"run": RUN, "origin": T0, "lo": 0, "hi": 10**6})


@pytest.mark.parametrize("width", [0.5, 1.0, 2.0])
def test_rollups_give_the_buckets_of_the_rows(db: Path, tmp_path: Path, width: float) -> None:
    raw_engine = open_engine(db, readonly=True)
    raw = series.iteration_buckets(raw_engine, RUN, width=width)
    rolled_db = tmp_path / "rolled.db"
    with sqlite3.connect(db) as src, sqlite3.connect(rolled_db) as dst:
        src.backup(dst)
    _roll_up(rolled_db)
    rolled = series.iteration_buckets(open_engine(rolled_db, readonly=True), RUN, width=width)
    assert len(rolled.rows) == len(raw.rows) and rolled.total_rows == raw.total_rows
    for got, want in zip(rolled.rows, raw.rows, strict=True):
        assert got == pytest.approx(want)
