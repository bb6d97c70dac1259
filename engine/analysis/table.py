"""The table every face of ``psctl compare`` shows: its columns and rows (below the code that
fills it, ``engine.analysis.compare``, and the code that groups it, ``engine.analysis.groups``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

# The accuracy the issue's own examples and bench/sync_models.py measure time to.
DEFAULT_TARGET = 0.97

Better = Literal["max", "min"] | None


@dataclass(frozen=True)
class Column:
    key: str  # the JSON / CSV field name
    header: str  # the table heading
    # how the table formats it: text, config, flag, pct, duration (H:MM:SS), secs, rate, num,
    # value (4 significant digits), int, speedup, std
    kind: str
    better: Better = None  # which end is best, for highlighting and --sort-by


@dataclass(frozen=True)
class Comparison:
    columns: tuple[Column, ...]
    rows: list[dict[str, Any]]
    target: float | None = None  # the accuracy time to target was measured to
