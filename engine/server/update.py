"""An update to apply to a shard's parameters: values for a contiguous slice or for sorted keys."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Update:
    """``values`` for the shard-local keys ``span`` (all of them when ``index`` is None, else
    the sorted unique local keys ``index``, all inside ``span``). ``ranges`` are the clock ranges
    it touches. ``norm``: the L2 norm of ``values`` where it is known already (the shard
    measured it to refuse a non-finite push), or None."""

    span: slice
    values: np.ndarray
    index: np.ndarray | None = None
    ranges: range = range(0)
    norm: float | None = None

    @property
    def size(self) -> int:
        return len(self.values)

    def select(self, array: np.ndarray) -> np.ndarray:
        """The entries of a shard-sized ``array`` this update touches (a view for a span)."""
        return array[self.span] if self.index is None else array[self.index]
