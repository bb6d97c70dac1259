"""Downpour SGD's worker loop, DistBelief's Algorithm 1.1 (Dean et al., "Large Scale Distributed
Deep Networks", NIPS 2012): "the model replica requests an updated copy of its model parameters
from the parameter server every n_fetch steps and sends updated gradient values every n_push
steps"; between fetches it steps its own copy, "parameters <- parameters - alpha * gradient", and
fetching and pushing run asynchronously, beside computation.

Every ``fetch_every`` iterations the worker sends a pull into a staging buffer and goes on; the
fetched values replace the replica's copy at the start of the first iteration after they have
arrived (as the algorithm's asynchronous fetch overwrites the parameters, local steps included).
Each gradient is added to a local sum and stepped into the copy (``engine.worker.local_step``,
``--local-lr``). Every ``push_every`` iterations (and after its last one) the sum leaves
without waiting; at most one push is in flight, so the next push waits for the previous one's
ack (that wait is the only time the loop blocks on communication). The push's clock counts the
worker's pushes, and its staleness counts from the fetch the oldest gradient of the sum was
computed on. With ``warm_start`` N, worker 0 trains alone for its first N iterations; the others
wait until every shard has received its pushes for them.

Asynchronous only (asp): a BSP round needs every worker's gradient for every clock.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import numpy as np

from engine.errors import PsctlError, ShuttingDown
from engine.wire.protocol import ANY_CLOCK
from engine.wire.records import IterationRecord
from engine.worker.client import PullHandle, PullResult, PushHandle
from engine.worker.local_step import LocalStep
from engine.worker.loops import PlainLoop, Shard, iteration_row, push_bytes

WARM_START_POLL_S = 0.05
NOTHING = PullResult({}, 0.0, 0, 0)


@dataclass
class _Push:
    requests: list[PushHandle]
    row: IterationRecord  # the pushing iteration's, completed at the ack


class DownpourLoop(PlainLoop):
    def begin(self) -> None:
        self._fetch: PullHandle | None = None
        self._in_flight: _Push | None = None
        train = self.worker.config.train
        self.fetch_every, self.push_every = train.fetch_every, train.push_every
        self.local = LocalStep(train.local_lr, train.local_momentum, self.model.params_np.size)
        self._sum = np.zeros_like(self.model.grads_np)
        self._held = 0  # gradients in the sum
        self._pushes = self.first_clock // self.push_every
        if train.warm_start and self.worker.rank != 0:
            self._wait_for_warm_start(math.ceil(train.warm_start / self.push_every))
        self._staging = np.empty_like(self.model.params_np)
        # The first copy is waited for: there is nothing to compute on before it.
        self._copy = self.client.wait(self.client.pull(self.worker.keys, self.model.params_np,
                                                       clock=ANY_CLOCK))
        self._landed = self._copy  # a fetch whose bytes the next row counts
        self._base = self._copy  # the fetch behind the oldest gradient of the sum

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
            self.timer.sleep(WARM_START_POLL_S)

    def step(self, shard: Shard, batch: np.ndarray, epoch: int, clock: int) -> None:
        started, t0 = self.timer.now(), self.timer.perf()
        if clock % self.fetch_every == 0 and clock > self.first_clock and self._fetch is None:
            self._fetch = self.client.pull(self.worker.keys, self._staging, clock=ANY_CLOCK)
        self._take_fetch()
        landed, self._landed = self._landed, NOTHING
        if self._held == 0:
            self._base = self._copy
        t1 = self.timer.perf()
        loss = self.compute(shard, batch)
        self._sum += self.model.grads_np
        self._held += 1
        self.local.apply(self.model.params_np, self.model.grads_np)
        t2 = self.timer.perf()
        pushing = self._held == self.push_every or clock == self.last_clock
        if pushing:
            self._settle_push()  # at most one in flight: its sum's buffer is reused
        t3 = self.timer.perf()
        row = iteration_row(self.worker.rank, clock, epoch, started, t3 - t0, t2 - t1, t3 - t2,
                            t1 - t0, 0.0, None, landed, loss, len(batch))
        if pushing:
            self._push_sum(clock, row)
        else:
            self.worker.record(row)

    def _take_fetch(self) -> None:
        """The fetch in flight, if it has arrived: its values become the replica's copy."""
        if self._fetch is None or not self.client.done(self._fetch):
            return
        fetched, self._fetch = self.client.wait(self._fetch), None
        np.copyto(self.model.params_np, self._staging)
        self._copy = self._landed = fetched

    def _push_sum(self, clock: int, row: IterationRecord) -> None:
        pushed_at = self.timer.now()
        requests = self.send(self._sum.copy(), clock=self._pushes,
                             base_versions=self._base.versions, pushed_at=pushed_at,
                             waited_s=0.0, final=clock == self.last_clock)
        self._pushes += 1
        self._sum.fill(0.0)
        self._held = 0
        self._in_flight = _Push(requests, row.model_copy(update={"pushed_at": pushed_at}))

    def _settle_push(self) -> None:
        """Wait for the push in flight and record its iteration with what the ack says."""
        pending, self._in_flight = self._in_flight, None
        if pending is None:
            return
        pushed = self.settle(pending.requests)
        row = pending.row
        self.worker.record(row.model_copy(update={
            "staleness": pushed.staleness, "lr_scale": pushed.lr_scale, **push_bytes(pushed),
            "bytes_sent": row.bytes_sent + pushed.bytes_sent,
            "bytes_received": row.bytes_received + pushed.bytes_received,
            "acked_at": pushed.answered_at}))

    def end(self) -> None:
        with contextlib.suppress(ShuttingDown):
            self._settle_push()
        fetch, self._fetch = self._fetch, None
        if fetch is not None:  # no iteration will use it: taken if answered, else cancelled
            with contextlib.suppress(PsctlError):
                self.client.wait(fetch, timeout=0.0)
