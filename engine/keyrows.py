"""Where a sparse shard keeps each key it has stored: key -> row of its value arrays (issue 44).

A sparse key range (a hashed feature space of 2^40 keys, an embedding table) is stored only where
it was touched. Each stored key gets the next free *row*, in the order keys first arrive, so the
shard's value and optimizer arrays stay dense in rows: reserved at their capacity (untouched rows
cost no memory: the arrays are anonymous zero pages until written) and filled from row 0. This
module maps keys to rows.

The map is a few sorted runs of (key, row) pairs, and every lookup is one vectorised binary
search (``np.searchsorted``) per run over a batch of keys. New keys are merged into the newest
run while it is small; past SMALL_RUN keys they start a run of their own, and two runs of about
the same size are merged, as a binary counter carries, so that there are O(log n) runs and a key
is copied O(log n) times in all. A merge is done a slice at a time (``_Merge``): each ``add``
does some of the pending merges' work, in proportion to the keys it adds, and the runs being
merged stay searchable until their merge is done. So no call copies more than about
``max(MERGE_SLICE, WORK_PER_KEY x runs x keys added)`` pairs, whatever the map's size (issue 57:
a merge of two runs once held a server's loop for 1.5 s at 16.8 million keys). Memory: 16 bytes
a key, and a second copy of the runs being merged. Why not a library: the hash maps with
vectorised lookups that numpy users reach for are private APIs (pandas' ``_libs.hashtable``) or
need a compiler (numba); a Python dict costs about 100 bytes a key and a Python-level loop per
key.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import numpy as np

from engine.errors import ShardFull

# New keys join the newest run while it holds fewer than SMALL_RUN keys (a copy of at most
# that many a call); a merge advances by at least MERGE_SLICE pairs a call, and by WORK_PER_KEY
# pairs per run for each key added, which keeps the pending merges ahead of the keys added.
SMALL_RUN = 1 << 18
MERGE_SLICE = 1 << 16
WORK_PER_KEY = 2
# One slice of a merge (a bound on the temporary arrays of one step).
MAX_SLICE = 1 << 20
# Past this many runs the pending merges are finished at once (never seen: the work above
# keeps their number near log2(keys / SMALL_RUN)).
MAX_RUNS = 48
# What the map takes a key at its peak: its (key, row) pair, and a copy while runs are merged.
MAP_BYTES_PER_KEY = 32


class RowBudget:
    """What the sparse shards of one process may store in all (``cluster.server_memory``):
    each shard's stored keys count at its ``row_bytes`` a key (its value arrays' bytes a row
    and the map's). A shard that would pass it refuses the keys that need it, whole
    (``ShardFull``); the process's other shards count as much as its own."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        # Weakly: a copy the process drops (or replaces by a handoff's) stops counting.
        self._shards: weakref.WeakSet[KeyRows] = weakref.WeakSet()

    def join(self, rows: KeyRows) -> None:
        self._shards.add(rows)

    @property
    def used(self) -> int:
        return sum(rows.used * rows.row_bytes for rows in self._shards)

    def check(self, rows: KeyRows, count: int, *, replacing: bool = False) -> None:
        """Whether ``rows`` may store ``count`` keys more (``replacing``: instead of those it
        holds); ShardFull saying how far it is from fitting if not."""
        held = self.used - (rows.used * rows.row_bytes if replacing else 0)
        more = count * rows.row_bytes
        if held + more <= self.limit:
            return
        keys = sum(shard.used for shard in self._shards)
        raise ShardFull(f"this server's sparse key ranges store {keys:,} keys in "
                        f"{_size(held)} and may take {_size(self.limit)} (cluster.server_memory): "
                        f"{count:,} keys more ({_size(more)}) do not fit; give the run more "
                        "servers (--servers) or more cluster.server_memory")


def _size(size: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:,.1f} {unit}"
    return f"{size} bytes"


class KeyRows:
    """Rows for up to ``capacity`` keys (any int64 values), assigned in order of arrival; with a
    ``budget``, no more than it lets the process's shards store, at ``row_bytes`` a key."""

    def __init__(self, capacity: int, *, row_bytes: int = MAP_BYTES_PER_KEY,
                 budget: RowBudget | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity, self.row_bytes, self.budget = capacity, row_bytes, budget
        self.used = 0
        self._runs: list[_Run] = []  # the oldest first; those being merged stay searchable
        self._merges: list[_Merge] = []  # the oldest first
        self.last_work = 0  # pairs the last add copied or searched for its merges (tests)
        if budget is not None:
            budget.join(self)

    @property
    def nbytes(self) -> int:
        return (sum(run.keys.nbytes + run.rows.nbytes for run in self._runs)
                + sum(merge.nbytes for merge in self._merges))

    @property
    def runs(self) -> int:
        return len(self._runs)

    @property
    def merging(self) -> int:
        """Merges started and not yet done."""
        return len(self._merges)

    def find(self, keys: np.ndarray) -> np.ndarray:
        """The row of each of ``keys`` (int64), -1 where it is not stored."""
        keys = np.asarray(keys, dtype=np.int64)
        rows = np.full(len(keys), -1, dtype=np.int64)
        for run in self._runs:
            at = np.minimum(np.searchsorted(run.keys, keys), len(run.keys) - 1)
            hit = run.keys[at] == keys
            rows[hit] = run.rows[at[hit]]
        return rows

    def assign(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(rows, new): the row of each of the distinct ``keys``, stored now where it was not,
        and which of them are new. Refused whole (ShardFull) if they do not fit."""
        keys = np.asarray(keys, dtype=np.int64)
        rows = self.find(keys)
        new = rows < 0
        if new.any():
            rows[new] = self.add(keys[new])
        return rows, new

    def add(self, keys: np.ndarray) -> np.ndarray:
        """The rows of ``keys``, distinct and none of them stored (the caller looked them up
        already: one search of the map fewer), stored now. Refused whole (ShardFull) if they do
        not fit."""
        keys = np.asarray(keys, dtype=np.int64)
        count = len(keys)
        rows = np.empty(count, dtype=np.int64)
        if count == 0:
            return rows
        if self.used + count > self.capacity:
            raise ShardFull(f"this shard stores {self.used:,} keys and can hold "
                            f"{self.capacity:,}: {count:,} more do not fit")
        if self.budget is not None:
            self.budget.check(self, count)
        order = np.argsort(keys, kind="stable")  # one sort: the run's keys, their rows
        fresh = keys[order]
        if len(fresh) > 1 and (fresh[1:] == fresh[:-1]).any():
            raise ValueError("keys to store must be distinct")
        fresh_rows = np.arange(self.used, self.used + count, dtype=np.int64)
        rows[order] = fresh_rows
        self.used += count
        self._store(_Run(fresh, fresh_rows))
        return rows

    def _store(self, fresh: _Run) -> None:
        newest = self._runs[-1] if self._runs else None
        if newest is not None and len(newest) < SMALL_RUN and not self._merging(newest):
            self._runs[-1] = _merged(newest, fresh)
        else:
            self._runs.append(fresh)
        self._carry()
        budget = max(MERGE_SLICE, WORK_PER_KEY * len(self._runs) * len(fresh))
        self.last_work = self._advance(budget)
        if len(self._runs) > MAX_RUNS:
            self.last_work += self._advance(None)

    def _merging(self, run: _Run) -> bool:
        return any(run is merge.a or run is merge.b for merge in self._merges)

    def _carry(self) -> None:
        """Start merging the two newest runs that no merge holds while the older is at most
        twice the newer (a binary counter's carry)."""
        free = [run for run in self._runs if not self._merging(run)]
        while len(free) >= 2 and len(free[-2]) <= 2 * len(free[-1]):
            self._merges.append(_Merge(free[-2], free[-1]))
            free = free[:-2]

    def _advance(self, budget: int | None) -> int:
        """Do up to ``budget`` pairs of the pending merges' work (None: all of it), the oldest
        merge first; a finished merge's run takes its older input's place. The work done."""
        done = 0
        while self._merges and (budget is None or done < budget):
            merge = self._merges[0]
            done += merge.step(None if budget is None else budget - done)
            if not merge.finished:
                break
            self._merges.pop(0)
            at = next(i for i, run in enumerate(self._runs) if run is merge.a)
            self._runs[at] = merge.result()
            self._runs = [run for run in self._runs if run is not merge.b]
            self._carry()
        return done

    def keys(self) -> np.ndarray:
        """The key of each row 0..used-1 (what a checkpoint stores beside the rows)."""
        out = np.empty(self.used, dtype=np.int64)
        for run in self._runs:
            out[run.rows] = run.keys
        return out

    def load(self, keys: np.ndarray) -> None:
        """Forget every key and store ``keys`` (distinct) in rows 0..len-1, in that order."""
        keys = np.asarray(keys, dtype=np.int64)
        if len(keys) > self.capacity:
            raise ShardFull(f"{len(keys):,} keys do not fit a shard that holds "
                            f"{self.capacity:,}")
        if self.budget is not None:
            self.budget.check(self, len(keys), replacing=True)
        order = np.argsort(keys, kind="stable")
        sorted_keys = keys[order]
        if len(keys) > 1 and (sorted_keys[1:] == sorted_keys[:-1]).any():
            raise ValueError("stored keys must be distinct")
        self._runs = [_Run(sorted_keys, order.astype(np.int64))] if len(keys) else []
        self._merges = []
        self.used = len(keys)


@dataclass(frozen=True, slots=True, eq=False)
class _Run:
    """Distinct keys, sorted, and the row of each."""

    keys: np.ndarray
    rows: np.ndarray

    def __len__(self) -> int:
        return len(self.keys)


def _merged(a: _Run, b: _Run) -> _Run:
    """Two runs as one, at once (``a`` small: a copy of at most SMALL_RUN pairs)."""
    at = np.searchsorted(a.keys, b.keys)
    return _Run(np.insert(a.keys, at, b.keys), np.insert(a.rows, at, b.rows))


class _Merge:
    """Two runs merged into one a slice at a time: first where each of ``b``'s keys goes among
    ``a``'s (a binary search of a slice of ``b``), then the output written a slice of ``a`` at
    a time with the keys of ``b`` that go before each of its keys."""

    def __init__(self, a: _Run, b: _Run) -> None:
        self.a, self.b = a, b
        self._at = np.empty(len(b), dtype=np.int64)
        self._keys = np.empty(len(a) + len(b), dtype=np.int64)
        self._rows = np.empty(len(a) + len(b), dtype=np.int64)
        self._searched = self._i = self._j = 0

    @property
    def nbytes(self) -> int:
        return self._at.nbytes + self._keys.nbytes + self._rows.nbytes

    @property
    def finished(self) -> bool:
        return self._i == len(self.a) and self._j == len(self.b)

    def step(self, budget: int | None) -> int:
        """Up to ``budget`` pairs of work (None: the rest); the work done."""
        done, limit = 0, math.inf if budget is None else budget
        while not self.finished and done < limit:
            size = int(min(limit - done, MAX_SLICE))
            done += self._search(size) if self._searched < len(self.b) else self._copy(size)
        return done

    def _search(self, size: int) -> int:
        lo = self._searched
        hi = min(lo + size, len(self.b))
        self._at[lo:hi] = np.searchsorted(self.a.keys, self.b.keys[lo:hi])
        self._searched = hi
        return hi - lo

    def _copy(self, size: int) -> int:
        """The next piece of the output, of about ``size`` keys: ``a``'s, in proportion to its
        share of the output, and the keys of ``b`` that go before them. A cut (i, j) is valid
        when the first i of ``a`` and the first j of ``b`` are all smaller than the rest:
        at[j - 1] <= i <= at[j]."""
        i0, j0 = self._i, self._j
        i1 = min(i0 + max(size * len(self.a) // (len(self.a) + len(self.b)), 1), len(self.a))
        j1 = len(self.b) if i1 == len(self.a) else int(np.searchsorted(self._at, i1))
        if (i1 - i0) + (j1 - j0) > size and j1 > j0:  # b's keys crowd here (say, in order)
            j1 = j0 + max(size - (i1 - i0), 1)
            i1 = min(i1, int(self._at[j1 - 1]))
        out = slice(i0 + j0, i1 + j1)
        at = self._at[j0:j1] - i0
        self._keys[out] = np.insert(self.a.keys[i0:i1], at, self.b.keys[j0:j1])
        self._rows[out] = np.insert(self.a.rows[i0:i1], at, self.b.rows[j0:j1])
        self._i, self._j = i1, j1
        return (i1 - i0) + (j1 - j0)

    def result(self) -> _Run:
        return _Run(self._keys, self._rows)
