"""Server optimizers: how a shard turns a gradient into an update of its parameters."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from engine.config import OptimizerConfig
from engine.errors import ConfigError


class ServerOptimizer(Protocol):
    def step(self, params: np.ndarray, grad: np.ndarray) -> None:
        """Update ``params`` in place from ``grad`` (same shape, float32)."""
        ...


class SGD:
    """SGD with optional (Nesterov) momentum and L2 weight decay, updating in place.

    The same update as ``torch.optim.SGD`` with dampening 0: buf = m * buf + g; p -= lr * buf.
    """

    def __init__(
        self,
        size: int,
        *,
        lr: float,
        momentum: float = 0.0,
        nesterov: bool = False,
        weight_decay: float = 0.0,
    ) -> None:
        if nesterov and momentum == 0:
            raise ConfigError("nesterov momentum needs momentum > 0")
        self.lr, self.momentum, self.nesterov = np.float32(lr), np.float32(momentum), nesterov
        self.weight_decay = np.float32(weight_decay)
        self._buf = np.zeros(size, dtype=np.float32) if momentum else None
        # Reused for every step: fresh 2 MB temporaries cost page faults on each update.
        self._scratch = np.empty(size, dtype=np.float32)
        self._started = False

    def step(self, params: np.ndarray, grad: np.ndarray) -> None:
        direction = grad
        if self.weight_decay:
            direction = np.multiply(params, self.weight_decay, out=self._scratch)
            direction += grad
        if self._buf is not None:
            self._accumulate(direction)
            nesterov_direction = direction + self.momentum * self._buf if self.nesterov else None
            direction = self._buf if nesterov_direction is None else nesterov_direction
        params -= np.multiply(direction, self.lr, out=self._scratch)

    def _accumulate(self, direction: np.ndarray) -> None:
        assert self._buf is not None
        if self._started:
            self._buf *= self.momentum
            self._buf += direction
        else:
            np.copyto(self._buf, direction)  # torch seeds the buffer with the first gradient
            self._started = True


def make_optimizer(config: OptimizerConfig, size: int) -> ServerOptimizer:
    if config.name == "sgd":
        return SGD(
            size,
            lr=config.lr,
            momentum=config.momentum,
            nesterov=config.nesterov,
            weight_decay=config.weight_decay,
        )
    raise ConfigError(f"unknown server optimizer {config.name!r}")
