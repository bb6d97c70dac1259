"""Injected slowness: stragglers and per-iteration jitter, so that the consistency models differ
visibly on one machine. ``engine.worker.timing.Pace`` stretches each compute phase by
``factor_now()`` (a real worker sleeps the extra time, a simulated one spends it in virtual time),
so the delay is recorded as compute."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from engine.config import HeterogeneityConfig


class Slowdown:
    """How much longer this worker's compute takes: its straggler factor (from the onset on)
    times a jitter factor drawn per iteration."""

    def __init__(self, config: HeterogeneityConfig, *, rank: int, seed: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        straggler = next((s for s in config.stragglers if s.rank == rank), None)
        self.factor = straggler.factor if straggler else 1.0
        self.onset_s = straggler.onset_s if straggler else 0.0
        self.jitter = config.jitter
        self._rng = np.random.default_rng([seed, rank, 0x51_0e])
        self._started: float | None = None
        self._clock = clock  # the simulator passes its virtual clock

    @property
    def active(self) -> bool:
        return self.factor != 1.0 or self.jitter is not None

    def factor_now(self) -> float:
        now = self._clock()
        if self._started is None:
            self._started = now
        factor = self.factor if now - self._started >= self.onset_s else 1.0
        if self.jitter is None:
            return factor
        if self.jitter.distribution == "lognormal":
            return factor * float(self._rng.lognormal(0.0, self.jitter.sigma))
        return factor * (1.0 + float(self._rng.exponential(self.jitter.sigma)))
