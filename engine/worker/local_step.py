"""The model replica's own step between fetches, DistBelief's Algorithm 1.1 (Dean et al., NIPS
2012): "parameters <- parameters - alpha * gradient" after every gradient, on the replica's copy,
while the servers apply the pushed sums with their own optimizer. Shared by the real Downpour
loop and the simulated one."""

from __future__ import annotations

import numpy as np


class LocalStep:
    """p <- p - lr * g, or with momentum m: v <- m * v + g, p <- p - lr * v (torch.optim.SGD's
    form). lr = 0 takes no step (every gradient of a fetch interval on the same copy)."""

    def __init__(self, lr: float, momentum: float, size: int) -> None:
        self.lr, self.momentum = np.float32(lr), np.float32(momentum)
        self._velocity = np.zeros(size, dtype=np.float32) if momentum else None

    def apply(self, params: np.ndarray, grads: np.ndarray) -> None:
        if not self.lr:
            return
        step = grads
        if self._velocity is not None:
            self._velocity *= self.momentum
            self._velocity += grads
            step = self._velocity
        params -= self.lr * step
