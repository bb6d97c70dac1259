"""A comparison's cells as the CLI and the dashboard both write them (one set of functions)."""

from __future__ import annotations

from engine.analysis.cells import cell, fmt, is_numeric, json_rows, shown_columns
from engine.analysis.table import Column, Comparison

ACC = Column("best_accuracy", "best acc", "pct", "max")
TIME = Column("duration_s", "duration", "duration")
ITERS = Column("iterations", "iterations", "int")
SPEED = Column("speedup", "speedup", "speedup", "max")
ACC_STD = Column("best_accuracy_std", "best acc std", "std")
RUN = Column("id", "run", "text")


def test_values_are_written_as_a_person_reads_them_and_undefined_is_blank() -> None:
    assert fmt(ACC, 0.97214) == "97.21%"
    assert fmt(TIME, 3 * 3600 + 62) == "3:01:02"
    assert fmt(SPEED, 1.5) == "1.50×"
    assert fmt(ITERS, 12.0) == "12" and fmt(ITERS, 12.5) == "12.50"  # a group's mean
    assert fmt(RUN, "0123456789abcdef") == "01234567"
    assert fmt(ACC, None) == "" and fmt(ITERS, None) == ""  # never zero


def test_a_groups_mean_is_written_with_its_standard_deviation() -> None:
    row = {"best_accuracy": 0.9, "best_accuracy_std": 0.0123, "speedup": 2.0,
           "speedup_std": 0.25, "iterations": 40}
    assert cell(ACC, row) == "90.00% ± 1.23"  # in percentage points, as the mean
    assert cell(SPEED, row) == "2.00× ± 0.25"
    assert cell(ITERS, row) == "40"  # no spread recorded: the value alone


def test_the_standard_deviation_column_is_not_shown_but_is_in_json() -> None:
    table = Comparison(columns=(RUN, ACC, ACC_STD), rows=[
        {"id": "abc", "best_accuracy": 0.5, "best_accuracy_std": 0.1, "extra": 1}])
    assert shown_columns(table) == [RUN, ACC]
    assert json_rows(table) == [{"id": "abc", "best_accuracy": 0.5, "best_accuracy_std": 0.1}]
    assert [is_numeric(c) for c in (RUN, ACC, TIME)] == [False, True, True]
