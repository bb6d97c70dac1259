"""One shard's state and rules, free of I/O so that it can be tested directly.

The shard server (``engine.server.service``) wraps this with connections; everything that
decides what
the parameters are lives here: initialisation, the version counter, the consistency controller
and the optimizer.
"""

from __future__ import annotations

import numpy as np

from engine.consistency.base import NO_TIMING, ConsistencyController, PushTiming
from engine.errors import BadPayload, ProtocolError
from engine.keys import KeyRange
from engine.server.optimizers import ServerOptimizer
from engine.wire.protocol import ANY_CLOCK


class ShardState:
    """Parameters for ``keys``; ``version`` counts the updates applied so far."""

    def __init__(
        self, keys: KeyRange, controller: ConsistencyController, optimizer: ServerOptimizer
    ) -> None:
        self.keys = keys
        self.params = np.zeros(len(keys), dtype=np.float32)
        self.controller = controller
        self.optimizer = optimizer
        self.version = 0
        self.initialized = False
        self.pushes = 0

    def init(self, keys: KeyRange, values: np.ndarray) -> bool:
        """Set initial values; only the first complete initialisation counts. True if applied."""
        if self.initialized:
            return False
        if keys != self.keys:
            raise BadPayload(
                f"INIT must cover the whole shard [{self.keys.start}, "
                f"{self.keys.end}), got [{keys.start}, {keys.end})"
            )
        np.copyto(self.params, values)
        self.initialized = True
        return True

    def pull_ready(self, worker: int, clock: int) -> bool:
        if not self.initialized:
            return False
        return clock == ANY_CLOCK or self.controller.pull_ready(worker, clock, self.version)

    def read(self, keys: KeyRange) -> np.ndarray:
        self._check_owned(keys)
        return self.params[self.keys.local(keys)]

    def push(self, worker: int, clock: int, keys: KeyRange, grad: np.ndarray,
             timing: PushTiming = NO_TIMING) -> int:
        """Hand a gradient to the controller; returns the version it was accepted at.

        A worker pushes its whole shard slice once per clock, so partial ranges are refused:
        the controllers count one push per worker per clock.
        """
        if not self.initialized:
            raise ProtocolError("push before the shard was initialised")
        if keys != self.keys:
            raise BadPayload(
                f"PUSH must cover the whole shard [{self.keys.start}, "
                f"{self.keys.end}), got [{keys.start}, {keys.end})"
            )
        accepted_at = self.version
        update = self.controller.on_push(worker, clock, grad, timing)
        self.pushes += 1
        if update is not None:
            self.optimizer.step(self.params, update)
            self.version += 1
        return accepted_at

    def _check_owned(self, keys: KeyRange) -> None:
        if not self.keys.contains(keys):
            raise BadPayload(
                f"keys [{keys.start}, {keys.end}) are not all on this shard, which "
                f"holds [{self.keys.start}, {self.keys.end})"
            )
