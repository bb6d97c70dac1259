"""``psctl compare --metric NAME`` for a metric the runs logged: its columns, and the error that
names the metrics there are when none of the runs logged it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from engine.analysis.cells import cell
from engine.analysis.selection import UsageError
from engine.analysis.table import Column, Comparison
from engine.analysis.user_metrics import is_user_metric, user_metric_columns, with_user_metric
from engine.db.schema import open_engine

A, B = "a" * 32, "b" * 32


def test_the_evaluations_names_are_not_logged_metrics() -> None:
    assert [is_user_metric(m) for m in ("accuracy", "loss", "step", "epoch", None)] == [False] * 5
    assert is_user_metric("grad_norm")


def test_columns_give_each_runs_final_and_mean_and_blank_where_not_logged(
        tmp_path: Path) -> None:
    db = tmp_path / "x.db"
    open_engine(db).dispose()
    with sqlite3.connect(db) as conn:
        for run in (A, B):
            conn.execute("INSERT INTO runs (id, name, status, started_at, heartbeat_at, "
                         "config_json, sync, workers, servers, dataset) VALUES "
                         "(?, 'n', 'finished', 1, 1, '{}', 'bsp', 1, 1, 'digits')", (run,))
        conn.executemany("INSERT INTO user_metrics VALUES (?, ?, 'worker', 0, ?, 1.0, ?)",
                         [(A, "grad_norm", i, 0.001 * (i + 1)) for i in range(4)]
                         + [(B, "act", 0, 1.0)])
    engine = open_engine(db, readonly=True)
    try:
        table = Comparison((Column("id", "run", "text"),), [{"id": A}, {"id": B}])
        shown = with_user_metric(engine, table, "grad_norm")
        final, mean = user_metric_columns("grad_norm")
        assert shown.columns[-2:] == (final, mean)
        assert (final.header, mean.header, final.kind) == ("grad_norm final", "grad_norm mean",
                                                           "value")
        assert shown.rows[0][final.key] == pytest.approx(0.004)
        assert shown.rows[0][mean.key] == pytest.approx(0.0025)
        assert shown.rows[1][final.key] is None
        assert cell(mean, shown.rows[0]) == "0.0025"  # small values keep their digits
        with pytest.raises(UsageError, match="none of these runs logged .*they logged: act, "
                                             "grad_norm"):
            with_user_metric(engine, table, "nope")
    finally:
        engine.dispose()

