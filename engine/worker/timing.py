"""What a worker loop reads the time from, and how long its compute phase lasts.

A loop is written once and driven by two clocks: a real worker's is the wall clock
(``WALL``); the simulator's is virtual (``engine.sim.runtime``), where sleeping moves time
forward and blocking on a request lets the other simulated roles run. A loop never calls
``time`` itself: every timestamp, duration and pause goes through its host's ``Clock``.

``Pace`` decides how long a batch's compute phase lasts, the same way on both: at least the
regime's ``compute_ms`` (a real batch is padded to it with a sleep; its gradient is still
computed for real, and a batch slower than that is recorded as it was), then times the worker's
straggler factor and jitter (``engine.worker.heterogeneity``). The simulator's clock does not
move while the gradient is computed, so its pace first spends the CPU time the gradient costs
on the simulated machine (``spend``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from engine.worker.heterogeneity import Slowdown


def seconds(ms: float | None) -> float | None:
    return None if ms is None else ms / 1e3


class Clock(Protocol):
    def now(self) -> float:
        """Seconds since the epoch (a row's timestamps)."""
        ...

    def perf(self) -> float:
        """Monotonic seconds (a phase's duration)."""
        ...

    def sleep(self, seconds: float) -> None: ...


class WallClock:
    """The real clock."""

    def now(self) -> float:
        return time.time()

    def perf(self) -> float:
        return time.perf_counter()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


WALL = WallClock()


class Pace:
    """How long a compute phase lasts: ``max(its own time, floor_s) x the slowdown factor``."""

    def __init__(self, clock: Clock, slowdown: Slowdown, floor_s: float | None = None,
                 spend: Callable[[], None] | None = None) -> None:
        self.clock, self.slowdown, self.floor_s = clock, slowdown, floor_s
        self._spend = spend

    @property
    def active(self) -> bool:
        """Does the phase last longer than its computation (a loop that pushes from inside
        backward holds its pushes until the phase ends)?"""
        return self.slowdown.active or self.floor_s is not None or self._spend is not None

    def computed(self, started: float, left_out: float = 0.0) -> None:
        """The gradient that began at ``started`` (``clock.perf()``) is done: wait out the rest
        of the phase. ``left_out``: time inside it that was not computing (a forward pass that
        waited for a layer's values), which is neither padded nor stretched."""
        if self._spend is not None:
            self._spend()
        elapsed = self.clock.perf() - started - left_out
        target = max(elapsed, self.floor_s or 0.0) * self.slowdown.factor_now()
        self.clock.sleep(target - elapsed)
