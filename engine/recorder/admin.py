"""Edits of recorded runs asked for from the command line (``psctl runs rm``, ``runs tag``).

They live beside the recorder because it is the one place that writes the database.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from sqlalchemy import delete, update
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from engine.db.schema import (
    open_engine,
    runs,
    tags,
    translate_errors,
)

log = logging.getLogger(__name__)

def delete_runs(db_path: Path, run_ids: Sequence[str]) -> int:
    """Delete runs and, by the foreign keys' cascade, every row they own; how many went.

    For ``psctl runs rm``: the CLI only reads, so its one destructive act is done here.
    """
    if not run_ids:
        return 0
    engine = open_engine(Path(db_path))
    try:
        with translate_errors("deleting runs"), engine.begin() as conn:
            return conn.execute(delete(runs).where(runs.c.id.in_(list(run_ids)))).rowcount
    finally:
        engine.dispose()


def set_tags(
    db_path: Path, run_id: str, values: dict[str, str], remove: Sequence[str] = ()
) -> None:
    """Set (insert or replace) and remove tags of one run in one transaction."""
    engine = open_engine(Path(db_path))
    try:
        with translate_errors(f"tagging run {run_id}"), engine.begin() as conn:
            if remove:
                conn.execute(delete(tags).where(tags.c.run_id == run_id, tags.c.key.in_(remove)))
            for key, value in values.items():
                stmt = sqlite_insert(tags).values(run_id=run_id, key=key, value=value)
                upsert = stmt.on_conflict_do_update(
                    index_elements=["run_id", "key"], set_={"value": value}
                )
                conn.execute(upsert)
    finally:
        engine.dispose()


NOTES_MAX_CHARS = 10_000


def set_notes(db_path: Path, run_id: str, notes: str | None) -> bool:
    """Replace one run's notes (None or "" clears them); False when no such run exists.

    Bounded here too, not only at the API, so no caller can grow the runs table without limit.
    """
    if notes is not None and len(notes) > NOTES_MAX_CHARS:
        raise ValueError(f"notes are limited to {NOTES_MAX_CHARS} characters")
    engine = open_engine(Path(db_path))
    try:
        with translate_errors(f"writing notes of run {run_id}"), engine.begin() as conn:
            result = conn.execute(
                update(runs).where(runs.c.id == run_id).values(notes=notes or None)
            )
            return result.rowcount > 0
    finally:
        engine.dispose()
