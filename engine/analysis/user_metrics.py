"""``psctl compare --metric NAME`` for a metric the runs' own code logged (``psctl.log``): two
more columns, its final value (the mean over the workers of each one's last) and its mean over
the run, read from each run's ``user_metrics`` rows."""

from __future__ import annotations

from sqlalchemy import Engine

from engine.analysis.selection import UsageError
from engine.analysis.table import Column, Comparison
from engine.db.metrics import EVALUATION_METRICS
from engine.db.user_metrics import metric_names, metric_summary


def is_user_metric(metric: str | None) -> bool:
    """Whether ``--metric`` names a logged metric: the evaluations' own names (accuracy, loss,
    step, epoch) mean the evaluations' columns, which the table has already."""
    return metric is not None and metric not in EVALUATION_METRICS


def user_metric_columns(name: str) -> tuple[Column, Column]:
    # Which end is better is the user's to know: neither is highlighted.
    return (Column(f"user.{name}.final", f"{name} final", "value"),
            Column(f"user.{name}.mean", f"{name} mean", "value"))


def with_user_metric(engine: Engine, table: Comparison, name: str) -> Comparison:
    """``table`` with ``name``'s final and mean value in each run (blank where a run did not
    log it); a name that none of its runs logged is a usage error that lists theirs."""
    final, mean = user_metric_columns(name)
    rows = []
    found = False
    for row in table.rows:
        summary = metric_summary(engine, str(row["id"]), name)
        found = found or summary is not None
        rows.append({**row, final.key: summary.final if summary else None,
                     mean.key: summary.mean if summary else None})
    if not found:
        logged = sorted({n for row in table.rows for n in metric_names(engine, str(row["id"]))})
        listed = ", ".join(logged) if logged else "none"
        raise UsageError(f"--metric {name}: none of these runs logged a metric of that name "
                         f"(psctl.log); they logged: {listed}; the evaluations' metrics are "
                         f"{', '.join(EVALUATION_METRICS)}")
    return Comparison((*table.columns, final, mean), rows, table.target)
