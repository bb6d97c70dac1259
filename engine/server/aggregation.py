"""Aggregation rules: the arithmetic that turns workers' contributions into an update.

The consistency controller decides *when* (``engine.consistency``); an aggregator decides *what*:
for models that apply every push on arrival it scales one push; for BSP it sums a round's
contributions per clock range (dense or sparse) and hands back their mean or sum on release,
touching only the keys somebody contributed to.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from engine.keys import KeyRange
from engine.policies.aggregation import AGGREGATION_RULES
from engine.server.update import Update


class Aggregator(Protocol):
    @property
    def weight(self) -> float:
        """What one push counts for in an update: 1/workers for the mean, 1 for the sum."""
        ...

    def immediate(self, update: Update) -> Update:
        """What one push applied on arrival contributes."""
        ...

    def add(self, update: Update) -> None:
        """Accumulate a contribution to the current round of its clock ranges."""
        ...

    def release(self, ranges: list[int]) -> list[Update]:
        """The rounds of these (complete) ranges as updates; their sums restart from zero."""
        ...

    def round_state(self) -> list[np.ndarray]:
        """The arrays that hold the open rounds (the live ones: a copy of a shard handed to
        another server carries them, so a partly pushed round is not lost)."""
        ...

    def load_round(self, parts: list[np.ndarray]) -> None:
        """Take over open rounds ``round_state`` gave (checked by the caller)."""
        ...


class _Divided:
    """What one push counts for: 1/divide_by of an update."""

    def __init__(self, divide_by: int) -> None:
        self._divide = np.float32(divide_by)

    @property
    def weight(self) -> float:
        return 1.0 / float(self._divide)

    def immediate(self, update: Update) -> Update:
        if self._divide == 1:
            return update
        return Update(update.span, update.values / self._divide, update.index, update.ranges)


class RoundSum(_Divided):
    """Sums per clock range, and per key whether anybody contributed this round."""

    def __init__(self, shard: KeyRange, ranges: list[KeyRange], divide_by: int) -> None:
        super().__init__(divide_by)
        self._local = [slice(r.start - shard.start, r.end - shard.start) for r in ranges]
        self._sum = np.zeros(len(shard), dtype=np.float32)
        self._touched = np.zeros(len(shard), dtype=bool)
        self._dense = np.zeros(len(ranges), dtype=bool)  # every key of the range contributed
        self._ranges = ranges

    def add(self, update: Update) -> None:
        if update.index is None:
            self._sum[update.span] += update.values
            covered = [r for r in update.ranges if self._inside(r, update.span)]
            self._dense[covered] = True
            if len(covered) != len(update.ranges):
                self._touched[update.span] = True
        else:
            self._sum[update.index] += update.values
            self._touched[update.index] = True

    def release(self, ranges: list[int]) -> list[Update]:
        updates = []
        for run in _contiguous(ranges):
            dense = bool(self._dense[run].all()) or bool(self._touched[self._span(run)].all())
            if dense:
                updates.append(self._take(self._span(run), None, run))
            else:
                for r in run:
                    updates.extend(self._release_one(r))
        return updates

    def round_state(self) -> list[np.ndarray]:
        return [self._sum, self._touched, self._dense]

    def load_round(self, parts: list[np.ndarray]) -> None:
        for mine, theirs in zip(self.round_state(), parts, strict=True):
            np.copyto(mine, theirs)

    def _release_one(self, r: int) -> list[Update]:
        span = self._local[r]
        if self._dense[r]:
            return [self._take(span, None, range(r, r + 1))]
        index = span.start + np.flatnonzero(self._touched[span])
        if len(index) == 0:
            return []  # an empty round: nobody pushed a key of this range
        return [self._take(span, index, range(r, r + 1))]

    def _take(self, span: slice, index: np.ndarray | None, run: range) -> Update:
        values = (self._sum[span] if index is None else self._sum[index]) / self._divide
        if index is None:
            self._sum[span] = 0.0
        else:
            self._sum[index] = 0.0
        self._touched[span] = False
        self._dense[run.start:run.stop] = False
        return Update(span, values, index, run)

    def _span(self, run: range) -> slice:
        return slice(self._local[run.start].start, self._local[run.stop - 1].stop)

    def _inside(self, r: int, span: slice) -> bool:
        local = self._local[r]
        return bool(span.start <= local.start and local.stop <= span.stop)


class SparseRoundSum(_Divided):
    """A sparse shard's round sums (``engine.server.shard.SparseKeys``): per row of its value
    arrays, and the rows somebody contributed to this round, as the pushes listed them; the
    shard is one clock range. Memory grows with the rows pushed, not with the key space."""

    def __init__(self, capacity: int, divide_by: int) -> None:
        super().__init__(divide_by)
        self._sum = np.zeros(capacity, dtype=np.float32)  # zero pages until a row is pushed
        self._pushed: list[np.ndarray] = []

    def add(self, update: Update) -> None:
        if update.index is None:
            raise ValueError("a sparse shard's updates list their rows")
        self._sum[update.index] += update.values
        self._pushed.append(update.index)

    def release(self, ranges: list[int]) -> list[Update]:
        rows = self._rows()
        self._pushed = []
        if not ranges or len(rows) == 0:
            return []
        values = self._sum[rows] / self._divide
        self._sum[rows] = 0.0
        return [Update(slice(0, int(rows[-1]) + 1), values, rows, range(0, 1))]

    def round_state(self) -> list[np.ndarray]:
        """The open round as (rows, their sums): what a live copy carries."""
        rows = self._rows()
        return [rows, self._sum[rows]]

    def load_round(self, parts: list[np.ndarray]) -> None:
        rows, sums = parts
        self._sum[rows] = sums
        self._pushed = [rows] if len(rows) else []

    def _rows(self) -> np.ndarray:
        if not self._pushed:
            return np.empty(0, dtype=np.int64)
        return np.unique(np.concatenate(self._pushed))


def _contiguous(ranges: list[int]) -> list[range]:
    """[1, 2, 3, 7] -> [range(1, 4), range(7, 8)]: one update per run of adjacent ranges."""
    runs: list[range] = []
    for r in sorted(ranges):
        if runs and runs[-1].stop == r:
            runs[-1] = range(runs[-1].start, r + 1)
        else:
            runs.append(range(r, r + 1))
    return runs


def make_aggregator(rule: str, shard: KeyRange, ranges: list[KeyRange], workers: int, *,
                    sparse_capacity: int | None = None) -> Aggregator:
    """The rule's aggregator; a sparse shard's (``sparse_capacity`` rows) sums by row."""
    divide_by = AGGREGATION_RULES.get(rule)(workers)
    if sparse_capacity is not None:
        return SparseRoundSum(sparse_capacity, divide_by)
    return RoundSum(shard, ranges, divide_by)
