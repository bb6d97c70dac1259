"""Downpour SGD's worker loop (Dean et al., "Large Scale Distributed Deep Networks", NIPS 2012):
"the model replica requests an updated copy of its model parameters from the parameter server
every n_fetch steps and sends updated gradient values every n_push steps".

Between fetches the worker computes on the copy it fetched last (it does not apply its own
gradients to it: the servers alone update the model); it adds each gradient to a local sum and
pushes the sum every ``push_every`` iterations (and after its last one). The push's clock counts
the worker's pushes, not its iterations, and its staleness is measured from the oldest fetch
any gradient in the sum was computed on. With ``warm_start`` N, worker 0 trains alone for its
first N iterations; the others wait until every shard has received its pushes for them.

Asynchronous only (asp): a BSP round needs every worker's gradient for every clock.
"""

from __future__ import annotations

import math
import time

import numpy as np

from engine.wire.protocol import ANY_CLOCK
from engine.wire.records import IterationRecord
from engine.worker.client import PullResult, PushResult
from engine.worker.loops import PlainLoop, Shard, iteration_row

WARM_START_POLL_S = 0.05


class DownpourLoop(PlainLoop):
    def begin(self) -> None:
        train = self.worker.config.train
        self.fetch_every, self.push_every = train.fetch_every, train.push_every
        self._sum = np.zeros_like(self.model.grads_np)
        self._held = 0  # gradients in the sum
        self._fetched: PullResult | None = None  # the newest fetch
        self._base: PullResult | None = None  # the oldest fetch behind the sum
        self._pushes = self.first_clock // self.push_every
        if train.warm_start and self.worker.rank != 0:
            self._wait_for_warm_start(math.ceil(train.warm_start / self.push_every))

    def resume_iteration(self, clock: int) -> int:
        """Downpour's clocks count pushes, each of ``push_every`` iterations."""
        return clock * self.worker.config.train.push_every

    def _wait_for_warm_start(self, pushes: int) -> None:
        """Until every shard has applied worker 0's first ``pushes`` pushes (under asp with one
        worker pushing, a shard's version counts them), or the run stops."""
        probe = np.empty_like(self.model.params_np)
        while not self.worker.should_stop():
            pulled = self.client.wait(self.client.pull(self.worker.keys, probe,
                                                       clock=ANY_CLOCK))
            if min(pulled.versions.values(), default=0) >= pushes:
                return
            time.sleep(WARM_START_POLL_S)

    def _iteration(self, shard: Shard, batch: np.ndarray, epoch: int,
                   clock: int) -> IterationRecord:
        started, t0 = time.time(), time.perf_counter()
        pulled = self._fetch(clock)
        t1 = time.perf_counter()
        loss = self.compute(shard, batch)
        self._sum += self.model.grads_np
        self._held += 1
        t2 = time.perf_counter()
        wait_s = min(pulled.wait_s, t1 - t0)
        pushed, pushed_at = None, None
        if self._held == self.push_every or clock == self.last_clock:
            pushed, pushed_at = self._push_sum(clock, wait_s)
        t3 = time.perf_counter()
        row = iteration_row(self.worker.rank, clock, epoch, started, t3 - t0, t2 - t1, t3 - t2,
                            t1 - t0 - wait_s, wait_s, pushed, pulled, loss, len(batch))
        if pushed is None:
            return row
        return row.model_copy(update={"pushed_at": pushed_at, "acked_at": pushed.answered_at})

    def _fetch(self, clock: int) -> PullResult:
        """A fresh pull every ``fetch_every`` iterations; in between, the last one again with
        nothing sent or waited for (so the row's bytes and pull time are the real ones)."""
        if self._fetched is None or clock % self.fetch_every == 0:
            self._fetched = self.client.wait(self.client.pull(
                self.worker.keys, self.model.params_np, clock=ANY_CLOCK))
            if self._held == 0:
                self._base = self._fetched
            return self._fetched
        if self._base is None:
            self._base = self._fetched
        return PullResult(self._fetched.versions, 0.0, 0, 0, self._fetched.answered_at)

    def _push_sum(self, clock: int, waited_s: float) -> tuple[PushResult, float]:
        base = self._base or self._fetched
        assert base is not None  # a fetch precedes every gradient
        pushed_at = time.time()
        requests = self.send(self._sum, clock=self._pushes, base_versions=base.versions,
                             pushed_at=pushed_at, waited_s=waited_s,
                             final=clock == self.last_clock)
        pushed = self.settle(requests)
        self._pushes += 1
        self._sum.fill(0.0)
        self._held, self._base = 0, None
        return pushed, pushed_at
