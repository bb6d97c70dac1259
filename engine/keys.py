"""Key ranges and partitioners: which shard server owns which parameter keys.

Parameters are one flat float32 vector; a key is an index into it. A shard owns a contiguous
``KeyRange``. The partitioner is a policy (ranged now, consistent hashing later) passed to whoever
needs it, never looked up globally.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from engine.errors import ConfigError


@dataclass(frozen=True, slots=True)
class KeyRange:
    """The half-open key interval [start, end)."""

    start: int
    end: int

    def __post_init__(self) -> None:
        if self.start < 0 or self.end < self.start:
            raise ConfigError(f"invalid key range [{self.start}, {self.end})")

    def __len__(self) -> int:
        return self.end - self.start

    def contains(self, other: KeyRange) -> bool:
        return self.start <= other.start and other.end <= self.end

    def intersect(self, other: KeyRange) -> KeyRange | None:
        start, end = max(self.start, other.start), min(self.end, other.end)
        return KeyRange(start, end) if start < end else None

    def local(self, other: KeyRange) -> slice:
        """Slice of ``other`` within an array that holds exactly this range."""
        return slice(other.start - self.start, other.end - self.start)


class Partitioner(Protocol):
    """Assigns the key space [0, num_keys) to ``num_shards`` servers."""

    def ranges(self, num_keys: int, num_shards: int) -> list[KeyRange]:
        """One contiguous range per shard, in shard order, covering every key exactly once."""
        ...


class RangePartitioner:
    """Even contiguous ranges; the first ``num_keys % num_shards`` shards get one key more."""

    def ranges(self, num_keys: int, num_shards: int) -> list[KeyRange]:
        if num_shards < 1:
            raise ConfigError("need at least one shard server")
        if num_keys < num_shards:
            raise ConfigError(f"cannot split {num_keys} keys over {num_shards} servers")
        base, extra = divmod(num_keys, num_shards)
        ranges, start = [], 0
        for shard in range(num_shards):
            end = start + base + (1 if shard < extra else 0)
            ranges.append(KeyRange(start, end))
            start = end
        return ranges


def split_by_shard(request: KeyRange, shards: list[KeyRange]) -> list[tuple[int, KeyRange]]:
    """The pieces of ``request`` that each shard owns, as (shard index, piece)."""
    pieces = []
    for index, owned in enumerate(shards):
        piece = owned.intersect(request)
        if piece is not None:
            pieces.append((index, piece))
    if sum(len(piece) for _, piece in pieces) != len(request):
        raise ConfigError(f"key range [{request.start}, {request.end}) is not covered by shards")
    return pieces
