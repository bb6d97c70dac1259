"""The analysis of bench/scheduling.py: the table against fifo, the verdict per pass, and the
measurement read back from a real database file."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import scheduling as bench  # noqa: E402
from engine.db import open_engine  # noqa: E402


def _row(schedule: str, suspend: float | None) -> dict[str, Any]:
    return {"schedule": schedule, "status": "finished", "suspend_ms_mean": suspend,
            "suspend_ms_mean_fast": suspend, "staleness_mean": 1.25, "staleness_max": 3,
            "samples_per_s": 1234.5, "iterations": 800}


def test_table_gives_suspend_against_fifo() -> None:
    lines = bench.table([_row("fifo", 20.0), _row("filo", 30.0), _row("stalest-first", None)])
    assert lines[0].startswith("| schedule | status | mean suspend per layer pull |")
    assert "| filo | finished | 30.0 ms | 30.0 ms | 1.50x | 1.25 | 3 | 1,234 | 800 |" in lines
    assert "| stalest-first | finished |  |  |  | 1.25 | 3 | 1,234 | 800 |" in lines


def test_verdict_says_whether_one_schedule_won_every_pass() -> None:
    same = [{"results": [_row("fifo", 20.0), _row("filo", 10.0)]},
            {"results": [_row("fifo", 25.0), _row("filo", 12.0)]}]
    assert bench.verdict(same) == "Least mean suspend per pass: filo, filo; filo in every pass."
    mixed = [{"results": [_row("fifo", 20.0), _row("filo", 10.0)]},
             {"results": [_row("fifo", 5.0), _row("filo", 12.0)]}]
    assert "no schedule won every pass" in bench.verdict(mixed)


def test_measure_reads_the_layer_table(tmp_path: Path) -> None:
    db = tmp_path / "experiments.db"
    open_engine(db).dispose()  # the real schema
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO runs (id, name, status, started_at, heartbeat_at, config_json, "
                     "sync, workers, servers, dataset) VALUES ('r', 'n', 'finished', 0, 0, '{}', "
                     "'ssp', 4, 2, 'mnist')")
        conn.executemany("INSERT INTO layer_iterations VALUES ('r', ?, 0, ?, 0, 0, ?, ?)",
                         [(w, layer, 0.01 * (w + 1), w) for w in range(4) for layer in range(2)])
        conn.executemany("INSERT INTO iterations (run_id, worker, iteration, epoch, started_at, "
                         "ended_at, compute_s, push_s, pull_s, wait_s, staleness, samples, "
                         "bytes_sent, bytes_received) VALUES ('r', ?, 0, 0, 0, 2, 1, 0, 0, 0, "
                         "0, 64, 0, 0)", [(w,) for w in range(4)])
    conn.close()
    measured = bench.measure(db, "r")
    assert measured["suspend_ms_mean"] == 25.0 and measured["suspend_ms_mean_fast"] == 20.0
    assert (measured["staleness_mean"], measured["staleness_max"]) == (1.5, 3)
    assert measured["samples_per_s"] == 128.0 and measured["layer_pulls"] == 8
