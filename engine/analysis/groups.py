"""Repeated seeds in ``psctl compare``: the runs of one group (``psctl launch --repeat N`` tags
them ``group=NAME``) become one row holding the mean of each metric, its sample standard
deviation and its 95 % interval over the seeds (``<key>_low``, ``<key>_high``), so a difference
between two set-ups can be read against the noise of one. With a baseline that belongs to a
group, each group's speedup is its time to target against the baseline group's, paired by
seed, with its interval and a verdict (engine.analysis.intervals)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any

from engine.analysis.intervals import interval, paired_ratio
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


VERDICT = Column("verdict", "verdict", "text")


def aggregate(comparison: Comparison, records: Sequence[RunRecord],
              baseline: RunRecord | None = None) -> Comparison:
    """One row per group (mean, and ``<key>_std``, ``<key>_low`` and ``<key>_high`` beside each
    numeric metric), in the order each group's first run appears; runs outside any group keep
    their own row. With a ``baseline`` in one of the groups, speedups are paired by seed."""
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
    base = None if baseline is None else group_of(baseline)
    columns = _columns(comparison.columns, metrics)
    if base is not None and base in members:
        seeds = {r.summary.id: _seed(r) for r in records}
        for key, row in zip(order, rows, strict=True):
            _pair(row, members[base], members[key], seeds)
        columns = _with_verdict(columns)
    return Comparison(columns, rows, comparison.target)


def _seed(record: RunRecord) -> int | None:
    seed = record.config.get("train", {}).get("seed")
    return seed if isinstance(seed, int) else None


def _pair(row: dict[str, Any], base: list[dict[str, Any]], mine: list[dict[str, Any]],
          seeds: dict[str, int | None]) -> None:
    """The group's speedup over the baseline group, paired by seed: time to target, the
    baseline's over the group's."""
    def times(rows: list[dict[str, Any]]) -> dict[int, float | None]:
        return {seed: r.get("time_to_target_s") for r in rows
                if (seed := seeds.get(r["id"])) is not None}

    ratio = paired_ratio(times(base), times(mine), lower_is_better=True, better="faster",
                         worse="slower")
    row["speedup"] = None if ratio is None else ratio.ratio
    row["speedup_std"] = None
    row["speedup_low"] = None if ratio is None else ratio.low
    row["speedup_high"] = None if ratio is None else ratio.high
    row[VERDICT.key] = None if ratio is None else ratio.verdict


def _with_verdict(columns: tuple[Column, ...]) -> tuple[Column, ...]:
    out: list[Column] = []
    for column in columns:
        out.append(column)
        if column.key == "speedup_high":
            out.append(VERDICT)
    return tuple(out) if VERDICT in out else (*out, VERDICT)


def numeric(column: Column) -> bool:
    return column.kind not in ("text", "config", "flag")


def std_column(column: Column) -> Column:
    return Column(f"{column.key}_std", f"{column.header} ±", "std")


def interval_columns(column: Column) -> tuple[Column, Column]:
    """The 95 % interval's ends over seeds: in JSON and CSV, and beside a paired speedup."""
    return (Column(f"{column.key}_low", f"{column.header} 95 % low", "ci"),
            Column(f"{column.key}_high", f"{column.header} 95 % high", "ci"))


def _columns(columns: Sequence[Column], metrics: Sequence[Column]) -> tuple[Column, ...]:
    out: list[Column] = []
    for column in columns:
        out.append(column)
        if column.key == "name":
            out.append(RUNS)
        if column in metrics:
            out += [std_column(column), *interval_columns(column)]
    return tuple(out)


def _row(key: str, rows: list[dict[str, Any]], columns: Sequence[Column],
         metrics: Sequence[Column]) -> dict[str, Any]:
    if key.startswith("run:"):
        blank = {f"{c.key}_{end}": None for c in metrics for end in ("std", "low", "high")}
        return {**rows[0], RUNS.key: 1, **blank}
    row: dict[str, Any] = {"id": key, "name": f"{key} ({len(rows)} runs)", RUNS.key: len(rows)}
    for column in columns:
        if column.key in ("id", "name"):
            continue
        values = [r.get(column.key) for r in rows]
        if column in metrics:
            row[column.key], row[f"{column.key}_std"] = mean_std(values)
            found = interval(values, (0.0, 1.0) if column.kind == "pct" else (-math.inf, math.inf))
            row[f"{column.key}_low"] = None if found is None else found.low
            row[f"{column.key}_high"] = None if found is None else found.high
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
