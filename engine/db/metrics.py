"""Per-run comparison metrics, aggregated by SQLite so that a run of 10^6 iterations stays cheap.

Each metric is ``None`` where it is undefined (no iterations yet, no evaluation reached the
target), never a misleading zero. Definitions (docs/cli.md repeats them for users):

- ``time_to_target_s``: seconds of training (:mod:`engine.db.clock`: from the first iteration,
  less a resumed run's downtime) to the first evaluation (by time) with accuracy >= target.
- ``samples_per_s``: samples / training wall time (first iteration start to last iteration end,
  less a resumed run's downtime: :mod:`engine.db.downtime`).
- ``startup_s``: the run's start-up, one number (:mod:`engine.db.clock`).
- ``staleness_mean`` / ``staleness_p95``: over every iteration; p95 by nearest rank.
- ``idle_fraction``: sum(wait_s) / sum(ended_at - started_at) over every iteration.
- ``bytes_per_sample``: (bytes_sent + bytes_received) / samples.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, func, select

from engine.db.clock import TrainingClock, training_clock
from engine.db.queries import (
    CRASH_AFTER_S,
    Dictable,
    RunSummary,
    oversubscription_note,
    run_summaries,
)
from engine.db.schema import evaluations, iterations, runs, tags, translate_errors

EVALUATION_METRICS = ("accuracy", "loss", "step", "epoch")


@dataclass(frozen=True)
class RunRecord(Dictable):
    """What selecting and filtering runs needs: cheap to read for every run in the database."""

    summary: RunSummary
    config: dict[str, Any]
    tags: dict[str, str]


@dataclass(frozen=True)
class RunMetrics(Dictable):
    run_id: str
    samples: int
    train_wall_s: float | None
    time_to_target_s: float | None
    samples_per_s: float | None
    staleness_mean: float | None
    staleness_p95: int | None
    idle_fraction: float | None
    bytes_per_sample: float | None
    oversubscribed: str | None = None  # the coordinator's warning, if the run had one
    # Dense float32 push bytes / push bytes sent: what the push filter saved (1.0 without one;
    # None for runs recorded before schema 5).
    push_reduction: float | None = None
    # From the command's start (else the run's recorded start) to its first iteration, which the
    # times above leave out (they count from the first iteration): engine/db/clock.py.
    startup_s: float | None = None


def run_records(
    engine: Engine, run_ids: Sequence[str], *, crash_after_s: float = CRASH_AFTER_S
) -> list[RunRecord]:
    """Summary, stored configuration and tags of each run, in the order given."""
    summaries = run_summaries(engine, run_ids, crash_after_s=crash_after_s)
    ids = list(run_ids)
    with translate_errors("reading run configurations"), engine.connect() as conn:
        stmt = select(runs.c.id, runs.c.config_json).where(runs.c.id.in_(ids))
        configs = {str(run_id): text for run_id, text in conn.execute(stmt)}
        found: dict[str, dict[str, str]] = {}
        for run_id, key, value in conn.execute(
            select(tags.c.run_id, tags.c.key, tags.c.value).where(tags.c.run_id.in_(ids))
        ):
            found.setdefault(run_id, {})[key] = value
    return [
        RunRecord(summary=s, config=_loads(configs[s.id]), tags=found.get(s.id, {}))
        for s in summaries
    ]


def run_metrics(engine: Engine, run_id: str, *, target: float | None = None) -> RunMetrics:
    """The comparison metrics of one run: two scans of its iterations, one index lookup."""
    with translate_errors(f"measuring run {run_id}"), engine.connect() as conn:
        totals = _iteration_totals(conn, run_id)
        p95 = _staleness_p95(conn, run_id, totals["n"])
        clock = training_clock(conn, run_id)
        reached = (None if target is None or totals["first_start"] is None
                   else _time_to_target(conn, run_id, target, clock))
        crowded = oversubscription_note(conn, run_id)
    samples = int(totals["samples"] or 0)
    wall = None if totals["n"] == 0 else clock.seconds(totals["last_end"])
    traffic = (totals["bytes_sent"] or 0) + (totals["bytes_received"] or 0)
    return RunMetrics(
        run_id=run_id,
        samples=samples,
        train_wall_s=wall,
        time_to_target_s=reached,
        samples_per_s=_ratio(samples, wall),
        staleness_mean=totals["staleness_mean"],
        staleness_p95=p95,
        idle_fraction=_ratio(totals["wait_s"], totals["busy_s"]),
        bytes_per_sample=_ratio(traffic, samples) if totals["n"] else None,
        oversubscribed=crowded,
        push_reduction=_ratio(totals["push_bytes_dense"] or 0, totals["push_bytes"] or 0),
        startup_s=clock.startup_s,
    )


def evaluation_series(
    engine: Engine, run_id: str, metric: str = "accuracy"
) -> list[tuple[float, float]]:
    """(seconds of training, value) of every evaluation of a run, in time order, for plotting:
    seconds from the run's first iteration, so that start-up is off the axis, and without a
    resumed run's downtime (a run without iterations counts from its start)."""
    if metric not in EVALUATION_METRICS:
        raise ValueError(f"unknown metric {metric!r}; expected one of {EVALUATION_METRICS}")
    ev = evaluations.c
    stmt = (
        select(ev.at, ev[metric]).where(ev.run_id == run_id)
        .order_by(ev.at, ev.id)
    )
    with translate_errors(f"reading evaluations of run {run_id}"), engine.connect() as conn:
        clock = training_clock(conn, run_id)
        return [(clock.seconds(at), float(y)) for at, y in conn.execute(stmt)]


def _iteration_totals(conn: Connection, run_id: str) -> dict[str, Any]:
    it = iterations.c
    stmt = select(
        func.count().label("n"),
        func.sum(it.samples).label("samples"),
        func.min(it.started_at).label("first_start"),
        func.max(it.ended_at).label("last_end"),
        func.sum(it.wait_s).label("wait_s"),
        func.sum(it.ended_at - it.started_at).label("busy_s"),
        func.avg(it.staleness).label("staleness_mean"),
        func.sum(it.bytes_sent).label("bytes_sent"),
        func.sum(it.bytes_received).label("bytes_received"),
        func.sum(it.push_bytes).label("push_bytes"),
        func.sum(it.push_bytes_dense).label("push_bytes_dense"),
    ).where(it.run_id == run_id)
    return dict(conn.execute(stmt).one()._mapping)


def _staleness_p95(conn: Connection, run_id: str, count: int) -> int | None:
    # Staleness takes few distinct values, so a histogram is tiny even for 10^6 rows.
    if count == 0:
        return None
    it = iterations.c
    stmt = (
        select(it.staleness, func.count())
        .where(it.run_id == run_id)
        .group_by(it.staleness)
        .order_by(it.staleness)
    )
    rank = math.ceil(0.95 * count)
    seen = 0
    histogram = conn.execute(stmt).all()
    for value, n in histogram:
        seen += n
        if seen >= rank:
            return int(value)
    return int(histogram[-1][0]) if histogram else None


def _time_to_target(conn: Connection, run_id: str, target: float,
                    clock: TrainingClock) -> float | None:
    """Seconds of training, from the first iteration, to the first evaluation at or above
    ``target``: start-up is not counted (it is ``startup_s``), nor a resumed run's downtime."""
    ev = evaluations.c
    stmt = (
        select(ev.at)
        .where(ev.run_id == run_id, ev.accuracy >= target)
        .order_by(ev.at, ev.id)
        .limit(1)
    )
    value = conn.execute(stmt).scalar()
    return None if value is None else max(0.0, clock.seconds(float(value)))


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0:
        return None
    return num / den


def _loads(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
