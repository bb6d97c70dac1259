"""The worker's side of Sandblaster L-BFGS (``--optimizer lbfgs``, seed 004).

No iterations of its own: the worker waits for the coordinator's tasks. A task names a range of
training rows and the pass it belongs to; the worker pulls the parameters once per pass, sums
the loss and the gradient over the rows, reports the loss sum and waits for the verdict. Only a
committed copy pushes its sum (into the shards' ``g``, engine.server.optimizers.GradientSum),
and says so once the shards have acknowledged it.
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from engine import usermetrics
from engine.config import RunConfig
from engine.errors import RunFailed, ShuttingDown
from engine.sandblaster.balancer import portion_count
from engine.wire.messages import Task, TaskDone, TaskPushed, Verdict
from engine.wire.records import IterationRecord
from engine.worker.client import PullResult
from engine.worker.loops import PlainLoop, Shard, compute_gradient, push_bytes

if TYPE_CHECKING:
    from engine.models.flat import FlatModel
    from engine.worker.loops import Host

CHUNK_ROWS = 1024  # rows per forward/backward: the memory a pass needs is one chunk's
IDLE_SLEEP_S = 0.002


class SandblasterLoop(PlainLoop):
    def __init__(self, worker: Host, model: FlatModel) -> None:
        super().__init__(worker, model)
        self.total = np.zeros_like(model.params_np)
        self.pulled: PullResult | None = None
        self.pulled_for = -1  # the pass whose parameters are in the model
        self.push_clock = 0
        self.queue: deque[Task] = deque()
        self.verdicts: dict[int, Verdict] = {}

    def train(self, shard: Shard, start: int = 0, base: int = 0) -> int:
        """Serve tasks until the coordinator says stop; returns the pushes made (clocks)."""
        self.push_clock = self._even_clocks(base + start)
        try:
            while not self.worker.should_stop():
                self._collect()
                if not self.queue:
                    self.timer.sleep(IDLE_SLEEP_S)
                elif not self._serve(shard, self.queue.popleft()):
                    break
        except ShuttingDown as exc:
            self.worker.stop_with(str(exc))
        return self.push_clock - base

    def _even_clocks(self, clock: int) -> int:
        """A worker that died during a push may have left its clock one ahead on some shards;
        the others get empty commits up to it, so that no later push is taken for a duplicate
        there and dropped (its sum would be missing from ``g``)."""
        clocks = self.client.shard_clocks()
        top = max([clock, *clocks.values()])
        empty_keys, empty = np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.float32)
        for keys, behind in clocks.items():
            for missing in range(max(behind, clock), top):
                self.client.wait(self.client.push(empty_keys, empty, clock=missing,
                                                  base_versions={}, span=keys))
        return top

    def _collect(self) -> None:
        """Tasks queue up; a verdict waits for its task. A coordinator that dropped a copy
        counts this worker free at once, so the next task and the verdict on the copy (or on
        a task still queued) can come in any order with this worker's own report."""
        for message in self.worker.inbox():
            if isinstance(message, Task):
                self.queue.append(message)
            elif isinstance(message, Verdict):
                self.verdicts[message.task] = message

    def _serve(self, shard: Shard, task: Task) -> bool:
        """Compute, report, and push when committed; False when the run stopped meanwhile."""
        if self.verdicts.pop(task.task, None) is not None:  # dropped before it started
            return True
        if task.end > len(shard.targets):
            raise RunFailed(f"task {task.task} asks for rows up to {task.end}; this worker "
                            f"has {len(shard.targets)}")
        started, t0 = self.timer.now(), self.timer.perf()
        pulled = self._pull(task.evaluation)
        t1 = self.timer.perf()
        loss_sum = self._sums(shard, task)
        if loss_sum is None:  # another copy finished first: this one stops
            return True
        t2 = self.timer.perf()
        samples = task.end - task.start
        self.worker.send(TaskDone(task=task.task, loss_sum=loss_sum, samples=samples))
        verdict = self._verdict(task.task)
        if verdict is None:
            return False
        t3 = self.timer.perf()
        pushed = None
        if verdict.commit:
            pushed = self.client.wait(self.client.push(
                self.worker.keys, self.total, clock=self.push_clock,
                base_versions=self.pulled.versions if self.pulled else {},
                pushed_at=self.timer.now()))
            self.push_clock += 1
            self.worker.send(TaskPushed(task=task.task))
        t4 = self.timer.perf()
        pull_bytes = (pulled.bytes_sent, pulled.bytes_received) if pulled else (0, 0)
        self.worker.record(IterationRecord(
            worker=self.worker.rank, iteration=task.iteration, epoch=task.evaluation,
            started_at=started, ended_at=started + (t4 - t0), compute_s=t2 - t1,
            push_s=t4 - t3, pull_s=t1 - t0, wait_s=t3 - t2, staleness=0,
            loss=loss_sum / samples, samples=samples,
            bytes_sent=pull_bytes[0] + (pushed.bytes_sent if pushed else 0),
            bytes_received=pull_bytes[1] + (pushed.bytes_received if pushed else 0),
            lr_scale=pushed.lr_scale if pushed else None, **push_bytes(pushed)))
        return True

    def _pull(self, evaluation: int) -> PullResult | None:
        """The parameters of pass ``evaluation``, pulled once per pass."""
        if evaluation == self.pulled_for:
            return None
        self.pulled = self.client.wait(self.client.pull(self.worker.keys, self.model.params_np,
                                                        clock=self.push_clock))
        self.pulled_for = evaluation
        return self.pulled

    def _sums(self, shard: Shard, task: Task) -> float | None:
        """The loss sum over the task's rows, their gradient sum into ``total``; None if the
        coordinator dropped the task meanwhile (a backup copy finished first)."""
        start, end = task.start, task.end
        self.total.fill(0)
        loss_sum = 0.0
        for low in range(start, end, CHUNK_ROWS):
            began = self.timer.perf()
            rows = np.arange(low, min(end, low + CHUNK_ROWS))
            loss = compute_gradient(self.model, shard, rows)
            usermetrics.hold(self.worker.rank)
            self.total += self.model.grads_np * np.float32(len(rows))
            loss_sum += loss * len(rows)
            self.worker.pace.computed(began)
            if self._dropped(task.task):
                return None
        if not math.isfinite(loss_sum):
            raise RunFailed(f"the loss over rows [{start}, {end}) is not finite: the line "
                            "search stepped too far (try a smaller --lr)")
        return loss_sum

    def _dropped(self, task: int) -> bool:
        """Has the coordinator told this copy to stop?"""
        self._collect()
        return self.verdicts.pop(task, None) is not None

    def _verdict(self, task: int) -> Verdict | None:
        """Wait for the coordinator's word on ``task``; None if the run stops first."""
        limit = self.worker.config.cluster.request_timeout_s
        deadline = self.timer.perf() + limit
        while self.timer.perf() < deadline:
            self._collect()
            verdict = self.verdicts.pop(task, None)
            if verdict is not None:
                return verdict
            if self.worker.should_stop():
                return None
            self.timer.sleep(IDLE_SLEEP_S / 2)
        raise RunFailed(f"no verdict on task {task} within {limit:g} s "
                        "(cluster.request_timeout_s)")


def sandblaster_shard(inputs: np.ndarray, targets: np.ndarray, config: RunConfig) -> Shard:
    """Every training row: a task may name any of them. Its batch size makes the worker's
    ``iterations_per_epoch`` the tasks it gets in a pass on average, so that progress in epochs
    counts passes."""
    count = portion_count(config.optimizer.portions, config.cluster.workers, len(targets))
    per_worker = math.ceil(count / config.cluster.workers)
    return Shard(inputs, targets, batch_size=math.ceil(len(targets) / per_worker))
