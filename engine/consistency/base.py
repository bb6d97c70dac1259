"""Consistency controllers: when a shard may answer a pull, and when a push becomes an update.

A controller lives inside one shard server and sees only clocks (each worker's iteration number),
the timings a push carries, and gradients. The server asks it two things: may this pull at this
clock be answered now, and what should be applied for this push. Controllers keep a vector clock
of the workers' pushes. Every shard runs its own controller over the same pushes with the same
worker-stamped timings, so deterministic controllers agree across shards without talking.

BSP and ASP live here; SSP and DSSP in ``engine.consistency.ssp``; ElasticBSP in
``engine.consistency.elastic``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from engine.errors import ConfigError, ProtocolError

if TYPE_CHECKING:
    from engine.config import SyncConfig
    from engine.wire.records import SyncRecord


@dataclass(frozen=True, slots=True)
class PushTiming:
    """What the worker stamped on a push: when it left (unix s), how long the worker's pull for
    this clock was held back (s), and whether it is the worker's last push."""

    pushed_at: float = 0.0
    waited_s: float = 0.0
    final: bool = False


NO_TIMING = PushTiming()


class ConsistencyController(Protocol):
    name: str

    def pull_ready(self, worker: int, clock: int, version: int) -> bool:
        """May a pull for iteration ``clock`` be answered while the shard is at ``version``?"""
        ...

    def on_push(self, worker: int, clock: int, grad: np.ndarray,
                timing: PushTiming = NO_TIMING) -> np.ndarray | None:
        """Accept a gradient; return the gradient to apply now, or None to wait for more."""
        ...

    def clocks(self) -> list[int]:
        """The vector clock: the number of pushes accepted from each worker."""
        ...

    def take_syncs(self) -> list[SyncRecord]:
        """Barrier decisions and completions since the last call (ElasticBSP), oldest first."""
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

    def take_syncs(self) -> list[SyncRecord]:
        return []


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

    def on_push(self, worker: int, clock: int, grad: np.ndarray,
                timing: PushTiming = NO_TIMING) -> np.ndarray | None:
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


class _Scaled:
    """Applies each push on its own, scaled: with 1/workers (``push_scale = "mean"``) a round of
    pushes moves the model as far as BSP's averaged update, so one learning rate suits every
    model; unscaled, n workers multiply the step by n, which diverges at BSP's usual rates."""

    scale = np.float32(1.0)

    def scaled(self, grad: np.ndarray) -> np.ndarray:
        return grad if self.scale == 1.0 else grad * self.scale


def push_scale(sync: SyncConfig, workers: int) -> np.float32:
    return np.float32(1.0 / workers if sync.push_scale == "mean" else 1.0)


class ASP(_Scaled, _VectorClock):
    """Asynchronous: every push is applied at once, every pull is answered at once."""

    name = "asp"

    def pull_ready(self, worker: int, clock: int, version: int) -> bool:
        return True

    def on_push(self, worker: int, clock: int, grad: np.ndarray,
                timing: PushTiming = NO_TIMING) -> np.ndarray | None:
        self.tick(worker, clock)
        return self.scaled(grad)


def make_controller(sync: str | SyncConfig, *, workers: int, keys: int) -> ConsistencyController:
    """The controller for a sync model name (with defaults) or a whole ``SyncConfig``.

    Bounded delay is enforced by each worker on its own iterations (OSDI'14: a task waits for
    its tasks older than the delay), so its servers apply pushes as ASP does.
    """
    from engine.config import SYNC_MODELS, SyncConfig
    from engine.consistency.elastic import ElasticBSP
    from engine.consistency.ssp import DSSP, SSP

    if isinstance(sync, str):
        if sync not in SYNC_MODELS:
            raise ConfigError(f"unknown consistency model {sync!r} (known: "
                              f"{', '.join(SYNC_MODELS)})")
        sync = SyncConfig.model_validate({"model": sync})
    controller: BSP | ASP | SSP | DSSP | ElasticBSP
    if sync.model == "bsp":
        return BSP(workers, keys)
    if sync.model in ("asp", "bounded-delay"):
        controller = ASP(workers)
    elif sync.model == "ssp":
        controller = SSP(workers, sync.staleness)
    elif sync.model == "dssp":
        controller = DSSP(workers, sync.staleness, sync.range)
    else:
        controller = ElasticBSP(workers, sync)
    controller.scale = push_scale(sync, workers)
    return controller
