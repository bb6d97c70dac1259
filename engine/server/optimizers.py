"""Server optimizers: how a shard applies an update to its parameters.

An update addresses a contiguous slice of the shard or a sorted list of its keys; an optimizer
touches only those keys' parameters and state (momentum buffers), so a sparse push never moves
a key nobody pushed. Optimizers are registered in ``SERVER_OPTIMIZERS`` by their config's name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np

from engine.config import OptimizerConfig
from engine.errors import ConfigError
from engine.registry import Registry
from engine.server.update import Update


class ServerOptimizer(Protocol):
    def apply(self, params: np.ndarray, update: Update) -> None:
        """Update the keys of ``update`` in ``params`` (the whole shard, float32) in place."""
        ...

    def slots(self) -> tuple[np.ndarray, ...]:
        """The per-key state arrays (shard-sized, like momentum buffers) that ``apply`` changes,
        so that the shard can roll an update back when it would leave them non-finite."""
        ...


class SGD:
    """SGD with optional (Nesterov) momentum and L2 weight decay, per key.

    The same update as ``torch.optim.SGD`` with dampening 0: buf = m * buf + g; p -= lr * buf.
    The buffer starts at zero, so a key's first step is buf = g, as torch seeds it.
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
        # Reused for every dense step: fresh 2 MB temporaries cost page faults on each update.
        self._scratch = np.empty(size, dtype=np.float32)

    def apply(self, params: np.ndarray, update: Update) -> None:
        if update.index is None:
            self._dense(params[update.span], update.values, update.span)
        else:
            self._sparse(params, update.values, update.index)

    def slots(self) -> tuple[np.ndarray, ...]:
        return () if self._buf is None else (self._buf,)

    def step(self, params: np.ndarray, grad: np.ndarray) -> None:
        """A dense step over the whole shard (the optimizer's original interface)."""
        self._dense(params, grad, slice(0, len(params)))

    def _dense(self, params: np.ndarray, grad: np.ndarray, span: slice) -> None:
        scratch = self._scratch[: len(params)]
        direction = grad
        if self.weight_decay:
            direction = np.multiply(params, self.weight_decay, out=scratch)
            direction += grad
        if self._buf is not None:
            buf = self._buf[span]
            buf *= self.momentum
            buf += direction
            direction = direction + self.momentum * buf if self.nesterov else buf
        params -= np.multiply(direction, self.lr, out=scratch)

    def _sparse(self, params: np.ndarray, grad: np.ndarray, index: np.ndarray) -> None:
        direction = grad + self.weight_decay * params[index] if self.weight_decay else grad
        if self._buf is not None:
            buf = self.momentum * self._buf[index] + direction
            self._buf[index] = buf
            direction = direction + self.momentum * buf if self.nesterov else buf
        params[index] -= self.lr * direction


# (settings, shard size) -> the shard's optimizer
OptimizerFactory = Callable[[OptimizerConfig, int], ServerOptimizer]
SERVER_OPTIMIZERS: Registry[OptimizerFactory] = Registry("server optimizer")
SERVER_OPTIMIZERS.register(
    "sgd", lambda config, size: SGD(size, lr=config.lr, momentum=config.momentum,
                                    nesterov=config.nesterov, weight_decay=config.weight_decay),
    "SGD with optional (Nesterov) momentum and weight decay, as torch.optim.SGD")


def make_optimizer(config: OptimizerConfig, size: int) -> ServerOptimizer:
    return SERVER_OPTIMIZERS.get(config.name)(config, size)
