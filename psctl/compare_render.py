"""Writing a comparison: a rich table, Markdown, CSV or JSON (the last two raw, for programs)."""

from __future__ import annotations

import csv
import io
import json
import os
import sys
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from engine.analysis.cells import cell, is_numeric, json_rows, shown_columns
from engine.analysis.compare import best_values
from engine.analysis.selection import text
from engine.analysis.table import Comparison
from psctl.cliutil import show
from psctl.display import status_text


def rich_table(comparison: Comparison) -> Table:
    best = best_values(comparison)
    grouped = any(c.kind == "std" for c in comparison.columns)
    title = f"{len(comparison.rows)} {'row' if grouped else 'run'}(s)"
    if grouped:
        title += "; a group of repeated runs shows mean ± standard deviation"
    table = Table(title=title, title_justify="left")
    columns = shown_columns(comparison)
    for column in columns:
        table.add_column(column.header, justify="right" if is_numeric(column) else "left")
    for row in comparison.rows:
        cells: list[Text] = []
        for column in columns:
            value = row.get(column.key)
            if column.key == "status":
                cells.append(status_text(str(value)))
                continue
            winner = column.key in best and value == best[column.key]
            cells.append(Text(cell(column, row), style="bold green" if winner else ""))
        table.add_row(*cells)
    return table


def print_table(comparison: Comparison, console: Console) -> None:
    """Print the table; on a terminal too narrow for it, page it at full width instead, and
    into a file or pipe, write it at full width."""
    table = rich_table(comparison)
    # Measured without the console's width as a cap, or it could never exceed it.
    width = console.measure(table, options=console.options.update_width(10_000)).maximum
    if not console.is_terminal:
        show(table, console)
        return
    if width <= console.width or not sys.stdin.isatty():
        console.print(table)
        return
    # less -S scrolls sideways instead of wrapping each row over several lines.
    os.environ.setdefault("LESS", "-RS")
    wide = Console(width=width, force_terminal=True, no_color=console.no_color)
    with wide.pager(styles=not console.no_color):
        wide.print(table)


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
