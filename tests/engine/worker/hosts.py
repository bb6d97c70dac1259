"""What a worker loop's test gives it for a host's clock and pace (``engine.worker.loops.Host``):
the wall clock, and a pace that adds nothing (``active``: whether a loop should think its compute
phase lasts longer than its computation)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from engine.worker.timing import WALL


def timing(active: bool = False) -> dict[str, Any]:
    """``clock``, ``pace`` and ``stop_with`` (its reasons land in ``stopped``)."""
    stopped: list[str] = []
    return {"clock": WALL, "pace": SimpleNamespace(computed=lambda started, left_out=0.0: None,
                                                   active=active),
            "stop_with": stopped.append, "stopped": stopped}
