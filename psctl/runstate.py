"""A recorded run's row and its newest event of one kind: what ``psctl resume`` and ``psctl
scale`` start from."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from engine.db import open_engine
from engine.db.queries import resolve_run
from engine.db.schema import events, runs, translate_errors


def run_and_event(db: Path, selector: str, kind: str) -> tuple[str, Any, dict[str, Any] | None]:
    """(run id, its ``runs`` row, the detail of its newest ``kind`` event or None)."""
    engine = open_engine(db, readonly=True)
    try:
        run_id = resolve_run(engine, selector)
        with translate_errors(f"reading run {run_id}"), engine.connect() as conn:
            row = conn.execute(sa.select(runs).where(runs.c.id == run_id)).one()
            detail = conn.execute(
                sa.select(events.c.detail).where(events.c.run_id == run_id,
                                                 events.c.kind == kind)
                .order_by(events.c.at.desc(), events.c.id.desc()).limit(1)).scalar()
    finally:
        engine.dispose()
    return run_id, row, None if detail is None else json.loads(detail)
