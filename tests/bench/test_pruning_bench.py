"""The analysis of bench/pruning.py on hand-built rows and a hand-built database: the bytes and
accuracy measured from the tables, the results table, the verdict on what held, the plot series,
and (where matplotlib is installed) the two PNGs."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import pruning as bench  # noqa: E402


def _row(label: str, reached: float | None, best: float | None = 0.98,
         reduction: float | None = 10.0, status: str = "finished") -> dict[str, Any]:
    config = bench.CONFIGS[label]
    return {"config": label, "prune": config["comm.prune"],
            "error_feedback": config["comm.error_feedback"], "status": status,
            "reason": "time limit of 60 s reached", "time_to_target_s": reached,
            "best_accuracy": best, "iterations": 1000,
            "push_bytes_per_iteration": 2_255_112 / (reduction or 1.0),
            "push_reduction": reduction,
            "loadavg_at_start": 2.04,
            "curve": [[4.0, 100, 0.80], [6.0, 250, 0.95], [8.0, 400, best or 0.1]]}


def test_configurations_are_seed_002s_each_with_and_without_error_feedback() -> None:
    assert len(bench.CONFIGS) == 15
    assert bench.CONFIGS["none"] == {"comm.prune": "none", "comm.error_feedback": True}
    assert bench.CONFIGS["topk:0.1% without EF"] == {"comm.prune": "topk:0.1%",
                                                     "comm.error_feedback": False}
    assert {c["comm.prune"] for c in bench.CONFIGS.values()} == set(bench.RULES)


def test_measure_reads_bytes_accuracy_and_iterations_by_evaluation(tmp_path: Path) -> None:
    db = tmp_path / "e.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE runs (id TEXT, reason TEXT)")
        conn.execute("CREATE TABLE iterations (run_id TEXT, ended_at REAL, samples INTEGER, "
                     "bytes_sent INTEGER, bytes_received INTEGER, push_bytes INTEGER, "
                     "push_bytes_dense INTEGER)")
        conn.execute("CREATE TABLE evaluations (id INTEGER PRIMARY KEY, run_id TEXT, at REAL, "
                     "elapsed_s REAL, accuracy REAL)")
        conn.execute("INSERT INTO runs VALUES ('a', 'time limit of 60 s reached')")
        # Six iterations at t = 101..106; the fourth pushed nothing (push_bytes 0).
        conn.executemany("INSERT INTO iterations VALUES ('a', ?, 64, ?, 10, ?, ?)", [
            (101.0, 150, 100, 1000), (102.0, 350, 300, 3000), (103.0, 150, 100, 1000),
            (104.0, 50, 0, 0), (105.0, 150, 100, 1000), (106.0, 150, 100, 1000)])
        conn.executemany("INSERT INTO evaluations (run_id, at, elapsed_s, accuracy) "
                         "VALUES ('a', ?, ?, ?)",
                         [(100.5, 2.5, 0.5), (103.0, 5.0, 0.971), (106.5, 8.5, 0.965)])
        conn.execute("INSERT INTO iterations VALUES ('b', 102.0, 64, 9, 9, 9, 9)")
    got = bench.measure(db, "a", 0.97)
    assert got["iterations"] == 6 and got["samples"] == 384
    assert got["push_bytes_per_iteration"] == 140.0  # 700 bytes over the 5 that pushed
    assert got["push_reduction"] == 10.0
    assert (got["bytes_sent"], got["bytes_received"]) == (1000, 60)
    assert got["curve"] == [[2.5, 0, 0.5], [5.0, 3, 0.971], [8.5, 6, 0.965]]
    assert got["time_to_target_s"] == 5.0
    assert (got["best_accuracy"], got["final_accuracy"]) == (0.971, 0.965)
    assert got["reason"] == "time limit of 60 s reached"
    assert bench.measure(db, "a", 0.99)["time_to_target_s"] is None
    empty = bench.measure(db, "missing", 0.97)
    assert empty["iterations"] == 0 and empty["push_reduction"] is None
    assert empty["push_bytes_per_iteration"] is None and empty["best_accuracy"] is None


def test_table_lists_filters_in_seed_order_with_bytes_and_failures() -> None:
    rows = [_row("sigma:2 without EF", None, 0.95, 180.0, "failed"),
            _row("topk:1% with EF", 30.5, 0.9812, 49.7), _row("none", 25.0, 0.98, 1.0)]
    lines = bench.table(rows, 0.97, 60.0)
    assert lines[0].startswith("| push filter | error feedback | status | push KB/iteration |")
    assert "time to 97% | best accuracy in 60 s | iterations | load average" in lines[0]
    assert lines[2:] == [
        "| none | (dense) | finished | 2,255.1 | 1.0x | 25.0 s | 98.00% | 1000 | 2.0 |",
        "| topk:1% | on | finished | 45.4 | 49.7x | 30.5 s | 98.12% | 1000 | 2.0 |",
        "| sigma:2 | off | failed | 12.5 | 180.0x | not reached | 95.00% | 1000 | 2.0 |"]
    broken = _row("dynamic with EF", None, None, None, "error: RunFailed")
    broken["push_bytes_per_iteration"] = None
    del broken["loadavg_at_start"]  # rows recorded before the column existed
    assert bench.table([broken], 0.97, 60.0)[2] == (
        "| dynamic | on | error: RunFailed |  |  | not reached |  | 1000 |  |")


def test_verdict_says_what_held_in_every_pass_and_what_error_feedback_changed() -> None:
    passes = [
        {"results": [_row("none", 20.0), _row("topk:1% with EF", 30.0, 0.980, 49.0),
                     _row("topk:1% without EF", None, 0.960, 51.0),
                     _row("sigma:3 with EF", None, 0.950, 300.0),
                     _row("sigma:3 without EF", None, 0.940, 320.0, "failed")]},
        {"results": [_row("none", 22.0), _row("topk:1% with EF", 28.0, 0.981, 50.0),
                     _row("topk:1% without EF", 40.0, 0.975, 49.0),
                     _row("sigma:3 with EF", None, 0.930, 280.0),
                     _row("sigma:3 without EF", None, 0.945, 310.0)]}]
    text = bench.verdict(passes, 0.97)
    assert text.startswith("Over 2 passes: reached 97% within the budget every time: none, "
                           "topk:1% (with EF); never: sigma:3 (with and without EF).")
    assert ("with / without error feedback: topk:1% 49.5x with / 50.0x without; "
            "sigma:3 290.0x with / 315.0x without.") in text
    same = bench.verdict([{"results": [_row("topk:10% with EF", 9.0, reduction=5.0),
                                       _row("topk:10% without EF", 9.0, reduction=5.0)]}], 0.97)
    assert "error feedback: topk:10% 5.0x either way." in same
    assert ("Error feedback (EF) gave the higher best accuracy in 3 of 4 (filter, pass) pairs, "
            "the lower in 1; 97% was reached only with it by topk:1% (pass 1).") in text
    assert text.endswith("Runs that did not finish cleanly: sigma:3 without EF (failed: time "
                         "limit of 60 s reached).")


def test_grouped_names_each_filter_once() -> None:
    assert bench.grouped([]) == "none"
    assert bench.grouped(["dynamic without EF", "none", "topk:10% with EF",
                          "topk:10% without EF"]) == (
        "none, topk:10% (with and without EF), dynamic (without EF)")


def test_plot_series_one_distinct_colour_per_filter_dashed_without_error_feedback() -> None:
    rows = [_row(label, None) for label in bench.CONFIGS]
    rows[3]["curve"] = []  # a run that never evaluated draws no line
    rows[5]["status"] = "failed"
    series = bench.plot_series(rows)
    assert len(series) == 14
    assert len(set(bench.COLOURS.values())) == len(bench.RULES)
    by_label = {s["label"]: s for s in series}
    assert by_label["none"]["thick"] and not by_label["none"]["dashed"]
    assert by_label["topk:10% with EF"]["colour"] == by_label["topk:10% without EF"]["colour"]
    assert by_label["topk:10% without EF"]["dashed"]
    assert not by_label["topk:10% with EF"]["dashed"]
    assert "topk:0.1% with EF (failed)" in by_label
    assert by_label["none"]["iterations"] == [100, 250, 400]
    assert by_label["none"]["seconds"] == [4.0, 6.0, 8.0]


def test_write_plots_draws_two_pngs(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    rows = [_row(label, None) for label in bench.CONFIGS]
    paths = {"iterations": tmp_path / "it.png", "seconds": tmp_path / "s.png"}
    written = bench.write_plots(rows, 0.97, "title", paths)
    assert written == list(paths.values())
    for path in written:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
