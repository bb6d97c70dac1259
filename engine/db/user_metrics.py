"""Reading the metrics a run's own code logged (``psctl.log``, the ``user_metrics`` table): their
names, each one's series per process (downsampled for the run page), a run's final and mean
value of one (``psctl compare --metric NAME``) and its curve against seconds of training
(``psctl compare --plot --metric NAME``)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, and_, func, select, text

from engine.db.clock import TrainingClock, training_clock
from engine.db.queries import CRASH_AFTER_S, effective_status
from engine.db.schema import runs, translate_errors, user_metrics

# Points per series on the run page: a longer series is averaged over runs of iterations.
DEFAULT_POINTS = 1000
MAX_POINTS = 10000

# One series cut into at most :points buckets of consecutive iterations (steps, for the
# evaluator), each bucket the mean of its rows: a contiguous range of the primary key.
_SERIES_SQL = text("""
    SELECT avg(iteration), avg(at), avg(value), count(*) FROM user_metrics
    WHERE run_id = :run AND name = :name AND role = :role AND rank = :rank
    GROUP BY (iteration - :lo) * :points / :span
    ORDER BY min(iteration)
""")


@dataclass
class Series:
    """One process's values of one metric, in iteration order."""

    role: str
    rank: int
    iteration: list[float] = field(default_factory=list)  # a bucket's mean iteration
    at: list[float] = field(default_factory=list)
    value: list[float] = field(default_factory=list)
    rows: int = 0  # the rows behind the points (more than the points where downsampled)

    def to_dict(self) -> dict[str, Any]:
        return {"role": self.role, "rank": self.rank, "iteration": self.iteration, "at": self.at,
                "value": self.value, "rows": self.rows}


def run_clock(engine: Engine, run_id: str) -> tuple[TrainingClock, str]:
    """The run's clock (what the run page's time axis counts from: engine/db/clock.py) and its
    status, ``crashed`` derived."""
    with translate_errors(f"reading run {run_id}"), engine.connect() as conn:
        started, stored, beat = conn.execute(
            select(runs.c.started_at, runs.c.status, runs.c.heartbeat_at)
            .where(runs.c.id == run_id)).one()
        clock = training_clock(conn, run_id, float(started))
    return clock, effective_status(str(stored), float(beat), time.time(), CRASH_AFTER_S)


def metric_names(engine: Engine, run_id: str) -> list[str]:
    """The names a run logged, sorted."""
    with translate_errors(f"reading the metric names of run {run_id}"), engine.connect() as conn:
        return _names(conn, run_id)


def _names(conn: Connection, run_id: str) -> list[str]:
    # One index seek per name (the key starts run_id, name) instead of a scan of every row.
    um = user_metrics.c
    found: list[str] = []
    while True:
        after = [um.name > found[-1]] if found else []
        name = conn.execute(select(func.min(um.name))
                            .where(um.run_id == run_id, *after)).scalar()
        if name is None:
            return found
        found.append(str(name))


def metric_series(engine: Engine, run_id: str,
                  points: int = DEFAULT_POINTS) -> dict[str, list[Series]]:
    """Each metric's series per process (workers by rank, then the evaluator), at most
    ``points`` points each: consecutive iterations averaged where there are more."""
    um = user_metrics.c
    out: dict[str, list[Series]] = {}
    with translate_errors(f"reading the metrics of run {run_id}"), engine.connect() as conn:
        for name, role, rank in _processes(conn, run_id):
            mine = (um.run_id == run_id, um.name == name, um.role == role, um.rank == rank)
            # Two seeks (min and max apart: SQLite seeks for a lone min or max only).
            lo = conn.execute(select(func.min(um.iteration)).where(*mine)).scalar_one()
            hi = conn.execute(select(func.max(um.iteration)).where(*mine)).scalar_one()
            series = Series(role, rank)
            for iteration, at, value, count in conn.execute(_SERIES_SQL, {
                    "run": run_id, "name": name, "role": role, "rank": rank, "lo": lo,
                    "points": max(1, points), "span": hi - lo + 1}):
                series.iteration.append(float(iteration))
                series.at.append(float(at))
                series.value.append(float(value))
                series.rows += int(count)
            out.setdefault(name, []).append(series)
    for found in out.values():
        found.sort(key=lambda s: (s.role != "worker", s.rank))
    return out


def _processes(conn: Connection, run_id: str) -> list[tuple[str, str, int]]:
    """(name, role, rank) of every series, by seeks down the primary key, not a scan."""
    um = user_metrics.c
    found = []
    for name in _names(conn, run_id):
        role: str | None = None
        while (role := conn.execute(select(func.min(um.role)).where(
                um.run_id == run_id, um.name == name,
                *([um.role > role] if role is not None else []))).scalar()) is not None:
            rank: int | None = None
            while (rank := conn.execute(select(func.min(um.rank)).where(
                    um.run_id == run_id, um.name == name, um.role == role,
                    *([um.rank > rank] if rank is not None else []))).scalar()) is not None:
                found.append((str(name), str(role), int(rank)))
    return found


@dataclass(frozen=True)
class Summary:
    """One metric of one run: from its workers when they logged it, else from the evaluator."""

    role: str
    final: float  # the mean over the processes of each one's last value
    mean: float  # the mean of every value


def metric_summary(engine: Engine, run_id: str, name: str) -> Summary | None:
    """``name``'s final and mean value in the run, or None where it never logged it."""
    um = user_metrics.c
    with translate_errors(f"reading metric {name} of run {run_id}"), engine.connect() as conn:
        for role in ("worker", "evaluator"):
            mine = and_(um.run_id == run_id, um.name == name, um.role == role)
            mean = conn.execute(select(func.avg(um.value)).where(mine)).scalar()
            if mean is None:
                continue
            last = (select(um.rank, func.max(um.iteration).label("last"))
                    .where(mine).group_by(um.rank).subquery())
            final = conn.execute(
                select(func.avg(um.value)).where(mine).join_from(
                    user_metrics, last,
                    and_(um.rank == last.c.rank, um.iteration == last.c.last))).scalar()
            return Summary(role, float(mean if final is None else final), float(mean))
    return None


def training_series(engine: Engine, run_id: str, name: str) -> list[tuple[float, float]]:
    """(seconds of training, value) of ``name`` for plotting against other runs: per iteration
    the mean over the workers (or each evaluation's, where only the evaluator logged it), timed
    from the run's first iteration and without a resumed run's downtime, as the evaluations'
    plot is."""
    um = user_metrics.c
    with translate_errors(f"reading metric {name} of run {run_id}"), engine.connect() as conn:
        clock = training_clock(conn, run_id)
        for role in ("worker", "evaluator"):
            rows = conn.execute(
                select(func.avg(um.at), func.avg(um.value))
                .where(um.run_id == run_id, um.name == name, um.role == role)
                .group_by(um.iteration).order_by(um.iteration)).all()
            if rows:
                return [(clock.seconds(float(at)), float(value)) for at, value in rows]
    return []
