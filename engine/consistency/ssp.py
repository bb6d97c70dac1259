"""Stale synchronous parallel (SSP) and its dynamic variant (DSSP).

SSP lets the fastest worker run at most ``staleness`` clocks ahead of the slowest, per clock
range. The server keeps, per range, a sliding window of the clocks that are still open: slot
``c mod (S+1)`` counts the workers that have pushed clock ``c``. The window's low bound is the
slowest worker's clock; a push is checked against it in O(1) and the window shifts when the last
worker of the low clock arrives, so memory is O(S) per range, whatever the number of workers.

DSSP (Zhao et al., ICDCS'19) chooses the bound at run time within [S, S+R]: a worker past S may
go on only while its next iteration is predicted to end before the slowest worker's, because
waiting then would be pure idle time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from engine.consistency.base import ImmediateController, PushTiming
from engine.consistency.timings import TimingHistory
from engine.errors import ConfigError, ProtocolError

if TYPE_CHECKING:
    from engine.config import SyncConfig


class SlidingWindow:
    """Counts of pushes per open clock; ``low`` is the first clock not every worker has pushed."""

    def __init__(self, workers: int, width: int) -> None:
        if width < 1:
            raise ConfigError("an SSP window needs a width of at least 1")
        self.workers, self.low = workers, 0
        self._counts = [0] * width

    @property
    def width(self) -> int:
        return len(self._counts)

    def admits(self, clock: int) -> bool:
        return clock < self.low + self.width

    def check(self, clock: int) -> None:
        if clock < self.low or not self.admits(clock):
            raise ProtocolError(f"clock {clock} is outside the open window [{self.low}, "
                                f"{self.low + self.width}): the worker ran past its staleness "
                                "bound")

    def add(self, clock: int) -> None:
        self.check(clock)
        self._counts[clock % self.width] += 1
        self._advance()

    def join(self) -> int:
        """One more worker, starting at the low bound (nothing it pushes is behind it)."""
        self.workers += 1
        return self.low

    def leave(self, next_clock: int) -> None:
        """One worker fewer: it pushed the open clocks below ``next_clock``, and will push no
        other; its pushes no longer count, nor does anyone wait for it."""
        for clock in range(self.low, min(next_clock, self.low + self.width)):
            self._counts[clock % self.width] -= 1
        self.workers -= 1
        self._advance()

    def _advance(self) -> None:
        while self.workers and self._counts[self.low % self.width] >= self.workers:
            self._counts[self.low % self.width] = 0
            self.low += 1


class SSP(ImmediateController):
    """Per clock range, the pull for clock c waits until c - (slowest worker's clock on that
    range) <= staleness; every push is applied on arrival."""

    name = "ssp"

    def __init__(self, workers: int, staleness: int, ranges: int = 1) -> None:
        self.workers, self.staleness = workers, staleness
        self.windows = [SlidingWindow(workers, staleness + 1) for _ in range(max(ranges, 1))]

    def pull_ready(self, worker: int, clock: int, ranges: range) -> bool:
        return all(self.windows[r].admits(clock) for r in ranges)

    def check_push(self, worker: int, clock: int, ranges: range) -> None:
        for r in ranges:
            self.windows[r].check(clock)

    def on_commit(self, worker: int, clock: int, ranges: range) -> list[int]:
        for r in ranges:
            self.windows[r].add(clock)
        return []

    def join(self, worker: int) -> list[int] | None:
        return [window.join() for window in self.windows]

    def leave(self, worker: int, next_clocks: list[int]) -> None:
        for window, next_clock in zip(self.windows, next_clocks, strict=True):
            window.leave(next_clock)


class BoundedDelay(SSP):
    """OSDI'14's bounded delay (seed 003: "a new task is blocked until all previous tasks T
    times ago have been finished"), on the servers: the global dependency is SSP's window of
    width T + 1, read with the worker's pulls stamped by the iteration they gate. The pull a
    worker sends behind its push of task c is stamped c + T + 1 (``engine.worker.delayed``):
    it is answered once every worker has pushed c, so nobody computes c + T + 1 before every
    task up to c is in. What differs from SSP is the worker: it does not wait for its last T
    tasks' communication, and computes on the newest values that have arrived."""

    name = "bounded-delay"


LEFT = 2**62  # a departed worker's finished clocks in DSSP's comparison


class DSSP(SSP):
    """SSP whose bound stretches from ``staleness`` up to ``staleness + extra`` when the leader
    is predicted to finish its next iteration before the slowest worker finishes its own."""

    name = "dssp"

    def __init__(self, workers: int, staleness: int, extra: int, ranges: int = 1) -> None:
        self.workers, self.staleness, self.extra = workers, staleness, extra
        self.windows = [SlidingWindow(workers, staleness + extra + 1)
                        for _ in range(max(ranges, 1))]
        self.timings = TimingHistory(workers)
        self._finished = [0] * workers  # clocks finished on every range of the shard

    def pull_ready(self, worker: int, clock: int, ranges: range) -> bool:
        for r in ranges:
            lead = clock - self.windows[r].low
            if lead > self.staleness + self.extra:
                return False
            if lead > self.staleness and not self._ends_before_slowest(worker):
                return False
        return True

    def on_clock(self, worker: int, clock: int, timing: PushTiming) -> None:
        self._finished[worker] = clock + 1
        self.timings.observe(worker, timing.pushed_at, timing.waited_s)

    def resume(self, clocks: list[int], finished: list[bool]) -> None:
        self._finished = list(clocks)  # the timing history starts empty

    def join(self, worker: int) -> list[int] | None:
        starts = super().join(worker)
        while len(self._finished) <= worker:  # a rank skipped never holds anyone back
            self._finished.append(LEFT)
            self.timings.grow()
        self._finished[worker] = min(starts or [0])
        return starts

    def leave(self, worker: int, next_clocks: list[int]) -> None:
        super().leave(worker, next_clocks)
        self._finished[worker] = LEFT  # never the slowest again

    def _ends_before_slowest(self, worker: int) -> bool:
        slowest = self._finished.index(min(self._finished))  # lowest rank: deterministic
        mine, theirs = self._next_end(worker), self._next_end(slowest)
        return mine is not None and theirs is not None and mine <= theirs

    def _next_end(self, worker: int) -> float | None:
        last, interval = self.timings.last_push(worker), self.timings.estimate(worker, "ewma")
        if last is None or interval is None:
            return None
        return last + interval


def build_ssp(sync: SyncConfig, workers: int, ranges: int) -> SSP:
    return SSP(workers, sync.staleness, ranges)


def build_bounded_delay(sync: SyncConfig, workers: int, ranges: int) -> BoundedDelay:
    return BoundedDelay(workers, sync.delay, ranges)


def build_dssp(sync: SyncConfig, workers: int, ranges: int) -> DSSP:
    return DSSP(workers, sync.staleness, sync.range, ranges)
