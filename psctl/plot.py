"""``psctl compare --plot``: a metric of the evaluations against seconds of training (from each
run's first iteration), one line per run, with the legend below the chart so that it never
covers the data."""

from __future__ import annotations

import os
from collections.abc import Sequence

from sqlalchemy import Engine

from engine.analysis.selection import UsageError
from engine.db.metrics import EVALUATION_METRICS, RunRecord, evaluation_series
from engine.db.user_metrics import training_series
from engine.usermetrics import is_name

X_LABEL = "seconds of training"
# Bright terminal colours, readable on dark and light backgrounds alike (never colour 0).
COLORS = ("blue+", "red+", "green+", "magenta+", "cyan+", "yellow+", "orange+", "white")
# Without colour, each run gets its own marker instead.
MARKERS = ("*", "o", "x", "+", "#", "@", "%", "=", "&", "$")
Series = tuple[str, list[float], list[float]]
# Accuracy is drawn in percent, as every table writes it.
SCALE = {"accuracy": 100.0}


def plot(
    engine: Engine,
    records: Sequence[RunRecord],
    *,
    metric: str = "accuracy",
    width: int = 100,
    height: int = 25,
    color: bool = True,
) -> str:
    """The chart as text, then one legend line per run; runs without evaluations are named
    below it. A ``metric`` other than the evaluations' is one the runs' code logged
    (``psctl.log``): per iteration, its mean over the workers."""
    logged = metric not in EVALUATION_METRICS
    if logged and not is_name(metric):
        raise UsageError(f"--metric takes one of {', '.join(EVALUATION_METRICS)} or the name of "
                         f"a metric the runs logged (psctl.log), not {metric!r}")
    drawn: list[Series] = []
    empty = []
    for record in records:
        points = (training_series(engine, record.summary.id, metric) if logged
                  else evaluation_series(engine, record.summary.id, metric))
        label = f"{record.summary.id[:8]} {record.summary.name}"
        if points:
            xs, ys = zip(*points, strict=True)
            drawn.append((label, list(xs), [y * SCALE.get(metric, 1) for y in ys]))
        else:
            empty.append(label)
    if logged and not drawn:
        raise UsageError(f"--metric {metric}: none of these runs logged a metric of that name "
                         f"(psctl.log), and the evaluations' are {', '.join(EVALUATION_METRICS)}")
    lines = [_chart(drawn, metric, width, height, color)] if drawn else []
    lines += [_legend_line(i, label, color) for i, (label, _, _) in enumerate(drawn)]
    if empty:
        lines.append(f"no {metric} logged: {', '.join(empty)}" if logged
                     else f"no evaluations yet: {', '.join(empty)}")
    return "\n".join(lines)


def _chart(drawn: list[Series], metric: str, width: int, height: int, color: bool) -> str:
    import plotext as plt  # a few hundred ms to import: only when a plot is asked for

    plt.clear_figure()
    plt.plotsize(width, height)
    # The terminal's own foreground and background: no theme colour can vanish into them.
    plt.theme("clear")
    for i, (_, xs, ys) in enumerate(drawn):
        if color:
            plt.plot(xs, ys, color=COLORS[i % len(COLORS)], marker="braille")
        else:
            plt.plot(xs, ys, marker=MARKERS[i % len(MARKERS)])
    low, high = y_range([y for _, _, ys in drawn for y in ys],
                        least=0.005 * SCALE.get(metric, 1))
    plt.ylim(low, high)
    named = f"{metric} (%)" if metric in SCALE else metric
    plt.title(f"{named} against {X_LABEL}" if metric not in EVALUATION_METRICS
              else f"test {named} against {X_LABEL}")
    plt.xlabel(X_LABEL)
    plt.ylabel(named)
    text = str(plt.build())
    return text if color else str(plt.uncolorize(text))


def y_range(values: Sequence[float], least: float = 0.005) -> tuple[float, float]:
    """The data's own range plus a 5 % margin (at least ``least``), so that runs close
    together stay apart instead of being flattened against an axis that starts at zero."""
    low, high = min(values), max(values)
    margin = max((high - low) * 0.05, least)
    return low - margin, high + margin


def _legend_line(index: int, label: str, color: bool) -> str:
    if not color:
        return f"  {MARKERS[index % len(MARKERS)]}  {label}"
    import plotext as plt

    return f"  {plt.colorize('━━', COLORS[index % len(COLORS)])}  {label}"


def want_color() -> bool:
    """NO_COLOR (any value) turns colour off, as https://no-color.org asks."""
    return "NO_COLOR" not in os.environ
