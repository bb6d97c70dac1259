"""``psctl compare --plot``: a metric of the evaluations against wall time, one line per run."""

from __future__ import annotations

import os
from collections.abc import Sequence

from sqlalchemy import Engine

from engine.db.metrics import EVALUATION_METRICS, RunRecord, evaluation_series
from psctl.selection import UsageError


def plot(
    engine: Engine,
    records: Sequence[RunRecord],
    *,
    metric: str = "accuracy",
    width: int = 100,
    height: int = 25,
    color: bool = True,
) -> str:
    """The chart as text; runs without evaluations are left out (and named in the title)."""
    import plotext as plt  # a few hundred ms to import: only when a plot is asked for

    if metric not in EVALUATION_METRICS:
        raise UsageError(f"--metric takes one of {', '.join(EVALUATION_METRICS)}, not {metric!r}")
    plt.clear_figure()
    plt.plotsize(width, height)
    if not color:
        plt.theme("clear")
    empty = []
    for record in records:
        points = evaluation_series(engine, record.summary.id, metric)
        if not points:
            empty.append(record.summary.name)
            continue
        xs, ys = zip(*points, strict=True)
        label = f"{record.summary.id[:8]} {record.summary.name}"
        plt.plot(list(xs), list(ys), label=label, marker="braille" if color else "dot")
    title = f"test {metric} vs wall time"
    if empty:
        title += f" (no evaluations: {', '.join(empty)})"
    plt.title(title)
    plt.xlabel("seconds since the run started")
    plt.ylabel(metric)
    return str(plt.build())


def want_color() -> bool:
    """NO_COLOR (any value) turns colour off, as https://no-color.org asks."""
    return "NO_COLOR" not in os.environ
