"""The bounded-delay worker loop (Li et al., OSDI'14: "a new task is blocked until all previous
tasks T times ago have been finished").

A task is one iteration: compute, then push its gradient and pull fresh values right behind it.
Iteration c may start computing only once every iteration of this worker older than c - T is
done (its push acknowledged, its pull answered); the newer ones stay in flight, so up to T
iterations of communication run behind computation. T = 0 is sequential; the servers apply
every push at once (as ASP does), and the parameters used are the newest pull that has arrived.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from engine.errors import ShuttingDown
from engine.wire.protocol import ANY_CLOCK
from engine.wire.records import IterationRecord
from engine.worker.client import PullHandle, PushHandle
from engine.worker.loops import PlainLoop, Shard, iteration_row, push_bytes


@dataclass
class _Task:
    clock: int
    pushes: list[PushHandle]
    pull: PullHandle
    values: np.ndarray  # the buffer the pull fills
    row: IterationRecord  # provisional until the task is done


class DelayedLoop(PlainLoop):
    def begin(self) -> None:
        self._tasks: deque[_Task] = deque()
        delay = self.worker.config.sync.delay
        self._free = [np.empty_like(self.model.params_np) for _ in range(delay + 1)]
        pulled = self.client.wait(self.client.pull(self.worker.keys, self.model.params_np,
                                                   clock=ANY_CLOCK))
        self._newest = pulled

    def step(self, shard: Shard, batch: np.ndarray, epoch: int, clock: int) -> None:
        self._tasks.append(self._task(shard, batch, epoch, clock, self._tasks,
                                      self.worker.config.sync.delay))

    def end(self) -> None:
        with contextlib.suppress(ShuttingDown):
            while self._tasks:
                self._finish(self._tasks.popleft())

    def _task(self, shard: Shard, batch: np.ndarray, epoch: int, clock: int,
              tasks: deque[_Task], delay: int) -> _Task:
        started, t0 = time.time(), time.perf_counter()
        # Blocked on the dependency: the oldest tasks must be done. Any task already done is
        # taken too, so the computation uses the freshest values that have arrived.
        while tasks and (tasks[0].clock < clock - delay or self._done(tasks[0])):
            self._finish(tasks.popleft())
        t1 = time.perf_counter()
        loss = self.compute(shard, batch)
        t2 = time.perf_counter()
        pushes, pushed_at = self.push(clock, self._newest, t1 - t0)
        values = self._free.pop()
        pull = self.client.pull(self.worker.keys, values, clock=ANY_CLOCK)
        t3 = time.perf_counter()
        row = iteration_row(self.worker.rank, clock, epoch, started, t3 - t0, t2 - t1, t3 - t2, 0.0,
                            t1 - t0, None, self._newest, loss, len(batch))
        return _Task(clock, pushes, pull, values, row.model_copy(update={"pushed_at": pushed_at}))

    def _done(self, task: _Task) -> bool:
        return self.pushes_done(task.pushes) and self.client.done(task.pull)

    def _finish(self, task: _Task) -> None:
        pushed, pulled = self.settle(task.pushes), self.client.wait(task.pull)
        np.copyto(self.model.params_np, task.values)
        self._free.append(task.values)
        self._newest = pulled
        self.worker.record(task.row.model_copy(update={
            "staleness": pushed.staleness,
            "lr_scale": pushed.lr_scale,
            **push_bytes(pushed),
            "bytes_sent": pushed.bytes_sent + pulled.bytes_sent,
            "bytes_received": pushed.bytes_received + pulled.bytes_received,
            "acked_at": pushed.answered_at,
        }))
