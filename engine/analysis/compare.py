"""``psctl compare``: one row per run, the config keys that differ, then the measured outcome."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Engine

from engine.analysis.selection import UsageError, flatten, text
from engine.analysis.table import DEFAULT_TARGET, Column, Comparison
from engine.db.metrics import RunMetrics, RunRecord, run_metrics

# How one run's metrics are measured: run_metrics by default; the dashboard passes a cached one.
Measure = Callable[[str, float | None], RunMetrics]

_HEAD = (Column("id", "run", "text"), Column("name", "name", "text"))
_METRICS = (
    Column("status", "status", "text"),
    Column("wall_s", "duration", "duration", "min"),  # the run's ended_at - started_at
    Column("final_accuracy", "final acc", "pct", "max"),
    Column("best_accuracy", "best acc", "pct", "max"),
    # Seconds of training (from the first iteration) to the target; start-up is its own column.
    Column("time_to_target_s", "to target s", "secs", "min"),
    Column("startup_s", "start-up s", "secs", "min"),
    Column("samples_per_s", "samples/s", "rate", "max"),
    Column("staleness_mean", "stale mean", "num", "min"),
    Column("staleness_p95", "stale p95", "int", "min"),
    Column("idle_fraction", "idle", "pct", "min"),
    Column("bytes_per_sample", "bytes/sample", "rate", "min"),
    # Dense push bytes / push bytes sent: the push filter's saving (1.00x without one).
    Column("push_reduction", "push reduction", "speedup", "max"),
    Column("speedup", "speedup", "speedup", "max"),
    # More busy processes than cores: the run's timings measure CPU contention too.
    Column("oversubscribed", "oversubscribed", "flag"),
)
_NOT_A_DIFFERENCE = {"name"}  # the name column shows it (and may differ from the config)


def compare(
    engine: Engine,
    records: Sequence[RunRecord],
    *,
    target: float | None = None,
    baseline: RunRecord | None = None,
    show_all: bool = False,
    measure: Measure | None = None,
) -> Comparison:
    """The comparison table of ``records``; speedup is baseline time-to-target / the run's."""
    if baseline is not None and target is None:
        raise UsageError("--baseline compares time to target: give --target ACCURACY too")
    if measure is None:
        def measure(run_id: str, goal: float | None) -> RunMetrics:
            return run_metrics(engine, run_id, target=goal)
    measured = {r.summary.id: measure(r.summary.id, target) for r in records}
    base_time = None
    if baseline is not None:
        base = measured.get(baseline.summary.id) or measure(baseline.summary.id, target)
        base_time = base.time_to_target_s
    config_keys = _config_columns(records, show_all)
    rows = [_row(r, measured[r.summary.id], config_keys, base_time) for r in records]
    metrics = [
        c
        for c in _METRICS
        if (c.key != "time_to_target_s" or target is not None)
        and (c.key != "speedup" or baseline is not None)
    ]
    config_columns = tuple(Column(k, k, "config") for k in config_keys)
    return Comparison((*_HEAD, *config_columns, *metrics), rows, target)


def _config_columns(records: Sequence[RunRecord], show_all: bool) -> list[str]:
    flats = [{**flatten(r.config), **{f"tag.{k}": v for k, v in r.tags.items()}} for r in records]
    keys = sorted({k for flat in flats for k in flat} - _NOT_A_DIFFERENCE)
    if show_all:
        return keys
    return [k for k in keys if len({text(f.get(k, None)) for f in flats}) > 1]


def _row(
    record: RunRecord, metrics: RunMetrics, config_keys: list[str], base_time: float | None
) -> dict[str, Any]:
    run = record.summary
    flat = {**flatten(record.config), **{f"tag.{k}": v for k, v in record.tags.items()}}
    reached = metrics.time_to_target_s
    return {
        "id": run.id,
        "name": run.name,
        **{k: flat.get(k) for k in config_keys},
        "status": run.status,
        "wall_s": run.duration_s,
        "final_accuracy": run.final_accuracy,
        "best_accuracy": run.best_accuracy,
        "time_to_target_s": reached,
        "startup_s": metrics.startup_s,
        "samples_per_s": metrics.samples_per_s,
        "staleness_mean": metrics.staleness_mean,
        "staleness_p95": metrics.staleness_p95,
        "idle_fraction": metrics.idle_fraction,
        "bytes_per_sample": metrics.bytes_per_sample,
        "push_reduction": metrics.push_reduction,
        "speedup": base_time / reached if base_time is not None and reached else None,
        "oversubscribed": metrics.oversubscribed is not None,
    }


def sort_rows(comparison: Comparison, sort_by: str | None, top: int | None) -> Comparison:
    """Best first on a metric column (blanks last), ascending on any other; then the first N."""
    rows = list(comparison.rows)
    if sort_by is not None:
        column = _find_column(comparison, sort_by)
        present = [r for r in rows if r.get(column.key) is not None]
        blank = [r for r in rows if r.get(column.key) is None]
        present.sort(key=lambda r: _sort_key(r[column.key]), reverse=column.better == "max")
        rows = present + blank
    if top is not None:
        rows = rows[: max(0, top)]
    return Comparison(comparison.columns, rows, comparison.target)


_SORT_ALIASES = {"time_to_target": "time_to_target_s", "wall": "wall_s",
                 "throughput": "samples_per_s", "accuracy": "final_accuracy"}


def sorts_by_time_to_target(sort_by: str | None) -> bool:
    """Whether ``--sort-by`` names the time-to-target column, which exists only with a target."""
    return sort_by is not None and _SORT_ALIASES.get(sort_by, sort_by) in (
        "time_to_target_s", "to target s")


def _find_column(comparison: Comparison, name: str) -> Column:
    key = _SORT_ALIASES.get(name, name)
    for column in comparison.columns:
        if key in (column.key, column.header):
            return column
    if key == "speedup":
        raise UsageError("sorting by speedup needs --baseline RUN")
    if key == "time_to_target_s":  # the CLI supplies a default target; a caller of the API may not
        raise UsageError(f"sorting by {name} needs a target accuracy")
    keys = ", ".join(c.key for c in comparison.columns)
    raise UsageError(f"cannot sort by {name!r}: the columns are {keys}")


def _sort_key(value: Any) -> tuple[int, float, str]:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (0, float(value), "")
    return (1, 0.0, text(value))


def best_values(comparison: Comparison) -> dict[str, Any]:
    """The best value of each metric column, where at least two runs have one."""
    best: dict[str, Any] = {}
    for column in comparison.columns:
        values = [r[column.key] for r in comparison.rows if r.get(column.key) is not None]
        if column.better is None or len(values) < 2 or len(set(values)) < 2:
            continue
        best[column.key] = max(values) if column.better == "max" else min(values)
    return best


def comparison_for(
    engine: Engine,
    selectors: list[str],
    where: list[str],
    *,
    target: float | None = None,
    baseline: str | None = None,
    show_all: bool = False,
    sort_by: str | None = None,
    top: int | None = None,
    per_run: bool = False,
    crash_after_s: float,
    metric: str | None = None,
) -> Comparison:
    """The table ``psctl compare`` prints for these arguments (the dashboard shows the same).

    Runs that share a group (``launch --repeat``) become one row of means and standard
    deviations unless ``per_run``; a group's rows then need a target, which defaults to
    DEFAULT_TARGET. ``crash_after_s``: seconds without a heartbeat after which a running run
    counts as crashed (each face reads it from ``PSCTL_CRASH_AFTER_S``). ``metric``: a metric
    the runs' code logged (``psctl.log``) adds its final and mean columns."""
    from engine.analysis.groups import aggregate, has_groups
    from engine.analysis.selection import select_runs
    from engine.analysis.user_metrics import is_user_metric, with_user_metric
    from engine.db.metrics import run_records
    from engine.db.queries import resolve_run

    records = select_runs(engine, selectors, where, crash_after_s=crash_after_s)
    base = None
    if baseline is not None:
        base_id = resolve_run(engine, baseline)
        base = run_records(engine, [base_id], crash_after_s=crash_after_s)[0]
    grouped = not per_run and has_groups(records)
    if grouped and target is None:
        target = DEFAULT_TARGET
    table = compare(engine, records, target=target, baseline=base, show_all=show_all)
    if is_user_metric(metric):
        table = with_user_metric(engine, table, str(metric))
    if grouped:
        table = aggregate(table, records, base)
    return sort_rows(table, sort_by, top)
