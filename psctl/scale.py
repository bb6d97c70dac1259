"""``psctl scale RUN --workers N`` / ``--servers N``: add workers or servers to a running job,
or let some leave. It attaches to the run's coordinator, asks, and prints the answer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from engine.errors import LaunchError
from engine.plan import parse_config
from engine.roles.membership import check_count, check_scalable, read_control_credential
from engine.stopping import run_processes
from engine.transport.attach import Attachment
from engine.transport.control import Lost
from engine.wire.messages import Scale, ScaleAnswer
from psctl.runstate import run_and_event

ANSWER_WAIT_S = 15.0


def scale_run(db: Path, selector: str, count: int, *, role: str = "workers") -> dict[str, Any]:
    """Ask the running job for ``count`` workers (or servers); returns the coordinator's
    answer (the ``membership``, ``server_membership`` or ``scale_refused`` event it recorded),
    or raises LaunchError."""
    check_count(role, count)
    run_id, row, listening = run_and_event(db, selector, "coordinator_listening")
    if row.status != "running" or not run_processes(db, run_id):
        raise LaunchError(f"run {run_id[:8]} ({row.name}) is not running; only a running job "
                          f"can change its {role}")
    folder, address = (listening or {}).get("folder"), (listening or {}).get("address")
    if not (isinstance(folder, str) and isinstance(address, str)):
        raise LaunchError(f"run {run_id[:8]} does not say where its folder is (started by an "
                          "older psctl, or not by psctl launch)")
    if role == "workers":
        config = parse_config(json.loads(row.config_json))
        check_scalable(config.sync.model, config.learning.rule, config.train.push_every)
    link = Attachment.open(address, "scale", token=read_control_credential(Path(folder)),
                           timeout=ANSWER_WAIT_S)
    try:
        link.send(Scale(role="workers" if role == "workers" else "servers", count=count))
        answer = link.next(ANSWER_WAIT_S)
    finally:
        link.close()
    if isinstance(answer, ScaleAnswer):
        return {"kind": answer.kind, **answer.detail}
    if isinstance(answer, Lost):
        raise LaunchError(f"run {run_id[:8]} ended before it answered ({answer.reason})")
    raise LaunchError(f"run {run_id[:8]} did not answer within {ANSWER_WAIT_S:g} s")
