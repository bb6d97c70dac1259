"""Key space, key layout and partitioners: which shard server owns which parameter keys.

Parameters are one flat float32 vector; a key is an index into it. The ``KeyLayout`` names its
segments (one per parameter tensor). A shard owns a contiguous ``KeyRange``; its *clock ranges*
are the pieces of segments that fall on it, each with its own vector clock, so one worker's
layers may be at different clocks. The partitioner is a policy passed to whoever needs it.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Protocol

import numpy as np

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


@dataclass(frozen=True, slots=True)
class Segment:
    """One parameter tensor's place in the flat key space. A *sparse* segment (issue 44: a
    hashed feature space, an embedding table) is stored by the servers only where it was
    touched, and pulled and pushed by key, never as a whole range. ``init``: the rule the
    servers start its keys from (``engine.initial``: zeros or normal:STD); None: worker 0 sends
    them (INIT), and a sparse segment starts at zeros."""

    name: str
    shape: tuple[int, ...]
    keys: KeyRange
    sparse: bool = False
    init: str | None = None


@dataclass(frozen=True, slots=True)
class KeyLayout:
    """The model's key space as named, contiguous segments in ``named_parameters()`` order."""

    segments: tuple[Segment, ...]

    def __post_init__(self) -> None:
        end = 0
        for segment in self.segments:
            if segment.keys.start != end or len(segment.keys) == 0:
                raise ConfigError(f"segment {segment.name!r} at [{segment.keys.start}, "
                                  f"{segment.keys.end}) does not follow on from key {end}")
            end = segment.keys.end

    @classmethod
    def single(cls, num_keys: int) -> KeyLayout:
        """One anonymous segment: the whole key space is one clock range."""
        return cls((Segment("all", (num_keys,), KeyRange(0, num_keys)),))

    @property
    def num_keys(self) -> int:
        return self.segments[-1].keys.end if self.segments else 0

    def segment(self, name: str) -> Segment:
        for segment in self.segments:
            if segment.name == name:
                return segment
        raise ConfigError(f"no segment named {name!r} (known: "
                          f"{', '.join(s.name for s in self.segments)})")

    def sparse_on(self, shard: KeyRange) -> bool:
        """Whether ``shard`` holds sparse keys; a shard holding both kinds is refused (its
        dense keys would need a dense store beside the sparse one: not built yet)."""
        kinds = {s.sparse for s in self.segments if s.keys.intersect(shard) is not None}
        if len(kinds) > 1:
            raise ConfigError(f"shard [{shard.start}, {shard.end}) would hold both sparse and "
                              "dense keys; psctl stores a shard one way or the other")
        return kinds == {True}

    def clock_ranges(self, shard: KeyRange) -> list[KeyRange]:
        """The pieces of segments on ``shard``, in key order; they cover it exactly."""
        pieces = [p for s in self.segments if (p := s.keys.intersect(shard)) is not None]
        if sum(len(p) for p in pieces) != len(shard):
            raise ConfigError(f"the layout does not cover shard [{shard.start}, {shard.end})")
        return pieces


class RangeIndex:
    """Finds the clock ranges a key span touches, by bisection over their starts."""

    def __init__(self, ranges: list[KeyRange]) -> None:
        self.ranges = ranges
        self._starts = [r.start for r in ranges]
        self._ends = [r.end for r in ranges]

    def __len__(self) -> int:
        return len(self.ranges)

    def touched(self, span: KeyRange) -> range:
        """Indices of the ranges that share at least one key with ``span`` (none if empty)."""
        if len(span) == 0:
            return range(0)
        low = max(bisect.bisect_right(self._starts, span.start) - 1, 0)
        return range(low, bisect.bisect_left(self._starts, span.end))

    def covered(self, span: KeyRange) -> range:
        """Indices of the ranges wholly inside ``span``."""
        return range(bisect.bisect_left(self._starts, span.start),
                     bisect.bisect_right(self._ends, span.end))


def split_keys_by_shard(keys: np.ndarray, shards: list[KeyRange]) -> list[tuple[int, slice]]:
    """For sorted keys: per shard that owns some, (shard index, slice of ``keys`` it owns)."""
    starts = np.array([s.start for s in shards] + [shards[-1].end], dtype=np.int64)
    bounds = np.searchsorted(keys, starts, side="left")
    if len(keys) and (keys[0] < shards[0].start or keys[-1] >= shards[-1].end):
        raise ConfigError(f"keys {int(keys[0])}..{int(keys[-1])} fall outside the key space "
                          f"[{shards[0].start}, {shards[-1].end})")
    return [(i, slice(int(bounds[i]), int(bounds[i + 1])))
            for i in range(len(shards)) if bounds[i + 1] > bounds[i]]


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


def partition(layout: KeyLayout, shards: int,
              partitioner: Partitioner | None = None) -> list[KeyRange]:
    """The shard ranges of ``layout``: the partitioner's over the whole key space, or, when
    sparse and dense segments both occur, never a shard of both kinds (a shard is stored one
    way or the other): each run of dense segments gets one shard, the sparse runs share the
    rest, each cut evenly by the partitioner."""
    base = partitioner or RangePartitioner()
    runs = _kind_runs(layout)
    if len(runs) == 1:
        return base.ranges(layout.num_keys, shards)
    sparse_runs = sum(1 for _, sparse in runs if sparse)
    spare = shards - (len(runs) - sparse_runs)
    if spare < sparse_runs:
        raise ConfigError(f"the model's keys alternate {len(runs)} times between sparse and "
                          f"dense segments: it needs at least {len(runs)} key ranges (one per "
                          f"run; --servers or cluster.ranges), not {shards}")
    ranges: list[KeyRange] = []
    turn = 0
    for run, sparse in runs:
        count = 1
        if sparse:
            count = spare // sparse_runs + (1 if turn < spare % sparse_runs else 0)
            turn += 1
        ranges += [KeyRange(run.start + r.start, run.start + r.end)
                   for r in base.ranges(len(run), count)]
    return ranges


def ranges_needed(layout: KeyLayout) -> int:
    """The fewest key ranges ``partition`` can cut ``layout`` into: one per run of segments of
    one kind (1 for a layout of one kind)."""
    return len(_kind_runs(layout))


def _kind_runs(layout: KeyLayout) -> list[tuple[KeyRange, bool]]:
    """Maximal runs of adjacent segments of one kind, as (keys, sparse)."""
    runs: list[tuple[KeyRange, bool]] = []
    for segment in layout.segments:
        if runs and runs[-1][1] == segment.sparse:
            runs[-1] = (KeyRange(runs[-1][0].start, segment.keys.end), segment.sparse)
        else:
            runs.append((segment.keys, segment.sparse))
    return runs


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
