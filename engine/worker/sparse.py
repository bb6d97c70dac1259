"""Sparse logistic regression on a parameter server (seed 003, OSDI'14's evaluation workload).

The keys are one weight per feature. A mini-batch touches a few thousand of a million features:
its **working set**. A worker pulls only those keys, computes the logistic-loss gradient on them
(numpy and scipy; no torch), and pushes only them. With an L1 penalty the servers take a
proximal step (``engine.server.optimizers.Proximal``), and the **KKT filter** leaves out every
key whose weight is 0 and whose gradient satisfies |g| <= l1: the proximal step would leave that
weight at exactly 0. That is exact only for a push applied alone by the proximal SGD step (asp,
bounded delay); under BSP's round mean and with Adagrad's running sums it changes the result
(docs/models.md; tests/engine/server/test_kkt_exactness.py).

The loop is bounded delay's (``engine.worker.delayed``): a task is compute, push, then pull the
next batch's working set right behind the push; task c computes once the pushes of tasks older
than c - T are acknowledged. Each pull asks for the clock of the batch it feeds, which the
servers hold back as the model says: under bounded delay (seed 003's global dependency) until
every worker's pushes before c - T are in; under bsp, ssp and dssp (T is 0 here) as for any
loop; under asp pulls take the newest values.
"""

from __future__ import annotations

import contextlib
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from engine import usermetrics
from engine.consistency.registry import CONSISTENCY_MODELS, OWN_DELAY, asynchronous
from engine.datasets.sparse import SparseSplit
from engine.errors import ShuttingDown
from engine.models.logreg import kkt_mask
from engine.models.rows import RowsModel
from engine.wire.protocol import ANY_CLOCK
from engine.wire.records import IterationRecord
from engine.worker.client import PullHandle, PushHandle
from engine.worker.loops import PlainLoop, Shard, finite_loss, iteration_row, push_bytes

if TYPE_CHECKING:
    from engine.worker.loops import Host


@dataclass
class _Task:
    clock: int
    pushes: list[PushHandle]
    row: IterationRecord  # provisional until the push is acknowledged


@dataclass
class _Pull:
    keys: np.ndarray
    values: np.ndarray
    handle: PullHandle


class SparseLoop(PlainLoop):
    def __init__(self, worker: Host, model: RowsModel) -> None:
        self.worker, self.sparse = worker, model
        self.client = worker.client
        self.timer = worker.clock
        self.next_batch: np.ndarray | None = None
        self.last_clock, self.first_clock, self.filter = -1, 0, None
        config = worker.config
        self.l1 = config.optimizer.l1
        self.kkt = config.comm.kkt_filter and self.l1 > 0
        self.newest = asynchronous(config)  # else each pull waits for the clock it feeds
        self.delay = (config.sync.delay if CONSISTENCY_MODELS.can(config.sync.model, OWN_DELAY)
                      else 0)

    def begin(self) -> None:
        self._tasks: deque[_Task] = deque()
        self._next: _Pull | None = None

    def step(self, shard: Shard, batch: np.ndarray, epoch: int, clock: int) -> None:
        rows = shard.inputs
        assert isinstance(rows, SparseSplit)
        following = None if self.next_batch is None else rows.rows(np.sort(self.next_batch))
        self._tasks.append(self._task(rows.rows(np.sort(batch)), following, epoch, clock))

    def end(self) -> None:
        with contextlib.suppress(ShuttingDown):
            while self._tasks:
                self._finish(self._tasks.popleft())
            if self._next is not None:  # a stop came between a prefetch and its batch
                self.client.wait(self._next.handle)

    def _pull(self, batch: SparseSplit, clock: int) -> _Pull:
        keys = self.sparse.working_set(batch)
        values = np.empty(len(keys), dtype=np.float32)
        return _Pull(keys, values, self.client.pull(
            keys, values, clock=ANY_CLOCK if self.newest else clock, span=self.worker.keys))

    def _task(self, batch: SparseSplit, following: SparseSplit | None, epoch: int,
              clock: int) -> _Task:
        started, t0 = self.timer.now(), self.timer.perf()
        while self._tasks and self._tasks[0].clock < clock - self.delay:
            self._finish(self._tasks.popleft())
        pull = self._next or self._pull(batch, clock)
        self._next = None  # taken: a stop before the next prefetch must not wait for it again
        pulled = self.client.wait(pull.handle)
        t1 = self.timer.perf()
        loss, grad = self.sparse.gradient(batch, pull.keys, pull.values)
        finite_loss(loss)
        usermetrics.hold(self.worker.rank)
        self.worker.pace.computed(t1)
        keys, values = pull.keys, grad
        if self.kkt:
            mask = kkt_mask(pull.values, grad, self.l1)
            keys, values = keys[mask], grad[mask]
        t2 = self.timer.perf()
        pushed_at = self.timer.now()
        pushes = [self.client.push(keys, values, clock=clock, base_versions=pulled.versions,
                                   pushed_at=pushed_at, waited_s=0.0,
                                   final=clock == self.last_clock, span=self.worker.keys)]
        # The next batch's working set, right behind this push on the same connections.
        self._next = self._pull(following, clock + 1) if following is not None else None
        t3 = self.timer.perf()
        wait_s = min(pulled.wait_s, t1 - t0)
        row = iteration_row(self.worker.rank, clock, epoch, started, t3 - t0, t2 - t1, t3 - t2,
                            t1 - t0 - wait_s, wait_s, None, pulled, loss, len(batch))
        return _Task(clock, pushes, row.model_copy(update={"pushed_at": pushed_at}))

    def _finish(self, task: _Task) -> None:
        pushed = self.settle(task.pushes)
        self.worker.record(task.row.model_copy(update={
            "staleness": pushed.staleness, "lr_scale": pushed.lr_scale, **push_bytes(pushed),
            "bytes_sent": task.row.bytes_sent + pushed.bytes_sent,
            "bytes_received": task.row.bytes_received + pushed.bytes_received,
            "acked_at": pushed.answered_at}))
