"""Where a run's start-up went, from its ``start_up`` event and its processes' joins.

The launcher tells the coordinator, once every role it started first has joined, the moments of
start-up counted from the command's start (``engine.launcher.StartUpClock``): the launcher began
(the command line's own start), the template was warm for the coordinator and for every role,
the coordinator listened, the roles were started, all joined; and the spans the template
measured (its imports, the data set). Each process's join says how long it took from its own
start (a fork, or a fresh Python) to its hello. Older runs have neither: None. The run's first
``start_up`` is the launch's (a resume's own start-up is part of its downtime); how long the
whole start-up took is the run's clock's one number (engine/db/clock.py).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, select

from engine.db.clock import TrainingClock
from engine.db.schema import events, parse_json

# The moments, in the order they happen, and how a person says them.
_MOMENTS = (
    ("launcher", "the launcher began"),
    ("template_stage_0", "template warm for the coordinator"),
    ("coordinator", "coordinator listening"),
    ("template_stage_1", "template warm for every role"),
    ("roles_started", "roles started"),
    ("joined", "all joined"),
)
_SPANS = (("template_stage_0_s", "its imports"), ("template_stage_1_s", "torch and the roles"),
          ("data_s", "the data set"))
_JOINS = ("process_joined", "worker_rejoined", "evaluator_rejoined", "server_rejoined")


@dataclass(frozen=True)
class StartUp:
    """A run's start-up: seconds from the command's start to each moment."""

    mode: str  # template, fresh, ray
    note: str | None
    moments: tuple[tuple[str, float], ...]  # (name, seconds), in time order
    spans: tuple[tuple[str, float], ...]  # (name, seconds)
    first_iteration_s: float | None  # the run's start-up: TrainingClock.startup_s
    joins: int  # processes that said their own start-up
    forked: int  # of which forked from the template
    role_start_median_s: float | None
    role_start_max_s: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "note": self.note, "moments": dict(self.moments),
                "spans": dict(self.spans), "first_iteration_s": self.first_iteration_s,
                "joins": self.joins, "forked": self.forked,
                "role_start_median_s": self.role_start_median_s,
                "role_start_max_s": self.role_start_max_s}

    def describe(self) -> str:
        """One paragraph for ``psctl runs show``, below the line that says how long start-up
        took: where it went, each moment from the command's start."""
        how = {"template": "roles forked from the warm template",
               "fresh": "each role a fresh Python", "ray": "roles in Ray actors"}.get(
                   self.mode, self.mode)
        head = f"where start-up went ({how}), from the command's start"
        names = dict(_MOMENTS)
        parts = [f"{names.get(name, name)} {seconds:.2f} s" for name, seconds in self.moments]
        spans = dict(_SPANS)
        took = [f"{spans.get(name, name)} {seconds:.2f} s" for name, seconds in self.spans]
        text = head + (": " + ", ".join(parts) if parts else "")
        if took:
            text += f" (the template took: {', '.join(took)})"
        if self.role_start_median_s is not None and self.role_start_max_s is not None:
            text += (f"; each process from its start to its hello: median "
                     f"{self.role_start_median_s:.3f} s, at most {self.role_start_max_s:.3f} s"
                     f" ({self.forked} of {self.joins} forked)")
        if self.note:
            text += f"; {self.note}"
        return text


def run_start_up(conn: Connection, run_id: str, clock: TrainingClock) -> StartUp | None:
    """The run's start-up, or None if its launcher said nothing of it (an older run, the
    simulator, ``psctl role``)."""
    ev = events.c
    detail = conn.execute(select(ev.detail).where(ev.run_id == run_id, ev.kind == "start_up")
                          .order_by(ev.at, ev.id).limit(1)).scalar()
    if detail is None:
        return None
    told = parse_json(detail)
    at = {str(k): v for k, v in dict(told.get("at") or {}).items() if _number(v) is not None}
    took = {str(k): v for k, v in dict(told.get("took") or {}).items()
            if _number(v) is not None}
    starts, forked = _role_starts(conn, run_id)
    order = [name for name, _ in _MOMENTS]
    return StartUp(
        mode=str(told.get("mode", "")), note=told.get("note") or None,
        moments=tuple(sorted(((name, float(at[name])) for name in at if name != "template"),
                             key=lambda m: (m[1], order.index(m[0]) if m[0] in order else 99))),
        spans=tuple((name, float(took[name])) for name, _ in _SPANS if name in took),
        first_iteration_s=clock.startup_s,
        joins=len(starts), forked=forked,
        role_start_median_s=statistics.median(starts) if starts else None,
        role_start_max_s=max(starts) if starts else None)


def _role_starts(conn: Connection, run_id: str) -> tuple[list[float], int]:
    ev = events.c
    starts, forked = [], 0
    for (detail,) in conn.execute(select(ev.detail).where(ev.run_id == run_id,
                                                          ev.kind.in_(_JOINS))):
        said = parse_json(detail)
        seconds = _number(said.get("start_s"))
        if seconds is not None:
            starts.append(seconds)
            forked += bool(said.get("forked"))
    return starts, forked


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)
