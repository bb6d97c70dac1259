"""SSP's worker-side cache (Ho et al., "More Effective Distributed ML via a Stale Synchronous
Parallel Parameter Server", NIPS 2013; seed 002 cites it).

The source: a worker at clock c reads from its cache when the cached copy is fresh enough, that
is when it holds every update of the clocks up to c - s - 1; only otherwise does it fetch from
the server, which answers once its copy is that fresh. A worker always sees its own updates
(read-my-writes). psctl: a fetched copy carries the slowest worker's clock on its keys
(``PullResult.slowest_clock``): it holds every push of the clocks below it, so it answers every
read at c while slowest_clock >= c - s (``sync.staleness``; DSSP's lower bound). The worker's
own gradient is applied to the copy as the shard's step would apply it when the optimizer's
step is -lr x scale x g (sgd; its momentum part arrives with the next fetch); for the other
optimizers the copy waits for the next fetch to show the worker's own updates.
"""

from __future__ import annotations

import numpy as np

from engine.config import RunConfig
from engine.consistency.registry import read_bound
from engine.policies.optimizers import PLAIN_STEP, SERVER_OPTIMIZERS
from engine.worker.client import PullResult, PushResult


class ReadCache:
    """The worker's copy of the model, the slowest clock it was fetched at, and what a fetch of
    it cost (the bytes each read served from it saves)."""

    def __init__(self, bound: int, own_step_lr: float | None) -> None:
        self.bound, self.own_step_lr = bound, own_step_lr
        self._fetched: PullResult | None = None
        self.hits = 0

    def serves(self, clock: int) -> bool:
        """May the read for ``clock`` be answered from the copy?"""
        return self._fetched is not None and self._fetched.slowest_clock >= clock - self.bound

    def fetched(self, pulled: PullResult) -> None:
        self._fetched = pulled

    def read(self, now: float) -> PullResult:
        """A read served from the copy at ``now``: nothing sent or waited for; the versions
        (from which a push's staleness counts) and the slowest clock are the fetch's."""
        fetched = self._fetched
        assert fetched is not None  # only after serves()
        self.hits += 1
        return PullResult(fetched.versions, 0.0, 0, 0, now, fetched.slowest_clock)

    @property
    def saved_per_read(self) -> int:
        """The bytes the fetch the copy came from moved: what each read from it saves."""
        fetched = self._fetched
        return 0 if fetched is None else fetched.bytes_sent + fetched.bytes_received

    def write(self, params: np.ndarray, grads: np.ndarray, pushed: PushResult) -> None:
        """Read-my-writes: the worker's own pushed gradient, stepped into its copy as the shard
        stepped it (the rate the shard reported times the optimizer's)."""
        if self.own_step_lr is None or pushed.lr_scale is None:
            return
        params -= np.float32(self.own_step_lr * pushed.lr_scale) * grads


def read_cache(run: RunConfig) -> ReadCache | None:
    """The run's cache, or None when every read fetches (the model has no bound to read
    within, or ``sync.cache`` is off)."""
    bound = read_bound(run)
    if bound is None:
        return None
    plain = SERVER_OPTIMIZERS.can(run.optimizer.name, PLAIN_STEP)
    return ReadCache(bound, run.optimizer.lr if plain else None)
