"""Where a sparse shard keeps each key it has stored: key -> row of its value arrays (issue 44).

A sparse key range (a hashed feature space of 2^40 keys, an embedding table) is stored only where
it was touched. Each stored key gets the next free *row*, in the order keys first arrive, so the
shard's value and optimizer arrays stay dense in rows: reserved at their capacity (untouched rows
cost no memory: the arrays are anonymous zero pages until written) and filled from row 0. This
module maps keys to rows.

The map is two sorted runs of (key, row) pairs: a large one and a small one that new keys are
merged into; the small run is merged into the large one when it outgrows an eighth of it, so a
key is copied a bounded number of times on average, and every lookup is two vectorised binary
searches (``np.searchsorted``) over a batch of keys. Memory: 16 bytes a key, and a transient copy
of the large run while merging. Why not a library: the hash maps with vectorised lookups that
numpy users reach for are private APIs (pandas' ``_libs.hashtable``) or need a compiler (numba);
a Python dict costs about 100 bytes a key and a Python-level loop per key.
"""

from __future__ import annotations

import weakref

import numpy as np

from engine.errors import ShardFull

# The small run is merged into the large one past max(MIN_DELTA, large / DELTA_SHARE) keys.
MIN_DELTA = 1 << 16
DELTA_SHARE = 8
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
        self._runs = [_empty(), _empty()]  # (keys, rows): the large run, the small run
        if budget is not None:
            budget.join(self)

    @property
    def nbytes(self) -> int:
        return sum(keys.nbytes + rows.nbytes for keys, rows in self._runs)

    def find(self, keys: np.ndarray) -> np.ndarray:
        """The row of each of ``keys`` (int64), -1 where it is not stored."""
        keys = np.asarray(keys, dtype=np.int64)
        rows = np.full(len(keys), -1, dtype=np.int64)
        for run_keys, run_rows in self._runs:
            if len(run_keys) == 0:
                continue
            at = np.minimum(np.searchsorted(run_keys, keys), len(run_keys) - 1)
            hit = run_keys[at] == keys
            rows[hit] = run_rows[at[hit]]
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
        self._runs[1] = _merge(self._runs[1], (fresh, fresh_rows))
        if len(self._runs[1][0]) > max(MIN_DELTA, len(self._runs[0][0]) // DELTA_SHARE):
            self._runs = [_merge(*self._runs), _empty()]
        return rows

    def keys(self) -> np.ndarray:
        """The key of each row 0..used-1 (what a checkpoint stores beside the rows)."""
        out = np.empty(self.used, dtype=np.int64)
        for run_keys, run_rows in self._runs:
            out[run_rows] = run_keys
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
        self._runs = [(sorted_keys, order.astype(np.int64)), _empty()]
        self.used = len(keys)


def _empty() -> tuple[np.ndarray, np.ndarray]:
    return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)


def _merge(a: tuple[np.ndarray, np.ndarray],
           b: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Two sorted runs of distinct keys as one."""
    if len(a[0]) == 0:
        return b
    if len(b[0]) == 0:
        return a
    at = np.searchsorted(a[0], b[0])
    return np.insert(a[0], at, b[0]), np.insert(a[1], at, b[1])
