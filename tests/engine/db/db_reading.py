"""What the db tests share: one read of a recorded database, as the CLI and dashboard read it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from sqlalchemy import Connection

from engine.db.queries import reading
from engine.db.schema import open_engine

T = TypeVar("T")


def read_once(db: Path, what: str, query: Callable[[Connection], T]) -> T:
    """``query`` on a read-only connection to ``db``; the engine is disposed of after."""
    engine = open_engine(db, readonly=True)
    try:
        with reading(engine, what) as conn:
            return query(conn)
    finally:
        engine.dispose()
