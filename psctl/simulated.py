"""Which runs ran on a virtual clock: the simulated cluster records a ``simulated`` event (the
models that turned work into time) with every run, so the runs list can mark them."""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa

from engine.db.schema import events, translate_errors

# Ids per query: far below SQLite's limit on a statement's parameters.
_CHUNK = 500


def simulated_runs(engine: sa.Engine, run_ids: Sequence[str]) -> frozenset[str]:
    """The ids among ``run_ids`` of runs that were simulated."""
    found: set[str] = set()
    with translate_errors("reading runs"), engine.connect() as conn:
        for start in range(0, len(run_ids), _CHUNK):
            chunk = list(run_ids[start:start + _CHUNK])
            found.update(conn.execute(
                sa.select(events.c.run_id).distinct()
                .where(events.c.kind == "simulated", events.c.run_id.in_(chunk))).scalars())
    return frozenset(found)
