"""The values a worker holds of what the servers sent it, which a filtered pull is filled from.

With a pull filter (``comm.pull_filter``, seed 003's significantly-modified filter) a shard answers
a worker's pull with only the values that moved; the worker fills the rest from what it was sent
before. Two ways to hold them:

- ``DenseHeld``: one float32 per key of the key space, for key spaces up to ``DENSE_KEYS`` (the
  array is anonymous zero pages, backed only where written);
- ``KeyedHeld``: only the keys received, for a sparse key space of up to 2^62 hashed ids (issue
  44): a key -> slot map (``engine.keyrows``) and a value per slot, grown as keys arrive, 20
  bytes a held key.

A key the worker was never sent but a shard left out of an answer is an error (the shard
believes the worker holds it): a ``ProtocolError`` naming it, never a silent zero.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from engine.errors import ProtocolError
from engine.keyrows import KeyRows

# Key spaces up to this many keys are held densely (512 MiB of address space at most).
DENSE_KEYS = 1 << 27
# A keyed copy's map never refuses a key: a worker holds what it was sent.
_UNBOUNDED = 1 << 62


class Held(Protocol):
    def put(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Hold ``values`` for ``keys`` (sorted, distinct), replacing what was held."""
        ...

    def put_range(self, start: int, values: np.ndarray) -> None:
        """Hold ``values`` for the keys ``start, start + 1, ...``."""
        ...

    def fill(self, asked: np.ndarray, keys: np.ndarray, values: np.ndarray,
             out: np.ndarray) -> None:
        """A filtered answer to a pull of ``asked``: hold ``values`` for ``keys`` (some of
        ``asked``), then write the held values of ``asked`` into ``out``."""
        ...

    def fill_range(self, start: int, keys: np.ndarray, values: np.ndarray,
                   out: np.ndarray) -> None:
        """``fill`` for a pull of the keys ``start .. start + len(out) - 1``."""
        ...


class DenseHeld:
    def __init__(self, num_keys: int) -> None:
        self._values = np.zeros(num_keys, dtype=np.float32)
        self._sent = np.zeros(num_keys, dtype=bool)

    def put(self, keys: np.ndarray, values: np.ndarray) -> None:
        self._values[keys] = values
        self._sent[keys] = True

    def put_range(self, start: int, values: np.ndarray) -> None:
        self._values[start:start + len(values)] = values
        self._sent[start:start + len(values)] = True

    def fill(self, asked: np.ndarray, keys: np.ndarray, values: np.ndarray,
             out: np.ndarray) -> None:
        self.put(keys, values)
        if not self._sent[asked].all():
            _never_sent(asked[~self._sent[asked]])
        out[:] = self._values[asked]

    def fill_range(self, start: int, keys: np.ndarray, values: np.ndarray,
                   out: np.ndarray) -> None:
        self.put(keys, values)
        span = slice(start, start + len(out))
        if not self._sent[span].all():
            _never_sent(start + np.flatnonzero(~self._sent[span]))
        out[:] = self._values[span]


class KeyedHeld:
    def __init__(self) -> None:
        self._slots = KeyRows(_UNBOUNDED)
        self._values = np.zeros(1 << 10, dtype=np.float32)

    @property
    def held(self) -> int:
        return self._slots.used

    def put(self, keys: np.ndarray, values: np.ndarray) -> None:
        slots, _ = self._slots.assign(keys.astype(np.int64))
        self._grow()
        self._values[slots] = values

    def put_range(self, start: int, values: np.ndarray) -> None:
        self.put(np.arange(start, start + len(values), dtype=np.int64), values)

    def fill(self, asked: np.ndarray, keys: np.ndarray, values: np.ndarray,
             out: np.ndarray) -> None:
        # One lookup of the asked keys (the map's searches are the cost of a pull); the keys
        # sent are found among them, and only keys never held are stored.
        asked = asked.astype(np.int64)
        slots = self._slots.find(asked)
        at = np.minimum(np.searchsorted(asked, keys.astype(np.int64)), len(asked) - 1)
        if len(keys) and not np.array_equal(asked[at], keys):
            raise ProtocolError("a shard answered a pull with keys it was not asked for")
        new = slots[at] < 0
        if new.any():
            slots[at[new]] = self._slots.add(asked[at[new]])
            self._grow()
        if (slots < 0).any():
            _never_sent(asked[slots < 0])
        self._values[slots[at]] = values
        out[:] = self._values[slots]

    def fill_range(self, start: int, keys: np.ndarray, values: np.ndarray,
                   out: np.ndarray) -> None:
        self.fill(np.arange(start, start + len(out), dtype=np.int64), keys, values, out)

    def _grow(self) -> None:
        if self._slots.used > len(self._values):
            grown = np.zeros(max(self._slots.used, 2 * len(self._values)), dtype=np.float32)
            grown[:len(self._values)] = self._values
            self._values = grown


def held_for(num_keys: int) -> Held:
    """The copy a client keeps of a key space of ``num_keys`` keys."""
    return DenseHeld(num_keys) if num_keys <= DENSE_KEYS else KeyedHeld()


def _never_sent(missing: np.ndarray) -> None:
    raise ProtocolError(f"a shard left key {int(missing[0])} out of a filtered pull "
                        f"({len(missing)} such keys), but this worker was never sent it")
