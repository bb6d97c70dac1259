"""Edits of recorded runs asked for from the command line (``psctl runs rm``, ``runs tag``).

They live beside the recorder because it is the one place that writes the database.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

from sqlalchemy import delete, update
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from engine.db.schema import (
    open_engine,
    runs,
    tags,
    translate_errors,
)
from engine.errors import StoreError

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


# The same bounds for every writer (psctl runs tag, the dashboard): a tag is a label to select
# runs by, not a place for documents (notes are).
TAG_KEY_MAX = 64
TAG_VALUE_MAX = 256
TAGS_MAX = 64


def tag_problem(values: Mapping[str, str], remove: Sequence[str] = ()) -> str | None:
    """Why these tag changes are refused, in one line; None when they are within bounds."""
    if len(values) + len(remove) > TAGS_MAX:
        return f"at most {TAGS_MAX} tags can be set or removed at once"
    for key in [*values, *remove]:
        if not 0 < len(key) <= TAG_KEY_MAX:
            return (f"tag key {_brief(key)} has {len(key)} characters; keys have 1 to "
                    f"{TAG_KEY_MAX}")
    for key, value in values.items():
        if len(value) > TAG_VALUE_MAX:
            return (f"tag {_brief(key)}: the value has {len(value)} characters; values have at "
                    f"most {TAG_VALUE_MAX} (longer text belongs in the run's notes)")
    return None


def _brief(text: str, limit: int = 40) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "…")


def set_tags(
    db_path: Path, run_id: str, values: dict[str, str], remove: Sequence[str] = ()
) -> None:
    """Set (insert or replace) and remove tags of one run in one transaction; StoreError
    (nothing written) when they are out of bounds (:func:`tag_problem`)."""
    problem = tag_problem(values, remove)
    if problem is not None:
        raise StoreError(problem)
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
