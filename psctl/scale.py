"""``psctl scale RUN --workers N``: add workers to a running job, or let some leave."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from engine.config import parse_config
from engine.db import open_engine
from engine.db.queries import resolve_run
from engine.db.schema import events, runs, translate_errors
from engine.errors import LaunchError
from engine.roles.membership import check_scalable, request_scale
from engine.stopping import run_processes

ANSWER_WAIT_S = 15.0
_POLL_S = 0.2


def scale_run(db: Path, selector: str, workers: int) -> dict[str, Any]:
    """Ask the running job for ``workers`` workers; returns the coordinator's answer (its
    ``membership`` or ``scale_refused`` event), or raises LaunchError."""
    engine = open_engine(db, readonly=True)
    try:
        run_id = resolve_run(engine, selector)
        row, folder, since = _run_and_folder(engine, run_id)
    finally:
        engine.dispose()
    config = parse_config(json.loads(row.config_json))
    if row.status != "running" or not run_processes(db, run_id):
        raise LaunchError(f"run {run_id[:8]} ({row.name}) is not running; only a running job "
                          "can change its workers")
    if folder is None:
        raise LaunchError(f"run {run_id[:8]} does not say where its folder is (started by an "
                          "older psctl, or not by psctl launch)")
    check_scalable(config.sync.model, config.learning.rule, config.train.push_every)
    request_scale(Path(folder), workers)
    return _answer(db, run_id, since)


def _run_and_folder(engine: sa.Engine, run_id: str) -> tuple[Any, str | None, float]:
    with translate_errors(f"reading run {run_id}"), engine.connect() as conn:
        row = conn.execute(sa.select(runs).where(runs.c.id == run_id)).one()
        listening = conn.execute(
            sa.select(events.c.detail).where(events.c.run_id == run_id,
                                             events.c.kind == "coordinator_listening")
            .order_by(events.c.at.desc()).limit(1)).scalar()
        latest = conn.execute(sa.select(sa.func.max(events.c.id)).where(
            events.c.run_id == run_id)).scalar()
    folder = json.loads(listening).get("folder") if listening else None
    return row, folder, float(latest or 0)


def _answer(db: Path, run_id: str, after_id: float) -> dict[str, Any]:
    deadline = time.monotonic() + ANSWER_WAIT_S
    query = sa.select(events.c.kind, events.c.detail).where(
        events.c.run_id == run_id, events.c.id > after_id,
        events.c.kind.in_(("membership", "scale_refused"))).order_by(events.c.id).limit(1)
    engine = open_engine(db, readonly=True)
    try:
        while time.monotonic() < deadline:
            with translate_errors("reading the answer"), engine.connect() as conn:
                found = conn.execute(query).first()
            if found is not None:
                return {"kind": found.kind, **json.loads(found.detail)}
            time.sleep(_POLL_S)
    finally:
        engine.dispose()
    raise LaunchError(f"run {run_id[:8]} did not answer within {ANSWER_WAIT_S:g} s (is it "
                      "still training? a job takes requests once training has started)")
