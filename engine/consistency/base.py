"""Consistency controllers decide *when*: when a pull may be answered, when a push is refused,
and when the contributions of a round are released as an update. What an update is (sum, mean)
is the aggregator's business (``engine.server.aggregation``); applying it is the optimizer's.

Clocks are kept per *clock range* (a segment's piece on the shard; OSDI'14 keeps vector clocks
per key range), so a worker may push its layers as separate frames, in any order, and different
layers of one worker may be at different clocks. ``RangeClocks`` (owned by the shard) checks that
every worker commits each range's clocks in order and refuses duplicates; a controller sees
``pull_ready`` for the ranges a pull touches, ``check_push`` before anything changes,
``on_commit`` when a worker finishes a clock on some ranges, and ``on_clock`` when it has finished
a clock on every range of the shard (the timing-driven models observe iteration times there).

Every shard runs its own controller over the same pushes with the same worker-stamped timings,
so deterministic controllers agree across shards without talking. BSP and ASP live here; SSP and
DSSP in ``engine.consistency.ssp``; ElasticBSP in ``engine.consistency.elastic``; the registry of
every model in ``engine.consistency.registry``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import numpy as np

from engine.errors import ConfigError, DuplicatePush, ProtocolError

if TYPE_CHECKING:
    from engine.config import SyncConfig
    from engine.wire.records import SyncRecord

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class PushTiming:
    """What the worker stamped on a push: when it left (unix s), how long the worker's pull for
    this clock was held back (s), and whether it is the worker's last push."""

    pushed_at: float = 0.0
    waited_s: float = 0.0
    final: bool = False


NO_TIMING = PushTiming()


@dataclass(frozen=True, slots=True)
class Deferred(Generic[T]):
    """Work a controller hands to its caller to run off the event loop: ``run`` reads no
    controller state (it may run on another thread); ``finish`` takes its result back, on the
    loop. Until then the controller holds back whatever waits on the result."""

    run: Callable[[], T]
    finish: Callable[[T], None]


class ConsistencyController(Protocol):
    name: str
    # True: contributions to a clock are summed and released when every worker has committed it
    # (BSP); False: every push is applied on arrival.
    accumulates: bool

    def pull_ready(self, worker: int, clock: int, ranges: range) -> bool:
        """May a pull for iteration ``clock`` over these clock ranges be answered now?"""
        ...

    def check_push(self, worker: int, clock: int, ranges: range) -> None:
        """Raise ``ProtocolError`` if this push breaks the model's rules; change nothing."""
        ...

    def on_commit(self, worker: int, clock: int, ranges: range) -> list[int]:
        """``worker`` finished ``clock`` on ``ranges``; returns the ranges whose round is now
        complete (their accumulated contributions are released), in order."""
        ...

    def on_clock(self, worker: int, clock: int, timing: PushTiming) -> None:
        """``worker`` finished ``clock`` on every clock range of the shard."""
        ...

    def take_syncs(self) -> list[SyncRecord]:
        """Barrier decisions and completions since the last call (ElasticBSP), oldest first."""
        ...

    def offload(self, min_size: int) -> None:
        """From now on, hand decisions of at least ``min_size`` steps of work to the caller
        through ``take_deferred`` instead of taking them in place (a shard server runs them
        on a thread, so that its event loop is never held up by one)."""
        ...

    def take_deferred(self) -> Deferred[Any] | None:
        """The decision waiting to be run off the loop, once; None when there is none."""
        ...

    def join(self, worker: int) -> list[int] | None:
        """A worker joins the running job (``psctl scale``); per clock range, the clock it
        starts at (None: at 0). Raises ConfigError if the model counts a fixed set of
        workers."""
        ...

    def leave(self, worker: int, next_clocks: list[int]) -> None:
        """A worker left after committing clocks below ``next_clocks`` (per clock range); no
        one waits for its later clocks."""
        ...

    def resume(self, clocks: list[int], finished: list[bool]) -> None:
        """The shard was restored from a checkpoint (its commits replayed through
        ``on_commit``); each worker has finished ``clocks[w]`` clocks on every range, and
        ``finished[w]`` says it made its last push. The timing-driven state starts again from
        there."""
        ...


class RangeClocks:
    """Per worker and clock range, the next clock the worker may push (its committed count)."""

    def __init__(self, workers: int, ranges: int) -> None:
        if workers < 1:
            raise ConfigError("a consistency controller needs at least one worker")
        self.workers = workers
        self.next = np.zeros((workers, max(ranges, 1)), dtype=np.int64)
        self.duplicates = 0

    def check_rank(self, worker: int) -> None:
        if not 0 <= worker < self.workers:
            raise ProtocolError(f"worker rank {worker} is outside 0..{self.workers - 1}")

    def add(self, worker: int, starts: list[int] | None) -> None:
        """A worker joins: its row (and any unused one below it) is added; it next pushes
        ``starts`` per range (default 0)."""
        if worker >= self.workers:
            grown = np.zeros((worker + 1, self.next.shape[1]), dtype=np.int64)
            grown[: self.workers] = self.next
            self.next, self.workers = grown, worker + 1
        self.next[worker] = starts if starts is not None else 0

    def check(self, worker: int, clock: int, ranges: range) -> None:
        self.check_rank(worker)
        expected = self.next[worker, ranges.start:ranges.stop]
        if (expected == clock).all():
            return
        if (clock < expected).any():
            self.duplicates += 1
            raise DuplicatePush(f"worker {worker} already committed clock {clock} on clock "
                                f"range {ranges.start + int(np.argmax(clock < expected))}")
        at = ranges.start + int(np.argmax(expected != clock))
        raise ProtocolError(f"worker {worker} pushed clock {clock} but its next clock is "
                            f"{int(self.next[worker, at])} on clock range {at}")

    def commit(self, worker: int, ranges: range) -> bool:
        """Advance; True if the worker's shard-wide clock (its slowest range) moved."""
        before = int(self.next[worker].min())
        self.next[worker, ranges.start:ranges.stop] += 1
        return int(self.next[worker].min()) > before

    def shard_clocks(self) -> list[int]:
        """Per worker, the clocks finished on every range of the shard."""
        return [int(c) for c in self.next.min(axis=1)]


class DecidesInPlace:
    """A controller whose decisions are a few comparisons: nothing to run off the loop."""

    def offload(self, min_size: int) -> None:
        return None

    def take_deferred(self) -> Deferred[Any] | None:
        return None


class ImmediateController(DecidesInPlace):
    """Shared by the models that apply every push on arrival: nothing to release on commit."""

    name = "immediate"
    accumulates = False

    def on_commit(self, worker: int, clock: int, ranges: range) -> list[int]:
        return []

    def on_clock(self, worker: int, clock: int, timing: PushTiming) -> None:
        return None

    def take_syncs(self) -> list[SyncRecord]:
        return []

    def join(self, worker: int) -> list[int] | None:
        return None  # nobody waits for anybody: it starts at clock 0

    def leave(self, worker: int, next_clocks: list[int]) -> None:
        return None

    def resume(self, clocks: list[int], finished: list[bool]) -> None:
        return None


def fixed_membership(model: str) -> ConfigError:
    return ConfigError(f"{model} counts a fixed set of workers in every round, so workers "
                       "cannot join or leave a running job; psctl scale works with asp, ssp, "
                       "dssp and bounded-delay")


class BSP(DecidesInPlace):
    """Bulk synchronous: per clock range, one update per clock, the mean of every worker's
    contributions to it.

    The pull for iteration t over some ranges waits until each of them holds the update of
    clock t - 1, i.e. until its round reaches t. So every gradient is computed on the model of
    the current clock (staleness 0), layer by layer.
    """

    name = "bsp"
    accumulates = True

    def __init__(self, workers: int, ranges: int = 1) -> None:
        self.workers = workers
        self.round = np.zeros(max(ranges, 1), dtype=np.int64)
        self._arrived = np.zeros(max(ranges, 1), dtype=np.int64)

    def pull_ready(self, worker: int, clock: int, ranges: range) -> bool:
        return bool((self.round[ranges.start:ranges.stop] >= clock).all())

    def check_push(self, worker: int, clock: int, ranges: range) -> None:
        rounds = self.round[ranges.start:ranges.stop]
        if (rounds != clock).any():  # an honest worker cannot: its pull for the next clock waits
            at = ranges.start + int(np.argmax(rounds != clock))
            raise ProtocolError(f"worker {worker} pushed clock {clock} during BSP round "
                                f"{int(self.round[at])} of clock range {at}")

    def on_commit(self, worker: int, clock: int, ranges: range) -> list[int]:
        arrived = self._arrived[ranges.start:ranges.stop]
        arrived += 1
        complete = np.flatnonzero(arrived == self.workers)
        arrived[complete] = 0
        self.round[ranges.start + complete] += 1
        return [ranges.start + int(i) for i in complete]

    def on_clock(self, worker: int, clock: int, timing: PushTiming) -> None:
        return None

    def take_syncs(self) -> list[SyncRecord]:
        return []

    def join(self, worker: int) -> list[int] | None:
        raise fixed_membership(self.name)

    def leave(self, worker: int, next_clocks: list[int]) -> None:
        raise fixed_membership(self.name)

    def resume(self, clocks: list[int], finished: list[bool]) -> None:
        return None


class ASP(ImmediateController):
    """Asynchronous: every push is applied at once, every pull is answered at once."""

    name = "asp"

    def __init__(self, workers: int) -> None:
        self.workers = workers

    def pull_ready(self, worker: int, clock: int, ranges: range) -> bool:
        return True

    def check_push(self, worker: int, clock: int, ranges: range) -> None:
        return None


def build_bsp(sync: SyncConfig, workers: int, ranges: int) -> BSP:
    return BSP(workers, ranges)


def build_asp(sync: SyncConfig, workers: int, ranges: int) -> ASP:
    return ASP(workers)
