"""Writing a comparison: a rich table, Markdown, CSV or JSON (the last two raw, for programs)."""

from __future__ import annotations

import csv
import io
import json
from typing import Any, Literal

from rich.console import Console
from rich.text import Text

from engine.analysis.cells import cell, is_numeric, json_rows, shown_columns
from engine.analysis.compare import best_values
from engine.analysis.selection import text
from engine.analysis.table import Column, Comparison
from psctl.cliutil import show
from psctl.display import fmt_target, status_text
from psctl.tables import Col, FitTable

# How the terminal shortens a metric's heading and how soon it is put away on a narrow screen
# (0: never; psctl.tables). A config key that differs ranks CONFIG_RANK, a column not listed
# (a metric the runs logged, say) OTHER_RANK.
METRIC_COLUMNS: dict[str, tuple[str | None, int]] = {
    "id": (None, 0), "name": (None, 0), "status": (None, 1), "wall_s": ("time", 2),
    "final_accuracy": ("final", 0), "best_accuracy": ("best", 0),
    "time_to_target_s": ("target s", 0), "startup_s": ("start s", 4),
    "samples_per_s": ("smp/s", 1), "staleness_mean": ("stale", 3), "staleness_p95": ("p95", 5),
    "idle_fraction": (None, 3), "bytes_per_sample": ("B/smp", 5),
    "push_reduction": ("push red", 4), "speedup": (None, 0), "oversubscribed": ("oversub", 2),
}
CONFIG_RANK = 3
OTHER_RANK = 1


def _col(column: Column, short_keys: dict[str, str]) -> Col:
    justify: Literal["left", "right"] = "right" if is_numeric(column) else "left"
    if column.kind == "config":  # optimizer.lr reads as lr where no other key ends so
        return Col(column.header, justify, short=short_keys.get(column.key), rank=CONFIG_RANK)
    short, rank = METRIC_COLUMNS.get(column.key, (None, OTHER_RANK))
    return Col(column.header, justify, short=short, rank=rank)


def _short_keys(columns: list[Column]) -> dict[str, str]:
    """Each config key by its last part, where that part names one key alone."""
    lasts = [c.key.rsplit(".", 1)[-1] for c in columns if c.kind == "config"]
    return {c.key: c.key.rsplit(".", 1)[-1] for c in columns
            if c.kind == "config" and lasts.count(c.key.rsplit(".", 1)[-1]) == 1}


def _title(comparison: Comparison) -> str:
    grouped = any(c.kind == "std" for c in comparison.columns)
    title = f"{len(comparison.rows)} {'row' if grouped else 'run'}(s)"
    if grouped:
        title += "; a group of repeated runs shows mean ± standard deviation"
    if comparison.target is not None:
        title += f"; to target: seconds of training to {fmt_target(comparison.target)} accuracy"
    return title


def rich_table(comparison: Comparison) -> FitTable:
    best = best_values(comparison)
    columns = shown_columns(comparison)
    rows = []
    for row in comparison.rows:
        cells: list[Text] = []
        for column in columns:
            value = row.get(column.key)
            if column.key == "status":
                cells.append(status_text(str(value)))
                continue
            winner = column.key in best and value == best[column.key]
            cells.append(Text(cell(column, row), style="bold green" if winner else ""))
        rows.append(cells)
    short_keys = _short_keys(columns)
    return FitTable([_col(c, short_keys) for c in columns], rows, title=_title(comparison))


def print_table(comparison: Comparison, console: Console, *, wide: bool = False,
                pager: bool = False) -> None:
    """Print the table for the screen (its most important columns on a narrow one), or every
    column with ``wide``, in a file or pipe, or in the pager when asked for on a terminal."""
    show(rich_table(comparison), console, wide=wide, pager=pager)


def markdown(comparison: Comparison) -> str:
    columns = shown_columns(comparison)
    lines = [
        "| " + " | ".join(c.header for c in columns) + " |",
        "|" + "|".join("---:" if is_numeric(c) else "---" for c in columns) + "|",
    ]
    for row in comparison.rows:
        cells = [cell(c, row).replace("|", "\\|") for c in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def csv_text(comparison: Comparison) -> str:
    """Raw values: full ids, unrounded numbers, blank for undefined, JSON for lists."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([c.key for c in comparison.columns])
    for row in comparison.rows:
        writer.writerow([_csv_cell(row.get(c.key)) for c in comparison.columns])
    return buffer.getvalue()


def _csv_cell(value: Any) -> str:
    if isinstance(value, float):
        return repr(value)  # shortest text that reads back as the same float
    return text(value)


def json_text(comparison: Comparison) -> str:
    return json.dumps(json_rows(comparison), indent=2)
