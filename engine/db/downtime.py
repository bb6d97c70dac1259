"""A resumed run's downtime, and the training clock that leaves it out.

A run killed and continued with ``psctl resume`` keeps one id and one set of rows, so its wall
time spans the minutes it was down. Rates, durations, time to target and plots must not count
them (a resumed run would look slower than an uninterrupted one for having been stopped), and
no time or epoch may go back. Each ``resumed`` event marks one span: from the last iteration
that ended before it (or, without one, ``downtime_s`` before it, as the coordinator measured
from the run's last sign of life) to the first iteration that ended after it was resumed, so the
restart's start-up and the work redone since the checkpoint (whose rows the first pass already
recorded) are outside training time as well.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from sqlalchemy import Connection, func, select

from engine.db.schema import events, iterations, parse_json


@dataclass(frozen=True)
class Downtime:
    """The spans (unix start, unix end) a run was not training, in time order."""

    spans: tuple[tuple[float, float], ...] = ()
    _ends: tuple[float, ...] = field(default=(), repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_ends", tuple(end for _, end in self.spans))

    def within(self, start: float, end: float) -> float:
        """Seconds of downtime inside [start, end]."""
        return sum(max(0.0, min(end, b) - max(start, a)) for a, b in self.spans)

    def training_s(self, first: float, t: float) -> float:
        """Seconds of training from ``first`` (the first iteration's start) to ``t``."""
        return max(0.0, t - first - self.within(first, t))

    def resumes_before(self, t: float) -> int:
        """How many spans ended at or before ``t`` (which pass of the run ``t`` lies in)."""
        return bisect.bisect_right(self._ends, t)

    @property
    def total_s(self) -> float:
        return sum(b - a for a, b in self.spans)

    def to_list(self) -> list[dict[str, float]]:
        return [{"start": a, "end": b, "seconds": b - a} for a, b in self.spans]


NONE = Downtime()


def run_downtime(conn: Connection, run_id: str) -> Downtime:
    """The downtime spans of one run (none for a run never resumed: one indexed lookup)."""
    ev = events.c
    resumes = conn.execute(select(ev.at, ev.detail)
                           .where(ev.run_id == run_id, ev.kind == "resumed")
                           .order_by(ev.at, ev.id)).all()
    spans: list[tuple[float, float]] = []
    for at, detail in resumes:
        start, end = _span(conn, run_id, float(at), parse_json(detail).get("downtime_s"))
        if spans and start < spans[-1][1]:  # resumed again before it trained: one span
            start = spans.pop()[0]
        if end > start:
            spans.append((start, end))
    return Downtime(tuple(spans))


def _span(conn: Connection, run_id: str, at: float,
          recorded: object) -> tuple[float, float]:
    it = iterations.c
    before = conn.execute(select(func.max(it.ended_at))
                          .where(it.run_id == run_id, it.ended_at <= at)).scalar()
    if before is None:
        down = float(recorded) if isinstance(recorded, int | float) else 0.0
        before = at - max(0.0, down)
    # Through the (run_id, ended_at) index: the first row ended after the resume, and its start.
    after = conn.execute(select(it.started_at)
                         .where(it.run_id == run_id, it.ended_at > at)
                         .order_by(it.ended_at).limit(1)).scalar()
    return float(before), float(at if after is None else max(at, after))
