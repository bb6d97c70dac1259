"""The analysis of bench/sync_models.py: gradients counted up to the target, the split of a
speedup into arrival rate and gradients needed, and the verdict line, on a hand-built database."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import sync_models as bench  # noqa: E402


def _database(path: Path) -> Path:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE iterations (run_id TEXT, pushed_at REAL)")
        conn.execute("CREATE TABLE evaluations (run_id TEXT, at REAL, accuracy REAL)")
        # Run "a": one push per second from t = 1; run "b": two per second.
        conn.executemany("INSERT INTO iterations VALUES ('a', ?)", [(t,) for t in range(1, 21)])
        conn.executemany("INSERT INTO iterations VALUES ('b', ?)",
                         [(t / 2,) for t in range(1, 41)])
        conn.executemany("INSERT INTO evaluations VALUES (?, ?, ?)",
                         [("a", 5.0, 0.90), ("a", 10.0, 0.97), ("a", 15.0, 0.98),
                          ("b", 6.0, 0.96), ("b", 12.5, 0.971), ("c", 3.0, 0.5)])
    return path


def _row(model: str, run_id: str, training_s: float | None) -> dict[str, Any]:
    return {"model": model, "run_id": run_id, "time_to_target_s": training_s,
            "training_time_to_target_s": training_s, "final_accuracy": 0.98,
            "iterations": 20, "idle_fraction": [0.5, 0.1]}


def test_gradients_before_counts_pushes_up_to_the_moment(tmp_path: Path) -> None:
    db = _database(tmp_path / "e.db")
    assert bench.gradients_before(db, "a", 10.0) == 10
    assert bench.gradients_before(db, "b", 10.0) == 20
    assert bench.gradients_before(db, "a", 0.5) == 0
    assert bench.gradients_before(db, "a", None) is None


def test_reanalyse_fills_missing_columns_from_the_pass_database(tmp_path: Path) -> None:
    db = _database(tmp_path / "e.db")
    rows = [_row("BSP", "a", 10.0), _row("ElasticBSP (R = 15)", "b", 12.5),
            _row("ASP", "c", None)]
    passes = bench.reanalyse([{"db": str(db), "results": rows}], 0.97)

    found = {r["run_id"]: (r["target_at"], r["gradients_to_target"]) for r in passes[0]["results"]}
    assert found == {"a": (10.0, 10), "b": (12.5, 25), "c": (None, None)}


def test_decomposition_and_verdict(tmp_path: Path) -> None:
    db = _database(tmp_path / "e.db")
    rows = bench.reanalyse([{"db": str(db), "results": [
        _row("BSP", "a", 10.0), _row("ElasticBSP (R = 15)", "b", 5.0)]}], 0.97)[0]["results"]
    # b: 25 gradients in 5 s (5/s) against a: 10 in 10 s (1/s).
    assert bench._decomposition(rows) == (
        "ElasticBSP (R = 15) received gradients 5.00x as fast as BSP but needed 2.50x as many "
        "to reach the target.")
    assert bench._verdict([{"results": rows}], 0.97).endswith("speedup over all passes: 2.00x. "
                                                              "Goal met.")
    rows[1]["time_to_target_s"] = 8.0
    assert bench._verdict([{"results": rows}], 0.97).endswith("1.25x. Goal not met.")
    table = bench.table(rows, 0.97)
    assert table[2].startswith("| BSP | 10.0 s | 1.00x | 10.0 s | 1.00x | 10 | 1 |")
    assert "| 25 | 5 |" in table[3]
