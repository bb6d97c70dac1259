"""A comparison's values as every face writes them: the CLI's table, markdown and JSON, and the
dashboard's cells, from one set of functions."""

from __future__ import annotations

from typing import Any

from engine.analysis.selection import text
from engine.analysis.table import Column, Comparison


def fmt_seconds(seconds: float | None) -> str:
    """One duration format in every view: H:MM:SS (the dashboard's PS.fmtS is the same)."""
    if seconds is None:
        return "-"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


def fmt(column: Column, value: Any) -> str:
    """A value as a person reads it; undefined values are blank, never zero."""
    if value is None:
        return ""
    match column.kind:
        case "pct":
            return f"{100 * value:.2f}%"
        case "duration":  # a run's duration: H:MM:SS in every view
            return fmt_seconds(value)
        case "secs":
            return f"{value:.1f}"
        case "rate":
            return f"{value:,.0f}"
        case "num":
            return f"{value:.2f}"
        case "value":  # a metric the user's code logged: any scale, so significant digits
            return f"{value:.4g}"
        case "speedup":
            return f"{value:.2f}×"
        case "flag" if isinstance(value, bool):
            return "yes" if value else ""
        case "int":
            # A group's mean of whole numbers need not be whole.
            return str(int(value)) if float(value).is_integer() else f"{value:.2f}"
    if column.key == "id":
        return str(value)[:8]
    return text(value)


def is_numeric(column: Column) -> bool:
    return column.kind not in ("text", "config", "flag")


def shown_columns(comparison: Comparison) -> list[Column]:
    """The columns a person reads: a standard deviation is written beside its mean, and an
    interval's ends only beside a paired speedup."""
    return [c for c in comparison.columns if c.kind not in ("std", "ci")]


def cell(column: Column, row: dict[str, Any]) -> str:
    """``fmt`` of the value, with `` ± std`` where the row is a group's mean."""
    shown = fmt(column, row.get(column.key))
    low, high = row.get(f"{column.key}_low"), row.get(f"{column.key}_high")
    if column.kind == "speedup" and shown and low is not None and high is not None:
        return f"{shown} [{low:.2f}, {high:.2f}]"  # paired by seed: its interval, not a spread
    std = row.get(f"{column.key}_std")
    if std is None or not shown:
        return shown
    spread = f"{100 * std:.2f}" if column.kind == "pct" else fmt(column, std).rstrip("×")
    return f"{shown} ± {spread}"


def json_rows(comparison: Comparison) -> list[dict[str, Any]]:
    """The rows as ``psctl compare --json`` prints them: raw values, every column, in order."""
    return [{c.key: row.get(c.key) for c in comparison.columns} for row in comparison.rows]
