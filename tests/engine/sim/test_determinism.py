"""Acceptance 1 of the simulator: the same configuration and seed give identical rows (psctl
launch --backend sim, called in this process: the simulator starts no process of its own)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from tests.conftest import psctl_in_process

_ARGS = ("launch", "--backend", "sim", "--dataset", "digits", "--workers", "4", "--servers", "2",
         "--epochs", "2", "--sync", "ssp", "--staleness", "2", "--straggler", "1:3x",
         "--jitter", "lognormal:0.3", "--compute-ms", "20", "--server-ms", "2",
         "--eval-interval", "0.2", "--train-limit", "768", "--no-live")
# Every timestamp is the run's start plus virtual time: compared relative to the start.
_TIMES = ("started_at", "ended_at", "pushed_at", "acked_at")


def _rows(db: Path, name: str, table: str, order: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(db) as conn:
        start = conn.execute("SELECT started_at FROM runs WHERE name = ?", (name,)).fetchone()[0]
        cursor = conn.execute(f"SELECT * FROM {table} WHERE run_id = (SELECT id FROM runs WHERE "
                              f"name = ?) ORDER BY {order}", (name,))
        columns = [d[0] for d in cursor.description]
        rows: list[tuple[object, ...]] = []
        for row in cursor.fetchall():
            values = dict(zip(columns, row, strict=True))
            values.pop("run_id")
            values.pop("id", None)
            for key in (*_TIMES, "at"):
                if values.get(key) is not None:
                    values[key] = round(values[key] - start, 6)
            rows.append(tuple(sorted(values.items())))
        return rows


def _three_runs(db: Path, args: tuple[str, ...]) -> None:
    """Runs a and b with seed 0, c with seed 1."""
    for name, seed in (("a", "0"), ("b", "0"), ("c", "1")):
        done = psctl_in_process(*args, "--seed", seed, "--name", name, db=db)
        assert done.returncode == 0, done.stderr


def test_same_seed_same_rows_and_another_seed_differs(tmp_path: Path) -> None:
    db = tmp_path / "sim.db"
    _three_runs(db, _ARGS)
    first = _rows(db, "a", "iterations", "worker, iteration")
    assert len(first) == 4 * 2 * 3  # 768 training samples: 192 per worker, 3 batches of 64
    assert first == _rows(db, "b", "iterations", "worker, iteration")
    assert _rows(db, "a", "evaluations", "at") == _rows(db, "b", "evaluations", "at")
    assert first != _rows(db, "c", "iterations", "worker, iteration")


_SPARSE = ("launch", "--backend", "sim", "--dataset",
           "sparse-synthetic:features=2^30,nnz=20,samples=2000,test=500,ctr=0.2",
           "--model", "embedding", "--workers", "2", "--servers", "2", "--epochs", "2",
           "--straggler", "1:2x", "--jitter", "lognormal:0.3", "--compute-ms", "10",
           "--server-ms", "0.5", "--no-live")


def test_a_sparse_run_gives_the_same_rows_and_metrics_twice(tmp_path: Path) -> None:
    """The embedding model's working sets, sparse and dense shards and AUC, in virtual time."""
    db = tmp_path / "sim.db"
    _three_runs(db, _SPARSE)
    first = _rows(db, "a", "iterations", "worker, iteration")
    assert len(first) == 2 * 2 * 16  # 1,000 samples a worker: 16 batches of 64, 2 epochs
    assert first == _rows(db, "b", "iterations", "worker, iteration")
    assert _rows(db, "a", "evaluations", "at") == _rows(db, "b", "evaluations", "at")
    metrics = _rows(db, "a", "user_metrics", "at, name")
    assert metrics and metrics == _rows(db, "b", "user_metrics", "at, name")
    assert first != _rows(db, "c", "iterations", "worker, iteration")


_DOWNPOUR = ("launch", "--backend", "sim", "--dataset", "digits", "--workers", "4", "--servers",
             "2", "--epochs", "2", "--sync", "asp", "--fetch-every", "2", "--push-every", "2",
             "--straggler", "0:3x", "--train-limit", "768", "--no-live")


def test_a_downpour_run_with_a_straggler_gives_the_same_rows_twice(tmp_path: Path) -> None:
    """Issue 55's acceptance 1: the real Downpour loop, in virtual time, with the measured costs
    of this machine (here the suite's fixed ones): identical rows for the same seed."""
    db = tmp_path / "sim.db"
    _three_runs(db, _DOWNPOUR)
    first = _rows(db, "a", "iterations", "worker, iteration")
    assert len(first) == 4 * 2 * 3
    assert first == _rows(db, "b", "iterations", "worker, iteration")
    assert _rows(db, "a", "evaluations", "at") == _rows(db, "b", "evaluations", "at")
    assert first != _rows(db, "c", "iterations", "worker, iteration")
