"""``psctl scale RUN --workers N`` / ``--servers N``: add workers or servers to a running job,
or let some leave."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from engine.db import open_engine
from engine.db.schema import events, translate_errors
from engine.errors import LaunchError
from engine.plan import parse_config
from engine.roles.membership import check_scalable, request_scale, request_servers
from engine.stopping import run_processes
from psctl.runstate import latest_event_id, run_and_event

ANSWER_WAIT_S = 15.0
_POLL_S = 0.2


def scale_run(db: Path, selector: str, count: int, *, role: str = "workers") -> dict[str, Any]:
    """Ask the running job for ``count`` workers (or servers); returns the coordinator's
    answer (its ``membership``, ``server_membership`` or ``scale_refused`` event), or raises
    LaunchError."""
    run_id, row, listening = run_and_event(db, selector, "coordinator_listening")
    folder = None if listening is None else listening.get("folder")
    since = latest_event_id(db, run_id)
    config = parse_config(json.loads(row.config_json))
    if row.status != "running" or not run_processes(db, run_id):
        raise LaunchError(f"run {run_id[:8]} ({row.name}) is not running; only a running job "
                          f"can change its {role}")
    if folder is None:
        raise LaunchError(f"run {run_id[:8]} does not say where its folder is (started by an "
                          "older psctl, or not by psctl launch)")
    if role == "servers":
        request_servers(Path(folder), count)
        return _answer(db, run_id, since, ("server_membership", "scale_refused"))
    check_scalable(config.sync.model, config.learning.rule, config.train.push_every)
    request_scale(Path(folder), count)
    return _answer(db, run_id, since, ("membership", "scale_refused"))


def _answer(db: Path, run_id: str, after_id: int, kinds: tuple[str, ...]) -> dict[str, Any]:
    deadline = time.monotonic() + ANSWER_WAIT_S
    query = sa.select(events.c.kind, events.c.detail).where(
        events.c.run_id == run_id, events.c.id > after_id,
        events.c.kind.in_(kinds)).order_by(events.c.id).limit(1)
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
