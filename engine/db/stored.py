"""The keys a run's servers stored, from the ``server_stats`` each server sends at its end (issue
44): a sparse key range stores only the keys that were pushed, so this, not the key space, is
what its memory grows with."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import Connection, select

from engine.db.schema import events, parse_json


@dataclass(frozen=True)
class StoredKeys:
    """Over every server process (each counting every copy it held, backups too)."""

    keys: int
    bytes: int  # the stored keys' rows of the value and optimizer arrays, and the key maps
    sparse: bool  # some of them were a sparse range's

    def to_dict(self) -> dict[str, Any]:
        """As ``RunDetail.to_dict()`` has it (the dashboard's run page and ``/api/runs/RUN``)."""
        return asdict(self)


def stored_keys(conn: Connection, run_id: str) -> StoredKeys | None:
    """None for a run whose servers said nothing of it (before issue 44, or no end reached)."""
    ev = events.c
    rows = conn.execute(select(ev.detail).where(ev.run_id == run_id,
                                                ev.kind == "server_stats")).scalars()
    told = [parse_json(row) for row in rows]
    counted = [t for t in told if isinstance(t.get("stored_keys"), int)
               and isinstance(t.get("stored_bytes"), int)]
    if not counted:
        return None
    return StoredKeys(keys=sum(t["stored_keys"] for t in counted),
                      bytes=sum(t["stored_bytes"] for t in counted),
                      sparse=any(t.get("sparse") is True for t in counted))
