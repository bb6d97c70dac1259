"""The report's PNGs (matplotlib, drawn without a display): accuracy against time and against
the step, one line per run, and bars of idle fraction and mean staleness.

With two or more axes, the last one splits the curves into panels (one per value, e.g. per
worker count) and the bars into colours, so that no chart holds the whole grid at once."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

    from psctl.study_rows import Row

_PANEL_W, _PANEL_H, _MAX_COLUMNS = 5.5, 3.8, 3


def write_plots(out: Path, rows: list[Row], axes: list[str],
                target: float) -> list[tuple[str, str]]:
    """(file name, caption) of each PNG written to ``out``; ImportError without matplotlib."""
    import matplotlib  # noqa: F401  (fails here, before any file, when it is not installed)

    split = axes[-1] if len(axes) > 1 and len({r.labels[axes[-1]] for r in rows}) > 1 else None
    written = []
    for file, caption, x_of, xlabel in (
        ("accuracy-time.png", "test accuracy against time", 0, "seconds since the run started"),
        ("accuracy-step.png", "test accuracy against the step", 1,
         "step (updates applied by the servers)"),
    ):
        _curves(out / file, rows, axes, split, x_of, xlabel, target)
        written.append((file, caption))
    for file, caption, metric, ylabel in (
        ("idle.png", "idle fraction", _idle, "idle fraction (wait / iteration wall)"),
        ("staleness.png", "mean staleness", _staleness, "mean staleness (updates)"),
    ):
        _bars(out / file, rows, axes, metric, ylabel)
        written.append((file, caption))
    return written


def _idle(row: Row) -> float | None:
    return row.idle_fraction


def _staleness(row: Row) -> float | None:
    return row.staleness_mean


def _name(row: Row, axes: list[str]) -> str:
    parts = [row.labels.get(axis, "") for axis in axes]
    if row.seed is not None:
        parts.append(f"seed {row.seed}")
    return " · ".join(parts) or row.name


def _curves(path: Path, rows: list[Row], axes: list[str], split: str | None, x_of: int,
            xlabel: str, target: float) -> None:
    panels = list(dict.fromkeys(r.labels[split] for r in rows)) if split else [None]
    inner = [a for a in axes if a != split]
    names = list(dict.fromkeys(_name(r, inner) for r in rows))
    figure, grid = _figure(len(panels))
    for panel, ax in zip(panels, grid, strict=False):
        for row in rows:
            if split is not None and row.labels[split] != panel:
                continue
            points = [(e[x_of], e[2]) for e in row.evaluations]
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, marker=".", markersize=3, linewidth=1.2,
                        label=_name(row, inner), color=_color(names.index(_name(row, inner))))
        ax.axhline(target, color="0.5", linestyle="--", linewidth=0.8)
        ax.set_title(f"{split} = {panel}" if split else "", fontsize=10)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("test accuracy")
        ax.grid(alpha=0.3)
    _legend(figure, grid, len(names))
    figure.savefig(path, dpi=110, bbox_inches="tight")


def _bars(path: Path, rows: list[Row], axes: list[str], metric: Callable[[Row], float | None],
          ylabel: str) -> None:
    series_axis = axes[-1] if len(axes) > 1 else None
    outer = [a for a in axes if a != series_axis]
    groups = list(dict.fromkeys(_name(r, outer) for r in rows))
    series = list(dict.fromkeys(r.labels[series_axis] for r in rows)) if series_axis else [""]
    figure, grid = _figure(1, wide=max(1.0, len(groups) * max(1, len(series)) / 8))
    ax = grid[0]
    width = 0.8 / len(series)
    for s_index, one in enumerate(series):
        xs, heights = [], []
        for row in rows:
            if series_axis is not None and row.labels[series_axis] != one:
                continue
            value = metric(row)
            xs.append(groups.index(_name(row, outer)) + (s_index - (len(series) - 1) / 2) * width)
            heights.append(math.nan if value is None else value)
        # One axis: a colour per bar, the same as the run's curve in the other plots.
        colors = [_color(s_index)] if series_axis else [_color(i) for i in range(len(xs))]
        ax.bar(xs, heights, width=width * 0.95, color=colors,
               label=f"{series_axis} = {one}" if series_axis else None)
    ax.set_xticks(range(len(groups)), groups, rotation=30 if len(groups) > 4 else 0,
                  ha="right" if len(groups) > 4 else "center")
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    if series_axis:
        ax.legend(fontsize=8)
    figure.savefig(path, dpi=110, bbox_inches="tight")


def _figure(panels: int, wide: float = 1.0) -> tuple[Figure, list[Axes]]:
    # matplotlib.figure.Figure draws through Agg without pyplot: no GUI backend is chosen and
    # no global figure is left behind in a long-lived process.
    from matplotlib.figure import Figure

    columns = min(panels, _MAX_COLUMNS)
    lines = math.ceil(panels / columns)
    figure = Figure(figsize=(_PANEL_W * columns * wide, _PANEL_H * lines), layout="constrained")
    grid = figure.subplots(lines, columns, squeeze=False).flatten().tolist()
    for extra in grid[panels:]:
        extra.set_visible(False)
    return figure, grid[:panels]


def _legend(figure: Figure, grid: list[Axes], count: int) -> None:
    handles: dict[str, Artist] = {}
    for ax in grid:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    if handles:  # below the panels, so that it never covers a curve
        figure.legend(list(handles.values()), list(handles), loc="outside lower center",
                      ncols=min(4, count), fontsize=8)


def _color(index: int) -> str:
    return f"C{index % 10}"
