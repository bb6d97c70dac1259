"""Repeated seeds in ``psctl compare``: the runs of one group (``psctl launch --repeat N`` tags
them ``group=NAME``) become one row holding the mean of each metric and its sample standard
deviation, so a difference between two set-ups can be read against the noise of one."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

from engine.analysis.selection import text
from engine.analysis.table import Column, Comparison
from engine.db.metrics import RunRecord

GROUP_TAG = "group"
RUNS = Column("runs", "runs", "int")


def group_of(record: RunRecord) -> str | None:
    return record.tags.get(GROUP_TAG)


def has_groups(records: Sequence[RunRecord]) -> bool:
    """Whether at least two of ``records`` share a group."""
    names = [g for g in map(group_of, records) if g is not None]
    return len(names) != len(set(names))


def aggregate(comparison: Comparison, records: Sequence[RunRecord]) -> Comparison:
    """One row per group (mean, and ``<key>_std`` beside each numeric metric), in the order
    each group's first run appears; runs outside any group keep their own row."""
    by_id = {r.summary.id: group_of(r) for r in records}
    order: list[str] = []
    members: dict[str, list[dict[str, Any]]] = {}
    for row in comparison.rows:
        key = by_id.get(row["id"]) or f"run:{row['id']}"
        if key not in members:
            order.append(key)
            members[key] = []
        members[key].append(row)
    metrics = [c for c in comparison.columns if numeric(c)]
    rows = [_row(key, members[key], comparison.columns, metrics) for key in order]
    return Comparison(_columns(comparison.columns, metrics), rows, comparison.target)


def numeric(column: Column) -> bool:
    return column.kind not in ("text", "config", "flag")


def std_column(column: Column) -> Column:
    return Column(f"{column.key}_std", f"{column.header} ±", "std")


def _columns(columns: Sequence[Column], metrics: Sequence[Column]) -> tuple[Column, ...]:
    out: list[Column] = []
    for column in columns:
        out.append(column)
        if column.key == "name":
            out.append(RUNS)
        if column in metrics:
            out.append(std_column(column))
    return tuple(out)


def _row(key: str, rows: list[dict[str, Any]], columns: Sequence[Column],
         metrics: Sequence[Column]) -> dict[str, Any]:
    if key.startswith("run:"):
        return {**rows[0], RUNS.key: 1, **{f"{c.key}_std": None for c in metrics}}
    row: dict[str, Any] = {"id": key, "name": f"{key} ({len(rows)} runs)", RUNS.key: len(rows)}
    for column in columns:
        if column.key in ("id", "name"):
            continue
        values = [r.get(column.key) for r in rows]
        if column in metrics:
            row[column.key], row[f"{column.key}_std"] = mean_std(values)
        else:
            row[column.key] = _shared(values)
    return row


def mean_std(values: Sequence[Any]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation of the defined values. The mean needs every run to
    have a value (a run that never reached the target makes the group's time to target
    undefined, not shorter); the deviation needs two of them."""
    if not values or any(v is None for v in values):
        return None, None
    floats = [float(v) for v in values]
    return statistics.fmean(floats), statistics.stdev(floats) if len(floats) > 1 else None


def _shared(values: Sequence[Any]) -> Any:
    """A setting or status common to the group, else its distinct values, comma-separated."""
    distinct = list(dict.fromkeys(text(v) for v in values))
    return values[0] if len(distinct) == 1 else ",".join(distinct)
