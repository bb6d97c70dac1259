"""Consistency controllers: when a shard may answer a pull, and when a push becomes an update.

A controller lives inside one shard server and sees only clocks (each worker's iteration number)
and gradients. The server asks it two things: may this pull at this clock be answered now, and
what should be applied for this push. Controllers keep a vector clock of the workers' pushes.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from engine.errors import ConfigError, ProtocolError


class ConsistencyController(Protocol):
    name: str

    def pull_ready(self, worker: int, clock: int, version: int) -> bool:
        """May a pull for iteration ``clock`` be answered while the shard is at ``version``?"""
        ...

    def on_push(self, worker: int, clock: int, grad: np.ndarray) -> np.ndarray | None:
        """Accept a gradient; return the gradient to apply now, or None to wait for more."""
        ...

    def clocks(self) -> list[int]:
        """The vector clock: the number of pushes accepted from each worker."""
        ...


class _VectorClock:
    def __init__(self, workers: int) -> None:
        if workers < 1:
            raise ConfigError("a consistency controller needs at least one worker")
        self._pushed = [0] * workers

    def tick(self, worker: int, clock: int) -> None:
        if not 0 <= worker < len(self._pushed):
            raise ProtocolError(f"worker rank {worker} is outside 0..{len(self._pushed) - 1}")
        if clock != self._pushed[worker]:
            raise ProtocolError(
                f"worker {worker} pushed clock {clock} but its next clock is {self._pushed[worker]}"
            )
        self._pushed[worker] += 1

    def clocks(self) -> list[int]:
        return list(self._pushed)


class BSP(_VectorClock):
    """Bulk synchronous: one update per clock, the mean of every worker's gradient.

    The pull for iteration t waits until the shard holds the update of clock t - 1, i.e. until
    its version (one per completed clock) reaches t. So every gradient is computed on the model
    of the current clock: staleness is always 0.
    """

    name = "bsp"

    def __init__(self, workers: int, keys: int) -> None:
        super().__init__(workers)
        self._workers = workers
        self._sum = np.zeros(keys, dtype=np.float32)
        self._arrived = 0
        self._round = 0

    def pull_ready(self, worker: int, clock: int, version: int) -> bool:
        return version >= clock

    def on_push(self, worker: int, clock: int, grad: np.ndarray) -> np.ndarray | None:
        if clock != self._round:  # an honest worker cannot: its pull for the next clock waits
            raise ProtocolError(f"worker {worker} pushed clock {clock} during BSP round "
                                f"{self._round}")
        self.tick(worker, clock)
        self._sum += grad
        self._arrived += 1
        if self._arrived < self._workers:
            return None
        self._arrived = 0
        self._round += 1
        mean = self._sum / np.float32(self._workers)
        self._sum.fill(0.0)
        return mean


class ASP(_VectorClock):
    """Asynchronous: every push is applied at once, every pull is answered at once."""

    name = "asp"

    def pull_ready(self, worker: int, clock: int, version: int) -> bool:
        return True

    def on_push(self, worker: int, clock: int, grad: np.ndarray) -> np.ndarray | None:
        self.tick(worker, clock)
        return grad


def make_controller(model: str, *, workers: int, keys: int) -> ConsistencyController:
    if model == "bsp":
        return BSP(workers, keys)
    if model == "asp":
        return ASP(workers)
    raise ConfigError(f"unknown consistency model {model!r} (known: bsp, asp)")
