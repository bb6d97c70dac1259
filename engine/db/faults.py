"""A run's faults and what the system did about them, in words (``psctl runs show``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, select

from engine.db.schema import events, parse_json

MAX_SHOWN = 40  # the first ones; `psctl export` has them all

# kind -> its one-line description from the event's detail
DESCRIPTIONS: dict[str, Callable[[dict[str, Any]], str]] = {
    "fault_injected": lambda d: f"injected {d.get('spec')}",
    "fault_skipped": lambda d: f"skipped {d.get('spec')}: {d.get('reason')}",
    "worker_lost": lambda d: (f"worker {d.get('rank')} lost (restart {d.get('restart')} of "
                              f"{d.get('max_restarts')})"),
    "worker_rejoined": lambda d: (f"worker {d.get('rank')} rejoined"
                                  + (f" on {d['node']}" if d.get("node") else "")),
    "evaluator_lost": lambda d: (f"evaluator lost (restart {d.get('restart')} of "
                                 f"{d.get('max_restarts')})"),
    "evaluator_rejoined": lambda d: "evaluator rejoined",
    "process_error": lambda d: f"{d.get('role')} {d.get('rank')} failed: {d.get('message')}",
    "hello_refused": lambda d: f"refused a connection from {d.get('remote')}: {d.get('reason')}",
    "server_lost": lambda d: f"server {d.get('rank')} lost",
    "heartbeat_refused": lambda d: (f"ignored a heartbeat as server {d.get('rank')} "
                                    f"({d.get('refused')} so far): {d.get('reason')}"),
    "server_unresponsive": lambda d: (f"server {d.get('rank')} fenced (killed): "
                                      f"{d.get('reason') or 'it did not answer'}"),
    "server_slow": lambda d: f"server {d.get('rank')} slow, not fenced: {d.get('reason')}",
    "fence_withheld": lambda d: str(d.get("message")),
    "diverged": lambda d: str(d.get("message") or f"the model diverged at step {d.get('step')}"),
    "task_failed": lambda d: f"the coordinator's {d.get('task')} failed: {d.get('error')}",
    "failover": lambda d: (f"shard {d.get('index')} failed over from server {d.get('lost')} to "
                           f"server {d.get('primary')}"),
    "failover_complete": lambda d: (f"shard {d.get('index')}: first pull served by its new "
                                    f"primary {d.get('seconds')} s after the loss"),
    "checkpoint_incomplete": lambda d: f"checkpoint {d.get('seq')} incomplete: {d.get('reason')}",
    "resumed": lambda d: f"resumed from checkpoint {d.get('checkpoint')}",
    "resume_failed": lambda d: (f"the resume failed before training again, so the run stays "
                                f"{d.get('kept')}: {d.get('reason')}"),
    "membership": lambda d: (f"scaled to {d.get('workers')} workers (joining "
                             f"{d.get('joining') or '-'}, leaving {d.get('leaving') or '-'})"),
    "scale_refused": lambda d: (f"scaling to {d.get('workers') or d.get('servers')} "
                                f"{'workers' if d.get('workers') else 'servers'} refused: "
                                f"{d.get('reason')}"),
    "server_rejoined": lambda d: f"server {d.get('rank')} started again",
    "rereplicated": lambda d: (f"shard {d.get('index')}: copy handed to server {d.get('rank')} "
                               f"in {d.get('seconds')} s (acks held {d.get('held_s')} s), "
                               f"chain {d.get('chain')}"),
    "primary_moved": lambda d: (f"shard {d.get('index')}: served by server {d.get('rank')} "
                                f"instead of {d.get('previous')} ({d.get('seconds')} s)"),
    "copy_dropped_from": lambda d: f"shard {d.get('index')}: server {d.get('rank')} dropped it",
    "rereplication_refused": lambda d: (f"server {d.get('rank')} cannot take copies back: "
                                        f"{d.get('reason')}"),
    "rereplication_failed": lambda d: (f"shard {d.get('index')}: handing a copy back failed "
                                       f"(try {d.get('attempt')}): {d.get('reason')}"),
    "move_failed": lambda d: f"shard {d.get('index')}: a move failed: {d.get('reason')}",
    "server_membership": lambda d: (f"scaled to {d.get('servers')} servers (joining "
                                    f"{d.get('joining') or '-'}, leaving "
                                    f"{d.get('leaving') or '-'})"),
    "server_left": lambda d: f"server {d.get('rank')} left",
}


def fault_timeline(conn: Connection, run_id: str,
                   seconds: Callable[[float], float]) -> list[tuple[float, str, str]]:
    """(when, kind, description) of its fault-tolerance events, each time ``seconds`` of its
    moment: the run's seconds of training (engine.db.clock.TrainingClock.seconds)."""
    rows = conn.execute(
        select(events.c.at, events.c.kind, events.c.detail)
        .where(events.c.run_id == run_id, events.c.kind.in_(tuple(DESCRIPTIONS)))
        .order_by(events.c.at, events.c.id).limit(MAX_SHOWN)).all()
    return [(seconds(row.at), row.kind, DESCRIPTIONS[row.kind](parse_json(row.detail)))
            for row in rows]


def crash_traceback(conn: Connection, run_id: str) -> tuple[str, str] | None:
    """The message and traceback of the first role of the run that crashed and said so
    (``process_error``), or None."""
    row = conn.execute(
        select(events.c.detail).where(events.c.run_id == run_id,
                                      events.c.kind == "process_error")
        .order_by(events.c.id).limit(1)).first()
    if row is None:
        return None
    found = parse_json(row.detail)
    message, text = found.get("message"), found.get("traceback")
    if not (isinstance(message, str) and isinstance(text, str) and text.strip()):
        return None
    return message, text
