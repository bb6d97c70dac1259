"""The bounded-delay worker loop (Li et al., OSDI'14, seed 003: "a new task is blocked until all
previous tasks T times ago have been finished").

A task is one iteration of every worker: compute, then push its gradient and send a pull right
behind it. The dependency is global, as in the paper: no worker starts computing iteration c
before every worker's pushes of iterations before c - T have reached the servers. The servers
keep that bound (``engine.consistency.ssp.BoundedDelay``): the pull sent behind this worker's
push of c is stamped c + T + 1, the first iteration that must wait for it, and is answered once
every worker has pushed c. Iteration c computes once this worker's tasks before c - T are done
(pushes acknowledged, pulls answered); the newer ones stay in flight, so up to T iterations of
communication run behind computation, and the parameters used are the newest that have arrived.
T = 0 is sequential: every iteration c starts on the model holding every worker's c - 1.
"""

from __future__ import annotations

import contextlib
from collections import deque
from dataclasses import dataclass

import numpy as np

from engine.errors import PsctlError, ShuttingDown
from engine.wire.protocol import ANY_CLOCK
from engine.wire.records import IterationRecord
from engine.worker.client import PullHandle, PullResult, PushHandle
from engine.worker.loops import PlainLoop, Shard, iteration_row, push_bytes


@dataclass
class _Task:
    clock: int
    pushes: list[PushHandle]
    pull: PullHandle | None  # None: no later iteration of this worker needs it
    values: np.ndarray  # the buffer the pull fills
    row: IterationRecord  # provisional until the task is done


def gated_clock(clock: int, delay: int) -> int:
    """The iteration whose start the pull sent behind task ``clock`` gates: it is stamped so,
    and the servers answer it once every worker has pushed ``clock``."""
    return clock + delay + 1


class DelayedLoop(PlainLoop):
    def begin(self) -> None:
        self._tasks: deque[_Task] = deque()
        self.delay = self.worker.config.sync.delay
        self._free = [np.empty_like(self.model.params_np) for _ in range(self.delay + 1)]
        pulled = self.client.wait(self.client.pull(self.worker.keys, self.model.params_np,
                                                   clock=ANY_CLOCK))
        self._newest = pulled

    def step(self, shard: Shard, batch: np.ndarray, epoch: int, clock: int) -> None:
        self._tasks.append(self._task(shard, batch, epoch, clock))

    def end(self) -> None:
        """Settle every task; a pull that no iteration will use (the run stopped early, so
        another worker may never push what it waits for) is taken only if answered."""
        with contextlib.suppress(ShuttingDown):
            while self._tasks:
                task = self._tasks.popleft()
                if task.pull is not None and not self.client.done(task.pull):
                    with contextlib.suppress(PsctlError):
                        self.client.wait(task.pull, timeout=0.0)
                    task.pull = None
                self._finish(task)

    def _task(self, shard: Shard, batch: np.ndarray, epoch: int, clock: int) -> _Task:
        started, t0 = self.timer.now(), self.timer.perf()
        # Blocked on the dependency: the tasks older than the delay must be done. Any task
        # already done is taken too, so the computation uses the freshest values that arrived.
        held = 0.0  # of the time blocked, what the servers held a pull back (idle time)
        tasks = self._tasks
        while tasks and (tasks[0].clock < clock - self.delay or self._done(tasks[0])):
            held += self._finish(tasks.popleft())
        t1 = self.timer.perf()
        loss = self.compute(shard, batch)
        t2 = self.timer.perf()
        wait_s = min(held, t1 - t0)
        pushes, pushed_at = self.push(clock, self._newest, wait_s)
        values, pull = self._free.pop(), None
        if gated_clock(clock, self.delay) <= self.last_clock:
            pull = self.client.pull(self.worker.keys, values,
                                    clock=gated_clock(clock, self.delay))
        t3 = self.timer.perf()
        row = iteration_row(self.worker.rank, clock, epoch, started, t3 - t0, t2 - t1, t3 - t2,
                            t1 - t0 - wait_s, wait_s, None, self._newest, loss, len(batch))
        return _Task(clock, pushes, pull, values, row.model_copy(update={"pushed_at": pushed_at}))

    def _done(self, task: _Task) -> bool:
        return self.pushes_done(task.pushes) and (task.pull is None or
                                                  self.client.done(task.pull))

    def _finish(self, task: _Task) -> float:
        """Record a task once its push is acknowledged and its pull answered; returns how long
        the servers held the pull back."""
        pushed = self.settle(task.pushes)
        pulled = PullResult({}, 0.0, 0, 0)
        if task.pull is not None:
            pulled = self.client.wait(task.pull)
            np.copyto(self.model.params_np, task.values)
            self._newest = pulled
        self._free.append(task.values)
        self.worker.record(task.row.model_copy(update={
            "staleness": pushed.staleness,
            "lr_scale": pushed.lr_scale,
            **push_bytes(pushed),
            "bytes_sent": pushed.bytes_sent + pulled.bytes_sent,
            "bytes_received": pushed.bytes_received + pulled.bytes_received,
            "acked_at": pushed.answered_at,
        }))
        return pulled.wait_s
