"""A run's one time base, for every view of it: seconds of training from its first iteration,
a resumed run's downtime left out (engine/db/downtime.py), and its start-up as one number.

Start-up counts from the command's start where the launcher said when that was (the run's first
``start_up`` event: a resume's own start-up lies inside its downtime), else from the run's
recorded start (a simulated run, ``psctl role``, a run from before start-up was recorded). The
``runs show`` tables, its JSON, ``compare``, the run page's charts (``clock`` in its snapshot)
and the compare page all read times through :class:`TrainingClock`; the dashboard's scripts
apply the same rule to the clock they are sent (``PS.trainingS`` in ``static/charts.js``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, func, select

from engine.db.downtime import NONE, Downtime, run_downtime
from engine.db.schema import events, iterations, parse_json, runs


@dataclass(frozen=True)
class TrainingClock:
    started_at: float  # the run's recorded start (runs.started_at)
    first_iteration_at: float | None  # None before the first iteration
    # From the command's start (else the run's recorded start) to the first iteration.
    startup_s: float | None
    downtime: Downtime = NONE

    @property
    def origin(self) -> float:
        """What training time counts from: the first iteration, else the run's start."""
        return self.started_at if self.first_iteration_at is None else self.first_iteration_at

    def seconds(self, t: float) -> float:
        """Seconds of training from the first iteration to the moment ``t``, a resumed run's
        downtime left out (a moment inside it reads as where training stopped); before the
        first iteration, during start-up, the seconds still to go, negative."""
        origin = self.origin
        return t - origin if t < origin else self.downtime.training_s(origin, t)

    def to_dict(self) -> dict[str, Any]:
        return {"first_iteration_at": self.first_iteration_at, "startup_s": self.startup_s,
                "downtime": self.downtime.to_list()}


def training_clock(conn: Connection, run_id: str,
                   started_at: float | None = None) -> TrainingClock:
    """The run's clock: index lookups only (one per worker for the first iteration), so that a
    live view can ask for it again as rows come."""
    if started_at is None:
        started = conn.execute(select(runs.c.started_at).where(runs.c.id == run_id)).scalar()
        started_at = float(started or 0.0)
    first = first_iteration_at(conn, run_id)
    origin = _command_started_at(conn, run_id)
    start = started_at if origin is None or first is None or origin > first else origin
    return TrainingClock(started_at=started_at, first_iteration_at=first,
                         startup_s=None if first is None else max(0.0, first - start),
                         downtime=run_downtime(conn, run_id))


def first_iteration_at(conn: Connection, run_id: str) -> float | None:
    """When the run's first iteration started: each worker's iteration 0 (or first recorded),
    by the primary key, never a scan of the run's rows."""
    it = iterations.c
    firsts = [conn.execute(select(it.started_at).where(it.run_id == run_id, it.worker == w)
                           .order_by(it.iteration).limit(1)).scalar()
              for w in distinct_workers(conn, run_id)]
    return min((float(f) for f in firsts if f is not None), default=None)


def distinct_workers(conn: Connection, run_id: str) -> list[int]:
    # A skip scan over the primary key: one O(log n) MIN per worker instead of reading every row.
    it = iterations.c
    found: list[int] = []
    last = -1
    while True:
        stmt = select(func.min(it.worker)).where(it.run_id == run_id, it.worker > last)
        nxt = conn.execute(stmt).scalar()
        if nxt is None:
            return found
        found.append(int(nxt))
        last = int(nxt)


def _command_started_at(conn: Connection, run_id: str) -> float | None:
    """When the command that launched the run started: its first ``start_up`` event's origin
    (a resume tells its own later)."""
    ev = events.c
    detail = conn.execute(select(ev.detail).where(ev.run_id == run_id, ev.kind == "start_up")
                          .order_by(ev.at, ev.id).limit(1)).scalar()
    if detail is None:
        return None
    origin = parse_json(detail).get("origin")
    return float(origin) if isinstance(origin, int | float) and not isinstance(origin, bool) \
        else None
